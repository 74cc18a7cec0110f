"""Token ids a person can read: `tokenize pi encode --ids/--json`, id previews in `inspect`, and
token streams / MATRIX-ATOM atoms to `.npy` and back through `convert`.

Each test that pins a decision names it (docs/formats/token-stream.md, matrix-atom.md, npy.md).
"""

from __future__ import annotations

import io
import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies

from matrixctl.formats import matrix_atom, token_stream
from matrixctl.validate.token_stream import read_ids
from tests.helpers.cli import run_cli, run_sub

# A map typed by hand: unk 0, pad 1, eos 2, bytes at 10..265, a special, a symbol with an escape.
MAP = {
    "version": 1,
    "vocab_size": 300,
    "unk_id": 0,
    "pad_id": 1,
    "eos_id": 2,
    "byte_fallback": True,
    "byte_base_id": 10,
    "normalization": "nfkc",
    "symbols": [
        {"id": 3, "text": "a"},
        {"id": 4, "text": " the"},
        {"id": 5, "text": "\x1b[31m"},
        {"id": 6, "text": "<s>", "special": True},
    ],
}


@pytest.fixture(scope="module")
def smap(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("map") / "map.json"
    path.write_text(json.dumps(MAP))
    return path


def inspect_json(*args: str) -> dict:
    """The one file's entry of `inspect --json` ({"files": [...]} in the --json contract)."""
    run = run_cli("inspect", "--json", *args)
    doc = run.json()
    assert len(doc["files"]) == 1
    return doc["files"][0]


def stream_bytes(docs: list[list[int]], dtype: str = "uint16", vocab: int = 0) -> bytes:
    out = io.BytesIO()
    writer = token_stream.TokenStreamWriter(out, dtype=dtype, vocab_size=vocab)
    for i, ids in enumerate(docs):
        writer.write(np.array(ids, dtype=np.int64))
        writer.end_document(f"d{i}")
    writer.close()
    return out.getvalue()


def atoms_bytes(ids: list[int], atom_size: int, dtype: str = "auto", vocab: int | None = None):
    out = io.BytesIO()
    matrix_atom.write_atoms(
        out, np.array(ids, dtype=np.int64), atom_size=atom_size, dtype=dtype, vocab_size=vocab
    )
    return out.getvalue()


# tokenize pi encode --ids / --json -------------------------------------------------------------


def test_encode_ids_is_one_line_per_document_that_decode_and_pack_read(tmp_path: Path) -> None:
    """Decision: plain text input is one document, so --ids writes one line of space-separated
    decimal ids and a newline; `decode` and `pack atoms` read it back."""
    text = "the quick brown fox, the lazy dog\nand a second line\n"
    binary = run_cli(
        "tokenize", "pi", "encode", "-q", "-o", str(tmp_path / "t.mxt"), stdin=text.encode()
    )
    assert binary.code == 0
    want = [int(v) for v in _stream_ids(tmp_path / "t.mxt")]
    ids = run_cli("tokenize", "pi", "encode", "--ids", "-q", stdin=text.encode())
    assert ids.code == 0 and ids.stderr == ""
    assert ids.out.count("\n") == 1 and ids.out.endswith("\n")
    assert [int(v) for v in ids.out.split(" ")] == want
    back = run_cli("tokenize", "pi", "decode", stdin=ids.stdout)
    assert back.code == 0 and back.out == text
    packed = run_cli(
        "pack", "atoms", "-", "-n", "4", "-q", "-o", str(tmp_path / "a.bin"), stdin=ids.stdout
    )
    assert packed.code == 0
    payload = np.frombuffer((tmp_path / "a.bin").read_bytes()[64:], dtype="<u2")
    assert payload[: len(want)].tolist() == want


def _stream_ids(path: Path) -> list[int]:
    data = path.read_bytes()
    header = token_stream.StreamHeader.parse(data[:16])
    out: list[int] = []
    for ev in token_stream.iter_events(token_stream.MemReader(data, 16), header):
        if ev.kind == token_stream.KIND_TOKENS:
            out += ev.tokens.tolist()
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(strategies.text(max_size=60))
def test_encode_ids_round_trips_through_decode(smap: Path, text: str) -> None:
    import unicodedata

    data = text.encode("utf-8", "surrogatepass")
    ids = run_cli("tokenize", "pi", "encode", "--ids", "-q", "-s", str(smap), stdin=data)
    if ids.code != 0:  # lone surrogates are not UTF-8
        assert "PI_TEXT_UTF8" in ids.stderr
        return
    back = run_cli("tokenize", "pi", "decode", "-s", str(smap), stdin=ids.stdout)
    assert back.code == 0
    assert back.out == unicodedata.normalize("NFKC", text.removeprefix("\ufeff"))


def test_encode_empty_input_is_one_empty_line_and_an_empty_json_list() -> None:
    """Decision: an empty input is still one document: one empty line, `"ids": []`."""
    ids = run_cli("tokenize", "pi", "encode", "--ids", "-q")
    assert (ids.code, ids.stdout) == (0, b"\n")
    doc = run_cli("tokenize", "pi", "encode", "--json").json()
    assert doc["ids"] == [] and doc["tokens"] == 0 and doc["documents"] == 1


def test_encode_json_on_stdout_holds_the_ids_map_hash_and_counts(
    tmp_path: Path, smap: Path
) -> None:
    """Decision: --json with stdout as the output prints one document whose last field is the
    ids; with -o FILE the file gets the ids and the document is the summary alone."""
    text = "a the a\x1b[31m"
    run = run_cli("tokenize", "pi", "encode", "--json", "-s", str(smap), stdin=text.encode())
    assert run.code == 0 and run.stderr == ""
    doc = json.loads(run.stdout)  # exactly one document
    assert list(doc)[-1] == "ids"
    assert doc["ids"] == [3, 4, 10 + ord(" "), 3, 5]
    assert doc["tokens"] == 5 and doc["vocab_size"] == 300 and doc["dtype"] == "uint16"
    from matrixctl.tokenizers import pi

    assert doc["symbol_map_hash"] == pi.load_symbol_map(str(smap))[0].canonical_hash()
    out = tmp_path / "ids.txt"
    run = run_cli(
        "tokenize",
        "pi",
        "encode",
        "--json",
        "--ids",
        "-s",
        str(smap),
        "-o",
        str(out),
        stdin=text.encode(),
    )
    summary = run.json()
    assert "ids" not in summary and summary["tokens"] == 5
    assert out.read_text() == "3 4 42 3 5\n"


def test_encode_failure_prints_nothing_on_stdout(tmp_path: Path) -> None:
    """Text and JSON are spooled: invalid UTF-8 late in the input leaves stdout empty."""
    data = b"hello " * 50_000 + b"\xff"
    run = run_cli("tokenize", "pi", "encode", "--ids", stdin=data)
    assert run.code == 1 and run.stdout == b"" and "PI_TEXT_UTF8" in run.stderr
    run = run_cli("tokenize", "pi", "encode", "--json", stdin=data)  # the failure document
    assert run.code == 1 and run.json()["ok"] is False and "ids" not in run.json()
    assert run.json()["error"]["code"] == "PI_TEXT_UTF8"
    run = run_cli("tokenize", "pi", "encode", "--ids", "-o", str(tmp_path / "o.txt"), stdin=data)
    assert run.code == 1 and os.listdir(tmp_path) == []


def test_encode_is_deterministic_in_every_form() -> None:
    text = ("déjà vu " * 2000).encode()
    for flags in ((), ("--ids",), ("--json",)):
        a = run_cli("tokenize", "pi", "encode", *flags, "-q", stdin=text)
        b = run_cli("tokenize", "pi", "encode", *flags, "-q", stdin=text)
        assert a.code == 0 and a.stdout == b.stdout and a.stdout


def test_text_ids_may_go_to_a_terminal_but_a_binary_stream_may_not() -> None:
    from tests.cli.test_cli import run_with_tty

    code, seen, err = run_with_tty(["tokenize", "pi", "encode", "--ids", "-q"], {}, "stdout")
    assert code == 0 and seen.strip() == b"", err  # empty stdin: one empty line
    code, seen, err = run_with_tty(["tokenize", "pi", "encode"], {}, "stdout")
    assert code == 2 and b"OUT_TTY" in err and seen == b""


# inspect: id previews ---------------------------------------------------------------------------


def test_inspect_previews_the_first_ids_of_a_stream(tmp_path: Path) -> None:
    """Decision: inspect shows the first 32 ids by default (`ids.values`), across frames and
    documents, with the END trailer's token count as `of`."""
    path = tmp_path / "t.mxt"
    path.write_bytes(stream_bytes([list(range(20)), list(range(100, 130))], vocab=200))
    doc = inspect_json(str(path))
    assert doc["ids"] == {
        "start": 0,
        "count": 50,
        "shown": 32,
        "items": list(range(20)) + list(range(100, 112)),
    }
    doc = inspect_json("--ids", "18:4", str(path))
    assert doc["ids"]["items"] == [18, 19, 100, 101]
    doc = inspect_json("--ids", "45:100", str(path))
    assert doc["ids"]["items"] == list(range(125, 130))
    doc = inspect_json("--ids", "999", str(path))
    assert doc["ids"]["items"] == [] and doc["ids"]["shown"] == 0
    human = run_cli("inspect", "--ids", "18:4", str(path))
    assert human.code == 0 and "18, 19, 100, 101" in human.stderr


def test_inspect_previews_atom_ids_with_their_atom(tmp_path: Path, smap: Path) -> None:
    path = tmp_path / "a.bin"
    path.write_bytes(atoms_bytes([3, 4, 1, 1, 6, 2, 0, 42, 299], 3, vocab=300))
    doc = inspect_json("--ids", "2:5", "-s", str(smap), str(path))
    assert doc["ids"]["items"] == [1, 1, 6, 2, 0] and doc["ids"]["count"] == 9
    rows = [(r["token"], r["atom"], r["id"], r["kind"], r["text"]) for r in doc["id_text"]]
    assert rows == [
        (2, 0, 1, "pad", None),
        (3, 1, 1, "pad", None),
        (4, 1, 6, "special", "<s>"),
        (5, 1, 2, "eos", None),
        (6, 2, 0, "unk", None),
    ]


def test_symbols_mark_every_kind_and_escape_text_on_the_terminal(
    tmp_path: Path, smap: Path
) -> None:
    """Decision: with --symbols each id gets a kind (symbol, special, byte, pad, eos, unk,
    none) and its exact text in JSON; the terminal shows the text quoted with escapes, so a
    leading space shows and an escape sequence cannot reach the terminal."""
    path = tmp_path / "t.mxt"
    path.write_bytes(stream_bytes([[4, 5, 10 + 0x41, 1, 2, 0, 280]], vocab=300))
    doc = inspect_json("-s", str(smap), str(path))
    assert [(r["kind"], r["text"]) for r in doc["id_text"]] == [
        ("symbol", " the"),
        ("symbol", "\x1b[31m"),
        ("byte", "<0x41>"),
        ("pad", None),
        ("eos", None),
        ("unk", None),
        ("none", None),
    ]
    assert doc["ids"]["symbol_map"].startswith("sha256:")
    human = run_cli("inspect", "-s", str(smap), str(path))
    assert human.code == 0
    assert "\x1b" not in human.stderr
    assert '" the"' in human.stderr and "\\u001b[31m" in human.stderr


def test_a_map_of_another_vocabulary_size_is_pointed_out(tmp_path: Path, smap: Path) -> None:
    """Decision: when the file declares a vocab_size other than the map's, the preview still
    shows the texts and says so in `ids.map_mismatch`."""
    path = tmp_path / "t.mxt"
    path.write_bytes(stream_bytes([[3, 4]], vocab=1000))
    doc = inspect_json("-s", str(smap), str(path))
    assert "vocab_size 300" in doc["ids"]["map_mismatch"] and len(doc["id_text"]) == 2
    path.write_bytes(stream_bytes([[3, 4]], vocab=300))
    assert "map_mismatch" not in inspect_json("-s", str(smap), str(path))["ids"]
    path.write_bytes(stream_bytes([[3, 4]]))  # undeclared: nothing to compare
    assert "map_mismatch" not in inspect_json("-s", str(smap), str(path))["ids"]


@pytest.mark.parametrize("bad", ["x", "1:0", "-1:4", "0:4097", "1:y"])
def test_inspect_ids_range_is_checked(tmp_path: Path, bad: str) -> None:
    path = tmp_path / "t.mxt"
    path.write_bytes(stream_bytes([[1, 2]]))
    run = run_cli("inspect", "--ids", bad, str(path))
    assert run.code == 2 and "--ids" in run.stderr and "Traceback" not in run.stderr


def test_inspect_with_a_broken_symbol_map_is_one_error_line(tmp_path: Path) -> None:
    path = tmp_path / "t.mxt"
    path.write_bytes(stream_bytes([[1, 2]]))
    bad = tmp_path / "m.json"
    bad.write_text("{not json")
    run = run_cli("inspect", "-s", str(bad), str(path))
    assert run.code in (1, 2) and run.stderr.count("error[") == 1


def test_truncated_stream_previews_only_what_the_file_holds(tmp_path: Path) -> None:
    """Decision: a preview never reads outside the file; a stream cut inside a frame shows the
    ids that are there and says where it stopped (`ids.stopped`)."""
    data = stream_bytes([list(range(40))])
    path = tmp_path / "t.mxt"
    path.write_bytes(data[: 16 + 8 + 2 * 25 + 1])
    doc = inspect_json(str(path))
    assert doc["ids"]["items"] == list(range(25))
    assert "inside the frame" in doc["ids"]["stopped"] and doc["ids"]["count"] is None


def test_frame_counts_beyond_the_file_never_read_outside_it() -> None:
    """Hostile counts: a TOKENS frame claiming 2**24 ids in a 40-byte file, and every cut."""
    data = bytearray(stream_bytes([[7, 8, 9]]))
    struct.pack_into("<I", data, 16 + 4, token_stream.MAX_FRAME_TOKENS)
    header = token_stream.StreamHeader.parse(bytes(data[:16]))
    ids, stopped = read_ids(bytes(data), len(data), header, 0, 4096)
    assert ids[:3] == [7, 8, 9] and stopped
    good = stream_bytes([[7, 8, 9], [1] * 10], dtype="uint32")
    header = token_stream.StreamHeader.parse(good[:16])
    for cut in range(16, len(good) + 1):
        ids, _ = read_ids(good[:cut], cut, header, 0, 4096)
        assert ids == [7, 8, 9, *[1] * 10][: len(ids)]


@settings(max_examples=60, deadline=None)
@given(
    strategies.lists(strategies.lists(strategies.integers(0, 65535), max_size=30), max_size=4),
    strategies.integers(0, 80),
    strategies.integers(1, 50),
    strategies.integers(0, 400),
)
def test_stream_preview_is_the_slice_of_the_ids(docs, start, count, cut) -> None:
    data = stream_bytes(docs)
    flat = [i for d in docs for i in d]
    header = token_stream.StreamHeader.parse(data[:16])
    ids, stopped = read_ids(data, len(data), header, start, count)
    assert ids == flat[start : start + count] and stopped is None
    cut = min(cut + 16, len(data))
    ids, _ = read_ids(data[:cut], cut, header, start, count)
    assert ids == flat[start : start + count][: len(ids)]


def test_atom_header_claiming_more_tokens_than_the_file_holds(tmp_path: Path) -> None:
    """Header fields that disagree with the file size: only ids inside both are shown."""
    data = bytearray(atoms_bytes(list(range(12)), 4))
    struct.pack_into("<QQ", data, 0x18, 1 << 40, 4 << 40)  # atom_count, token_count
    path = tmp_path / "a.bin"
    path.write_bytes(bytes(data))
    doc = inspect_json("--ids", "8:100", str(path))
    assert doc["ids"]["items"] == [8, 9, 10, 11]
    assert "ends after 12" in doc["ids"]["stopped"]
    struct.pack_into("<Q", data, 0x28, 1 << 60)  # data_offset far beyond the file
    path.write_bytes(bytes(data))
    doc = inspect_json(str(path))
    assert doc["ids"]["items"] == []


# convert: ids <-> .npy --------------------------------------------------------------------------


def test_stream_to_npy_is_one_dimensional_of_the_stream_dtype(tmp_path: Path) -> None:
    """Decision: a stream's ids, every document in order, become a 1-D array of its dtype;
    document boundaries and the declared vocab_size are dropped with a note."""
    for dtype, want in (("uint16", np.uint16), ("uint32", np.uint32)):
        src = tmp_path / f"{dtype}.mxt"
        src.write_bytes(
            stream_bytes(
                [[5, 17], [99, 70000 if dtype == "uint32" else 7]],
                dtype,
                vocab=80000 if dtype == "uint32" else 100,
            )
        )
        dst = tmp_path / f"{dtype}.npy"
        run = run_cli("convert", str(src), str(dst))
        assert run.code == 0, run.stderr
        arr = np.load(dst)
        assert arr.dtype == want and arr.ndim == 1
        assert arr.tolist() == [5, 17, 99, 70000 if dtype == "uint32" else 7]
        assert "2 document boundaries" in run.stderr and "--vocab-size" in run.stderr


def test_atoms_to_npy_is_atoms_by_atom_size(tmp_path: Path) -> None:
    src = tmp_path / "a.bin"
    src.write_bytes(atoms_bytes(list(range(12)), 4, vocab=12))
    run = run_cli("convert", "--json", str(src), str(tmp_path / "a.npy"))
    assert run.code == 0
    assert run.json()["shape"] == [3, 4]
    arr = np.load(tmp_path / "a.npy")
    assert arr.dtype == np.uint16 and arr.tolist() == np.arange(12).reshape(3, 4).tolist()
    big = tmp_path / "b.bin"
    big.write_bytes(atoms_bytes([1, 2, 70000, 3], 2))
    assert run_cli("convert", str(big), str(tmp_path / "b.npy"), "-q").code == 0
    assert np.load(tmp_path / "b.npy").dtype == np.uint32


def test_npy_outputs_are_what_numpy_save_writes(tmp_path: Path) -> None:
    src = tmp_path / "a.bin"
    src.write_bytes(atoms_bytes(list(range(12)), 4, vocab=12))
    run_cli("convert", str(src), str(tmp_path / "a.npy"), "-q")
    np.save(tmp_path / "ref.npy", np.arange(12, dtype="<u2").reshape(3, 4))
    assert (tmp_path / "a.npy").read_bytes() == (tmp_path / "ref.npy").read_bytes()
    t = tmp_path / "t.mxt"
    t.write_bytes(stream_bytes([[1, 2, 3]]))
    run_cli("convert", str(t), str(tmp_path / "t.npy"), "-q")
    np.save(tmp_path / "ref1.npy", np.array([1, 2, 3], dtype="<u2"))
    assert (tmp_path / "t.npy").read_bytes() == (tmp_path / "ref1.npy").read_bytes()


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    strategies.lists(strategies.integers(0, 2**32 - 2), min_size=1, max_size=40),
    strategies.integers(1, 5),
)
def test_atoms_npy_atoms_round_trip_is_byte_identical(
    tmp_path: Path, ids: list[int], size: int
) -> None:
    """Decision: with --vocab-size the round trip atoms -> .npy -> atoms gives the same bytes
    (the dtype follows the array's uint16/uint32)."""
    ids = ids[: len(ids) - len(ids) % size] or [0] * size
    vocab = max(ids) + 1
    original = atoms_bytes(ids, size, vocab=vocab)
    src = tmp_path / "r.bin"
    src.write_bytes(original)
    assert run_cli("convert", str(src), str(tmp_path / "r.npy"), "-q").code == 0
    back = run_cli(
        "convert",
        str(tmp_path / "r.npy"),
        str(tmp_path / "r2.bin"),
        "--vocab-size",
        str(vocab),
        "-q",
    )
    assert back.code == 0, back.stderr
    assert (tmp_path / "r2.bin").read_bytes() == original


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    strategies.lists(strategies.integers(0, 2**32 - 1), max_size=50),
    strategies.sampled_from(["uint16", "uint32"]),
)
def test_stream_npy_stream_keeps_the_ids(tmp_path: Path, ids: list[int], dtype: str) -> None:
    if dtype == "uint16":
        ids = [i % 65536 for i in ids]
    src = tmp_path / "s.mxt"
    src.write_bytes(stream_bytes([ids], dtype))
    assert run_cli("convert", str(src), str(tmp_path / "s.npy"), "-q").code == 0
    assert np.load(tmp_path / "s.npy").tolist() == ids
    assert run_cli("convert", str(tmp_path / "s.npy"), str(tmp_path / "s2.mxt"), "-q").code == 0
    assert _stream_ids(tmp_path / "s2.mxt") == ids
    header = token_stream.StreamHeader.parse((tmp_path / "s2.mxt").read_bytes()[:16])
    assert header.dtype == dtype


