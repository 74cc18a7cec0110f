"""The token stream: golden bytes, round trips over short reads, every damage reported."""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies

from matrixctl.atoms import read_token_input
from matrixctl.errors import FormatError
from matrixctl.formats import token_stream
from matrixctl.io import read_exact
from matrixctl.validate.engine import examine
from tests.base.test_io import ShortReader
from tests.helpers import golden_bytes


def events(data: bytes, short: bool = False) -> list[tuple]:
    fp = ShortReader(data) if short else io.BytesIO(data)
    header = token_stream.StreamHeader.parse(read_exact(fp, token_stream.HEADER_SIZE, "header"))
    out = []
    for ev in token_stream.iter_events(fp, header):
        if ev.kind == token_stream.KIND_TOKENS:
            out.append(("tokens", ev.tokens.tolist()))
        elif ev.kind == token_stream.KIND_DOC:
            out.append(("doc", ev.label))
        else:
            out.append(("end", ev.end.token_count, ev.end.doc_count))
    return out


def test_golden_file_on_disk_is_the_hand_written_bytes() -> None:
    assert (
        Path(__file__).resolve().parents[1] / "golden/token_stream_v1.mxt"
    ).read_bytes() == golden_bytes.TOKEN_STREAM


def test_writer_produces_the_golden_bytes() -> None:
    out = io.BytesIO()
    w = token_stream.TokenStreamWriter(out, dtype="uint16", vocab_size=100)
    w.write(np.array([5, 17, 99]))
    w.end_document("a")
    w.write(np.array([0, 42]))
    w.end_document()
    w.close()
    assert out.getvalue() == golden_bytes.TOKEN_STREAM


def test_reader_gives_the_frames_of_the_golden_file() -> None:
    assert events(golden_bytes.TOKEN_STREAM) == [
        ("tokens", [5, 17, 99]),
        ("doc", "a"),
        ("tokens", [0, 42]),
        ("doc", ""),
        ("end", 5, 2),
    ]


def test_short_reads_give_the_same_frames() -> None:
    for seed in range(20):
        fp = ShortReader(golden_bytes.TOKEN_STREAM, seed)
        got = read_token_input(fp)
        chunks = list(got.chunks)
        assert [c.tolist() for c, _, _ in chunks] == [[5, 17, 99], [0, 42]]
        # Each frame's CRC of its ids alone, which pack atoms combines instead of re-reading.
        assert [crc for _, _, crc in chunks] == [
            zlib.crc32(np.array(ids, "<u2").tobytes()) for ids in ([5, 17, 99], [0, 42])
        ]
        assert got.vocab_size == 100 and got.docs == [2]


@settings(max_examples=50, deadline=None)
@given(
    docs=strategies.lists(strategies.lists(strategies.integers(0, 70000), max_size=40), max_size=6),
    dtype=strategies.sampled_from(["uint16", "uint32"]),
)
def test_round_trip_property(docs: list[list[int]], dtype: str) -> None:
    limit = 1 << 16 if dtype == "uint16" else 1 << 32
    docs = [[i % limit for i in d] for d in docs]
    out = io.BytesIO()
    w = token_stream.TokenStreamWriter(out, dtype=dtype)
    for i, d in enumerate(docs):
        w.write(np.array(d, dtype=np.int64))
        w.end_document(f"doc{i}")
    end = w.close()
    assert end.token_count == sum(map(len, docs)) and end.doc_count == len(docs)
    got = events(out.getvalue(), short=True)
    flat = [x for kind, *rest in got if kind == "tokens" for x in rest[0]]
    assert flat == [x for d in docs for x in d]
    assert [rest[0] for kind, *rest in got if kind == "doc"] == [
        f"doc{i}" for i in range(len(docs))
    ]


@settings(max_examples=40, deadline=None)
@given(
    docs=strategies.lists(strategies.lists(strategies.integers(0, 70000), max_size=40), max_size=6),
    dtype=strategies.sampled_from(["uint16", "uint32"]),
    atom_dtype=strategies.sampled_from(["auto", "uint32"]),
)
def test_pack_atoms_payload_crc_combined_from_frames(
    tmp_path_factory: pytest.TempPathFactory, docs: list[list[int]], dtype: str, atom_dtype: str
) -> None:
    """pack atoms re-uses the stream's per-frame CRCs (crc32_combine) when the ids are written
    unchanged, and computes them when they are converted; either way the header's
    payload_crc32 is the CRC-32 of the payload bytes, computed here by zlib."""
    from matrixctl.atoms import write_atoms
    from matrixctl.formats import matrix_atom

    limit = 1 << 16 if dtype == "uint16" else 1 << 32
    docs = [[i % limit for i in d] for d in docs]
    tmp = tmp_path_factory.mktemp("crc")
    src, dst = tmp / "t.mxt", tmp / "a.bin"
    with open(src, "wb") as fp:
        w = token_stream.TokenStreamWriter(fp, dtype=dtype)
        for d in docs:
            w.write(np.array(d, dtype=np.int64))  # odd counts: frames with padding
            w.end_document()
        w.close()
    write_atoms(str(src), str(dst), atom_size=3, dtype=atom_dtype)
    data = dst.read_bytes()
    header = matrix_atom.AtomHeader.parse(data[: matrix_atom.HEADER_SIZE])
    assert header.payload_crc32 == zlib.crc32(data[matrix_atom.HEADER_SIZE :])