def test_npy_to_stream_is_one_document_labelled_with_the_source(tmp_path: Path) -> None:
    """Decision: a 1-D .npy becomes one document labelled with the source name, vocab_size
    undeclared unless --vocab-size; the same input gives the same bytes."""
    np.save(tmp_path / "ids.npy", np.array([3, 1, 4, 1, 5], dtype=np.int64))
    out1, out2 = tmp_path / "a.mxt", tmp_path / "b.mxt"
    assert run_cli("convert", str(tmp_path / "ids.npy"), str(out1), "-q").code == 0
    assert run_cli("convert", str(tmp_path / "ids.npy"), str(out2), "-q").code == 0
    assert out1.read_bytes() == out2.read_bytes()
    data = out1.read_bytes()
    header = token_stream.StreamHeader.parse(data[:16])
    assert (header.dtype, header.vocab_size) == ("uint16", 0)  # int64 ids that fit uint16
    labels = [
        ev.label
        for ev in token_stream.iter_events(token_stream.MemReader(data, 16), header)
        if ev.kind == token_stream.KIND_DOC
    ]
    assert labels == [str(tmp_path / "ids.npy")]
    run = run_cli("convert", "--json", str(tmp_path / "ids.npy"), str(out1), "--vocab-size", "6")
    assert run.json()["vocab_size"] == 6
    assert token_stream.StreamHeader.parse(out1.read_bytes()[:16]).vocab_size == 6


def test_big_endian_and_fortran_arrays_give_the_same_ids(tmp_path: Path) -> None:
    m = np.arange(12, dtype=np.uint16).reshape(3, 4)
    np.save(tmp_path / "c.npy", m)
    np.save(tmp_path / "f.npy", np.asfortranarray(m.astype(">u2")))
    np.save(tmp_path / "v.npy", np.arange(5, dtype=">i8"))
    for name in ("c", "f"):
        assert (
            run_cli(
                "convert", str(tmp_path / f"{name}.npy"), str(tmp_path / f"{name}.bin"), "-q"
            ).code
            == 0
        )
    assert (tmp_path / "c.bin").read_bytes()[64:] == (tmp_path / "f.bin").read_bytes()[64:]
    assert run_cli("convert", str(tmp_path / "v.npy"), str(tmp_path / "v.mxt"), "-q").code == 0
    assert _stream_ids(tmp_path / "v.mxt") == [0, 1, 2, 3, 4]


def test_destination_by_suffix_or_to(tmp_path: Path) -> None:
    """Decision: `.mxt` names a token stream and `.bin` MATRIX-ATOM; --to token-stream or
    --to matrix-atom names them for any other file name."""
    np.save(tmp_path / "v.npy", np.array([1, 2, 3], dtype=np.uint16))
    np.save(tmp_path / "m.npy", np.array([[1, 2], [3, 4]], dtype=np.uint16))
    run = run_cli(
        "convert",
        "--json",
        str(tmp_path / "v.npy"),
        str(tmp_path / "o.tok"),
        "--to",
        "token-stream",
    )
    assert run.json()["to"] == "token-stream"
    run = run_cli(
        "convert", "--json", str(tmp_path / "m.npy"), str(tmp_path / "o.dat"), "--to", "matrix-atom"
    )
    assert run.json()["to"] == "matrix-atom"
    assert (tmp_path / "o.dat").read_bytes()[:8] == b"MTRXATOM"
    assert (
        run_cli("convert", "--json", str(tmp_path / "m.npy"), str(tmp_path / "o.bin")).json()["to"]
        == "matrix-atom"
    )