def test_a_stream_cut_anywhere_is_rejected() -> None:
    """A producer that dies mid-stream must never yield a shorter dataset that looks whole."""
    for n in range(16, len(golden_bytes.TOKEN_STREAM)):
        with pytest.raises(FormatError) as info:
            events(golden_bytes.TOKEN_STREAM[:n])
        assert info.value.code in (token_stream.TOKS_NO_END, "TRUNCATED"), n


def test_writer_refuses_ids_outside_the_declared_vocabulary() -> None:
    w = token_stream.TokenStreamWriter(io.BytesIO(), vocab_size=10)
    with pytest.raises(FormatError) as info:
        w.write(np.array([1, 10]))
    assert info.value.code == token_stream.TOKS_ID_RANGE and info.value.field == "token[1]"


def damaged(offset: int, fmt: str, value: object) -> bytes:
    buf = bytearray(golden_bytes.TOKEN_STREAM)
    struct.pack_into(fmt, buf, offset, value)
    return bytes(buf)


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (damaged(8, "<H", 2), token_stream.TOKS_VERSION),
        (damaged(10, "<B", 9), token_stream.TOKS_DTYPE),
        (damaged(11, "<B", 1), token_stream.TOKS_RESERVED),
        (damaged(12, "<I", 50), token_stream.TOKS_ID_RANGE),  # id 99 >= 50
        (damaged(16, "<B", 7), token_stream.TOKS_FRAME),
        (damaged(17, "<B", 1), token_stream.TOKS_RESERVED),
        (damaged(20, "<I", 0), token_stream.TOKS_FRAME),
        (damaged(20, "<I", 2**24 + 1), token_stream.TOKS_FRAME),
        (damaged(30, "<B", 1), token_stream.TOKS_RESERVED),  # padding after the ids
        (damaged(40, "<B", 0xFF), token_stream.TOKS_LABEL),
        (damaged(80, "<Q", 6), token_stream.TOKS_TOTALS),
        (damaged(88, "<Q", 1), token_stream.TOKS_TOTALS),
        (damaged(96, "<I", 0), token_stream.TOKS_CRC),
        (damaged(100, "<I", 1), token_stream.TOKS_RESERVED),
        (golden_bytes.TOKEN_STREAM + b"\0", token_stream.TOKS_AFTER_END),
        (golden_bytes.TOKEN_STREAM[:72], token_stream.TOKS_NO_END),
    ],
)
def test_each_damage_has_its_code(tmp_path: Path, data: bytes, code: str) -> None:
    path = tmp_path / "s.mxt"
    path.write_bytes(data)
    report = examine(str(path), scan=True)[0]
    assert code in {f.code for f in report.findings}
    assert report.exit_code() == 1


def test_every_single_bit_flip_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "flip.mxt"
    for bit in range(len(golden_bytes.TOKEN_STREAM) * 8):
        data = bytearray(golden_bytes.TOKEN_STREAM)
        data[bit // 8] ^= 1 << (bit % 8)
        path.write_bytes(bytes(data))
        assert not examine(str(path), scan=True)[0].ok(), bit


def test_inspect_reads_the_trailer_without_a_scan(tmp_path: Path) -> None:
    path = tmp_path / "s.mxt"
    path.write_bytes(golden_bytes.TOKEN_STREAM)
    report, desc = examine(str(path), scan=False, describe=True)
    assert desc is not None and desc["end"]["token_count"] == 5
    assert report.skipped and not report.findings


# Text ids -----------------------------------------------------------------------------------


def text_ids(data: bytes, chunk: int | None = None) -> list[int]:
    if chunk:
        old = token_stream.TEXT_CHUNK
        token_stream.TEXT_CHUNK = chunk
    try:
        return [int(x) for arr in token_stream.iter_text_ids(io.BytesIO(data)) for x in arr]
    finally:
        if chunk:
            token_stream.TEXT_CHUNK = old


def test_text_ids_across_chunk_boundaries() -> None:
    data = b" ".join(str(i * 7919).encode() for i in range(300)) + b"\n"
    want = [i * 7919 for i in range(300)]
    for chunk in (1, 2, 3, 5, 64):
        assert text_ids(data, chunk) == want


def test_text_ids_accept_any_whitespace_and_no_trailing_newline() -> None:
    assert text_ids(b"1\t2\r\n3\n\n 4") == [1, 2, 3, 4]
    assert text_ids(b"") == []


@pytest.mark.parametrize(
    ("data", "offset"),
    [(b"1 2 x", 4), (b"1 -2", 2), (b"1 2.5", 3), (b"4294967296", 0), (b"1 99999999999", 2)],
)
def test_bad_text_ids_name_the_byte_offset(data: bytes, offset: int) -> None:
    with pytest.raises(FormatError) as info:
        text_ids(data)
    assert info.value.code == token_stream.TEXT_IDS and info.value.offset == offset