def _hostile(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    if name == "float.npy":
        np.save(path, np.array([1.0, 2.0], dtype=np.float32))
    elif name == "bool.npy":
        np.save(path, np.array([True, False]))
    elif name == "cube.npy":
        np.save(path, np.zeros((2, 2, 2), dtype=np.uint16))
    elif name == "scalar.npy":
        np.save(path, np.array(7, dtype=np.uint16))
    elif name == "neg.npy":
        np.save(path, np.array([1, -2], dtype=np.int32))
    elif name == "huge.npy":
        np.save(path, np.array([1, 2**32], dtype=np.uint64))
    elif name == "empty_atoms.npy":
        np.save(path, np.zeros((3, 0), dtype=np.uint16))
    elif name == "cut.mxt":
        path.write_bytes(stream_bytes([[1, 2, 3]])[:-9])
    elif name == "crc.bin":
        data = bytearray(atoms_bytes([1, 2, 3, 4], 2, vocab=10))
        data[-2] ^= 1  # id 4 -> 5: still in range, so only the CRC can tell
        path.write_bytes(bytes(data))
    elif name == "range.bin":
        data = bytearray(atoms_bytes([1, 2, 3, 4], 2, vocab=10))
        struct.pack_into("<H", data, 64, 50)
        path.write_bytes(ma_reseal(bytes(data)))
    return path


def ma_reseal(data: bytes) -> bytes:
    """Recompute both CRCs, so only the id range is wrong."""
    import zlib

    h = matrix_atom.AtomHeader.parse(data[:64])
    fixed = matrix_atom.AtomHeader(
        **{**h.__dict__, "payload_crc32": zlib.crc32(data[64:])}
    ).with_crc()
    return fixed.to_bytes() + data[64:]


@pytest.mark.parametrize(
    ("name", "dst", "code"),
    [
        ("float.npy", "o.mxt", "IDS_NPY_DTYPE"),
        ("bool.npy", "o.bin", "IDS_NPY_DTYPE"),
        ("cube.npy", "o.mxt", "IDS_NPY_SHAPE"),
        ("cube.npy", "o.bin", "IDS_NPY_SHAPE"),
        ("scalar.npy", "o.mxt", "IDS_NPY_SHAPE"),
        ("empty_atoms.npy", "o.bin", "IDS_NPY_SHAPE"),
        ("neg.npy", "o.mxt", "TOKS_ID_RANGE"),
        ("huge.npy", "o.mxt", "TOKS_ID_RANGE"),
        ("cut.mxt", "o.npy", "TOKS_NO_END"),
        ("crc.bin", "o.npy", "ATOM_PAYLOAD_CRC"),
        ("range.bin", "o.npy", "ATOM_ID_RANGE"),
    ],
)
def test_hostile_inputs_are_refused_with_their_code(
    tmp_path: Path, name: str, dst: str, code: str
) -> None:
    src = _hostile(tmp_path, name)
    before = sorted(os.listdir(tmp_path))
    run = run_cli("convert", str(src), str(tmp_path / dst))
    assert run.code == 1, run.stderr
    assert f"error[{code}]" in run.stderr and run.stderr.count("error[") == 1
    assert "Traceback" not in run.stderr
    assert sorted(os.listdir(tmp_path)) == before  # no output, no temporary left


def test_shapes_name_the_other_destination(tmp_path: Path) -> None:
    np.save(tmp_path / "m.npy", np.zeros((2, 2), dtype=np.uint16))
    run = run_cli("convert", str(tmp_path / "m.npy"), str(tmp_path / "o.mxt"))
    assert run.code == 1 and "IDS_NPY_SHAPE" in run.stderr and "--to matrix-atom" in run.stderr
    np.save(tmp_path / "v.npy", np.zeros(4, dtype=np.uint16))
    run = run_cli("convert", str(tmp_path / "v.npy"), str(tmp_path / "o.bin"))
    assert run.code == 1 and "IDS_NPY_SHAPE" in run.stderr and "--to token-stream" in run.stderr


def test_ids_that_do_not_fit_the_dtype_are_refused_never_wrapped(tmp_path: Path) -> None:
    """Decision: --dtype uint16|uint32 picks the id dtype; an id it cannot hold, or one not
    below --vocab-size, is refused naming the token."""
    np.save(tmp_path / "v.npy", np.array([1, 70000, 2], dtype=np.uint32))
    np.save(tmp_path / "m.npy", np.array([[1, 70000], [2, 3]], dtype=np.int64))
    run = run_cli("convert", str(tmp_path / "v.npy"), str(tmp_path / "o.mxt"), "--dtype", "uint16")
    assert run.code == 1 and "TOKS_ID_RANGE" in run.stderr and "token[1]" in run.stderr
    run = run_cli("convert", str(tmp_path / "m.npy"), str(tmp_path / "o.bin"), "--dtype", "uint16")
    assert run.code == 1 and "ATOM_ID_OVERFLOW" in run.stderr and "token[1]" in run.stderr
    run = run_cli(
        "convert", str(tmp_path / "m.npy"), str(tmp_path / "o.bin"), "--vocab-size", "100"
    )
    assert run.code == 1 and "ATOM_ID_RANGE" in run.stderr
    assert sorted(os.listdir(tmp_path)) == ["m.npy", "v.npy"]
    # int64 ids that need 32 bits give uint32 atoms by themselves.
    assert run_cli("convert", str(tmp_path / "m.npy"), str(tmp_path / "o.bin"), "-q").code == 0
    assert (
        matrix_atom.AtomHeader.parse((tmp_path / "o.bin").read_bytes()[:64]).dtype_name == "uint32"
    )


@pytest.mark.parametrize(
    "args",
    [
        ["--dtype", "f32"],
        ["--dtype", "uint8"],
        ["--vocab-size", "0"],
    ],
)
def test_bad_id_options_are_usage_errors(tmp_path: Path, args: list[str]) -> None:
    np.save(tmp_path / "v.npy", np.array([1, 2], dtype=np.uint16))
    run = run_cli("convert", str(tmp_path / "v.npy"), str(tmp_path / "o.mxt"), *args)
    assert run.code == 2 and run.stderr.count("error[") == 1


def test_options_that_do_not_apply_are_refused(tmp_path: Path) -> None:
    src = tmp_path / "t.mxt"
    src.write_bytes(stream_bytes([[1]]))
    run = run_cli("convert", str(src), str(tmp_path / "o.npy"), "--vocab-size", "5")
    assert run.code == 2 and "--vocab-size does not apply" in run.stderr


def test_stdin_stream_to_npy_on_stdout_loads_with_numpy(tmp_path: Path) -> None:
    data = stream_bytes([[9, 8, 7]])
    run = run_sub("convert", "-", "-", "--to", "npy", stdin=data)
    assert run.code == 0, run.stderr
    assert np.load(io.BytesIO(run.stdout)).tolist() == [9, 8, 7]


def test_empty_stream_and_zero_atoms_round_trip(tmp_path: Path) -> None:
    """Zero tokens are valid everywhere: shape (0,) and (0, atom_size), and back."""
    (tmp_path / "e.mxt").write_bytes(stream_bytes([[]]))
    assert run_cli("convert", str(tmp_path / "e.mxt"), str(tmp_path / "e.npy"), "-q").code == 0
    assert np.load(tmp_path / "e.npy").shape == (0,)
    assert run_cli("convert", str(tmp_path / "e.npy"), str(tmp_path / "e2.mxt"), "-q").code == 0
    assert run_cli("verify", str(tmp_path / "e2.mxt"), "-q").code == 0
    np.save(tmp_path / "z.npy", np.zeros((0, 4), dtype=np.uint16))
    assert run_cli("convert", str(tmp_path / "z.npy"), str(tmp_path / "z.bin"), "-q").code == 0
    assert run_cli("verify", str(tmp_path / "z.bin"), "-q").code == 0
    assert run_cli("convert", str(tmp_path / "z.bin"), str(tmp_path / "z2.npy"), "-q").code == 0
    assert np.load(tmp_path / "z2.npy").shape == (0, 4)


def test_every_new_document_follows_the_json_contract(tmp_path: Path, smap: Path) -> None:
    """encode --json with ids, inspect with ids and id_text, and the four id conversions are
    accepted by their schemas (docs/schemas/)."""
    from tests.cli.test_json_contract import check

    enc = run_cli("tokenize", "pi", "encode", "--json", "-s", str(smap), stdin=b"a the")
    assert check("tokenize pi encode", enc)["ids"] == [3, 4]
    (tmp_path / "t.mxt").write_bytes(stream_bytes([[3, 4, 1]], vocab=300))
    (tmp_path / "cut.mxt").write_bytes(stream_bytes([[3, 4, 1]])[:-8])
    (tmp_path / "a.bin").write_bytes(atoms_bytes([3, 4, 1, 2], 2, vocab=300))
    args = [str(tmp_path / n) for n in ("t.mxt", "cut.mxt", "a.bin")]
    doc = check("inspect", run_cli("inspect", "--json", "-s", str(smap), *args))
    assert [f["ids"]["count"] for f in doc["files"]] == [3, None, 4]
    assert all(f["id_text"] for f in doc["files"])
    runs = [
        ("t.mxt", "t.npy"),
        ("a.bin", "a.npy"),
        ("t.npy", "t2.mxt"),
        ("a.npy", "a2.bin"),
    ]
    for src, dst in runs:
        run = run_cli("convert", "--json", str(tmp_path / src), str(tmp_path / dst))
        assert run.code == 0 and check("convert", run)
    bad = run_cli("convert", "--json", str(tmp_path / "t.npy"), str(tmp_path / "x.bin"))
    assert bad.code == 1 and check("convert", bad)["error"]["code"] == "IDS_NPY_SHAPE"
