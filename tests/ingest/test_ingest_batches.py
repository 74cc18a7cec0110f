"""The batched record path of `ingest docs` (docs/inputs.md, "`--jobs 1`: one read,
batches"): JSON Lines parsed in place, Parquet/Arrow cells read from the Arrow buffers,
documents matched many at a time (`tokenizer.PiIngest.encode_texts`), a file read once, each checked
against the path it replaces; and the symbol map taken from the per-user map cache."""

from __future__ import annotations

import io
import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from matrixctl.errors import FormatError
from matrixctl.ingest import step
from matrixctl.ingest import step as ingest_step
from matrixctl.ingest import tokenizer as ingest_tokenizer
from matrixctl.ingest import units as ingest_units
from matrixctl.ingest.kinds import base as kinds_base
from matrixctl.ingest.kinds import columnar
from matrixctl.ingest.kinds import jsonl as kinds_jsonl
from matrixctl.ingest.tokenizer import PiIngest
from matrixctl.tokenizers import pi, pi_cache
from tests.helpers.cli import run_cli

BOM = b"\xef\xbb\xbf"


def outcome(gen: Any) -> tuple[list[Any], Any, Any]:
    """What an extractor gives: its items, or the error it raises (code, message, offset). A
    text given as UTF-8 bytes (`jsonl_texts`) is compared as the str it stands for."""
    got: list[Any] = []
    try:
        for item in gen:
            if isinstance(item, tuple) and isinstance(item[1], (bytes, memoryview)):
                got.append((item[0], str(item[1], "utf-8")))
            else:
                got.append(item)
    except FormatError as err:
        return got, (err.code, err.message, err.offset, err.field), None
    except kinds_base.SkipFile as skip:
        return got, ("skip", skip.reason), None
    return got, None, None


def both(data: bytes, opts: kinds_base.Options, line_no: int = 0, offset: int = 0) -> None:
    """`jsonl_texts` over a buffer gives what the line reader gives over a stream."""
    c1, c2 = kinds_base.Counters(), kinds_base.Counters()
    a = outcome(kinds_jsonl.texts_stream(io.BytesIO(data), "f", opts, c1, line_no, offset))
    padded = bytearray(data + b"\n{}garbage after the size")
    b = outcome(kinds_jsonl.texts(padded, "f", opts, c2, line_no, offset, len(data)))
    assert a == b
    assert (c1.lines, c1.skipped_records) == (c2.lines, c2.skipped_records)


LINES = [
    b'{"text": "plain"}\n',
    b'{"text": "crlf\\r\\nline\\r\\n", "other": 1}\n',
    b"\n",
    b"  \t \n",
    b'{"id": 5}\n',  # no text field
    b"[1, 2]\n",  # not an object
    b'{"text": 7}\n',
    b'{"text": "caf\xc3\xa9 \\u4e2d"}\n',
    b'{"text": "big", "n": 123456789012345678901234567890}\n',  # orjson refuses, json accepts
    b'{"text": "nan", "x": NaN}\n',
    b'{"text": "a", "text": "last wins"}\n',
    b'{"text": ""}\n',
]


@pytest.mark.parametrize("missing", ["skip", "error"])
@pytest.mark.parametrize("start", [0, 3])
def test_a_buffer_of_lines_gives_what_the_line_reader_gives(missing: str, start: int) -> None:
    opts = kinds_base.Options(missing_field=missing)
    data = b"".join(LINES)
    both(data, opts)
    both(BOM + data, opts)  # a BOM at the file's start is dropped
    both(data, opts, line_no=start * 100, offset=start * 1000)  # a piece inside a file
    both(data.rstrip(b"\n"), opts)  # no line feed at the end
    both(b"", opts)


@pytest.mark.parametrize(
    "bad",
    [
        b'{"text": "x"\n',  # unterminated
        b'{"text": "\xff"}\n',  # not UTF-8
        b'{"text": "ok"} trailing\n',
        b"[" * 3000 + b"]" * 3000 + b"\n",  # deeper than orjson goes
    ],
)
@pytest.mark.parametrize("encoding", ["error", "replace", "skip-file"])
def test_errors_and_their_offsets_are_the_same(bad: bytes, encoding: str) -> None:
    opts = kinds_base.Options(encoding_errors=encoding)
    data = LINES[0] + LINES[2] + bad + LINES[1]
    both(data, opts)
    both(data, opts, line_no=40, offset=5000)


@pytest.mark.parametrize("size", [9, 10, 11])
def test_the_max_doc_size_bound_is_the_same(size: int) -> None:
    """A line is over --max-doc-size when its bytes without the line feed are."""
    opts = kinds_base.Options(max_doc=size)
    for line in (b'{"text":1}', b'{"text":"a"}'):  # 10 and 12 bytes
        both(line + b"\n", opts)
        both(b'{"t":1}\n' + line, opts)  # the last line, without a line feed
        both(b'{"t":1}\n' + line + b"\n" + b'{"t":2}\n', opts, line_no=7, offset=70)


# Parquet and Arrow cells ----------------------------------------------------------------------


def reference_texts(values: list[Any], opts: kinds_base.Options) -> tuple[list[Any], Any]:
    """What the rows gave before: a Python value per cell (`to_pylist`), a str is a text."""
    out: list[Any] = []
    for row, value in enumerate(values):
        if not isinstance(value, str):
            if opts.missing_field == "error":
                return out, f"row {row} has no string"
            continue
        if len(value.encode("utf-8")) > opts.max_doc:
            return out, f"row {row} is larger than --max-doc-size"
        out.append((row, kinds_base.crlf(value)))
    return out, None


def columnar_texts(
    path: Path,
    opts: kinds_base.Options,
    kind: str = "parquet",
    ahead: bool = False,
    types: list[type] | None = None,
) -> tuple[list, Any]:
    """The texts as str (a string column's come as UTF-8 memoryviews, or bytes where a CRLF
    was replaced: `types` collects what each came as)."""
    got: list[Any] = []
    try:
        texts = columnar.texts(kind, str(path), "f", opts, kinds_base.Counters(), ahead=ahead)
        for row, text in texts:
            if types is not None:
                types.append(type(text))
            got.append((row, text if isinstance(text, str) else str(text, "utf-8")))
    except FormatError as err:
        return got, err.message
    return got, None


CELLS = [
    "plain ascii",
    "crlf\r\nin ascii\r\n",
    None,
    "",
    "caf\u00e9\r\nna\u00efve \u4e2d",
    "lone\rcr",
    "x" * 300,
]


def _page_refusal(err: str, want: str) -> bool:
    """The error of a row group refused by its page header (docs/inputs.md, "Dictionary
    bombs"): the rows it names hold the row the cell check names."""
    import re

    row = re.search(r"row (\d+) is larger", want)
    held = re.match(r"rows? (\d+)(?: to (\d+))? \(row group \d+\) hold a cell larger", err)
    if row is None or held is None:
        return False
    first, last = int(held.group(1)), int(held.group(2) or held.group(1))
    return first <= int(row.group(1)) <= last


@pytest.mark.parametrize("ahead", [False, True])
@pytest.mark.parametrize("large", [False, True])
@pytest.mark.parametrize("group", [1, 3, 100])
def test_cells_from_the_arrow_buffers_are_the_python_values(
    tmp_path: Path, large: bool, group: int, ahead: bool
) -> None:
    import pyarrow
    from pyarrow import parquet

    kind = pyarrow.large_string() if large else pyarrow.string()
    table = pyarrow.table({"text": pyarrow.array(CELLS * 3, type=kind)})
    path = tmp_path / "t.parquet"
    parquet.write_table(table, path, row_group_size=group)
    for opts in (
        kinds_base.Options(),
        kinds_base.Options(missing_field="error"),
        kinds_base.Options(max_doc=299),  # the long cell is over
        kinds_base.Options(max_doc=300),
        kinds_base.Options(max_doc=15),  # over before CRLF is replaced, not after
    ):
        types: list[type] = []
        got, err = columnar_texts(path, opts, ahead=ahead, types=types)
        want, want_err = reference_texts(CELLS * 3, opts)
        assert (err is None) == (want_err is None)
        if err is not None and want_err is not None and _page_refusal(err, want_err):
            # Refused by a page header before its row group is read: the rows before that
            # row group, none of its own (the file fails either way).
            assert got == want[: len(got)]
        else:
            assert got == want and (err is None or want_err in err)
        # No Python string per cell: a view of the column's UTF-8, or bytes where a carriage
        # return was (CRLF replaced, so copied).
        for (row, _), t in zip(got, types, strict=True):
            assert t is (bytes if "\r" in (CELLS * 3)[row] else memoryview)


def test_columns_read_ahead_give_the_rows_and_the_error_of_columns_read_in_turn(
    tmp_path: Path,
) -> None:
    """Decision (columnar.texts, `--jobs 1`): the next columns are decoded on a helper
    thread; the rows, and the error of a damaged row group after good ones, are those of the
    columns read in turn, and a caller that stops early stops the thread."""
    import threading

    import pyarrow
    from pyarrow import parquet

    rows = [f"row {i} " + "w" * (i % 50) for i in range(4000)]
    path = tmp_path / "t.parquet"
    parquet.write_table(pyarrow.table({"text": rows}), path, row_group_size=500)
    opts = kinds_base.Options()
    good = columnar_texts(path, opts, ahead=True)
    assert good == columnar_texts(path, opts) and good[1] is None
    assert [text for _, text in good[0]] == rows
    meta = parquet.ParquetFile(path).metadata
    column = meta.row_group(5).column(0)
    start = column.data_page_offset
    data = bytearray(path.read_bytes())
    data[start + 8 : start + 40] = b"\xff" * 32  # inside row group 5's first page
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(bytes(data))
    got, err = columnar_texts(bad, opts, ahead=True)
    assert (got, err) == columnar_texts(bad, opts)
    assert err is not None and len(got) <= 2500
    texts = columnar.texts("parquet", str(path), "f", opts, kinds_base.Counters(), ahead=True)
    next(texts)
    texts.close()  # stops the helper thread
    assert not [t for t in threading.enumerate() if t.name == "matrixctl-columns"]


def test_arrow_batches_sliced_and_columns_that_are_not_strings(tmp_path: Path) -> None:
    """Slices of a record batch (an offset into its buffers), binary and integer columns
    (never text: skipped like a missing field) and a struct's field."""
    import pyarrow

    table = pyarrow.table(
        {
            "text": CELLS * 400,
            "blob": [c.encode() if c is not None else None for c in CELLS] * 400,
            "n": list(range(len(CELLS) * 400)),
            "doc": [{"body": c} for c in CELLS] * 400,
        }
    )
    path = tmp_path / "t.arrow"
    with pyarrow.ipc.new_file(str(path), table.schema) as writer:
        writer.write_table(table, max_chunksize=2000)  # batches cut at BATCH_ROWS inside
    opts = kinds_base.Options()
    got, _ = columnar_texts(path, opts, "arrow")
    assert got == reference_texts(CELLS * 400, opts)[0]
    for field in ("blob", "n"):
        got, _ = columnar_texts(path, kinds_base.Options(text_field=field), "arrow")
        assert got == []
    got, _ = columnar_texts(path, kinds_base.Options(text_field="doc.body"), "arrow")
    assert got == reference_texts(CELLS * 400, opts)[0]


# Matching many documents at once -------------------------------------------------------------


def small_map(tmp_path: Path, name: str, marking: dict[str, Any] | None, norm: str) -> pi.Tokenizer:
    symbols = [
        {"id": 0, "text": "<unk>", "special": True},
        {"id": 1, "text": "</s>", "special": True},
        {"id": 2, "text": "\u2581the"},
        {"id": 3, "text": "the"},
        {"id": 4, "text": "\u2581caf\u00e9"},
        {"id": 5, "text": "s"},
        {"id": 6, "text": "\u2581"},
        {"id": 7, "text": "fi"},
    ]
    doc = {
        "version": 1,
        "vocab_size": 8,
        "unk_id": 0,
        "pad_id": 0,
        "eos_id": 1,
        "byte_fallback": False,
        "normalization": norm,
        "symbols": symbols,
    }
    if marking is not None:
        doc["space_marking"] = marking
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return pi.Tokenizer(pi.load_symbol_map(str(path))[0])


TEXTS = [
    "the cafe\u0301s the",  # NFC/NFKC compose the accent
    "",
    "   ",
    "\ufb01the",  # NFKC: the ligature is "fi"
    "The THE the",
    "\u4e2d",
    "plain ascii text",
]


def per_document(tok: pi.Tokenizer, texts: list[str], eos_id: int | None) -> tuple[Any, ...]:
    """The loop `encode_texts` replaces: `encode_document` on each text."""
    acc = step.UnitTokens("", "ref", "<u4", step.TokenSink())
    result = step.FileResult(None, "jsonl")  # type: ignore[arg-type]
    eos = None if eos_id is None else np.array([eos_id], dtype=tok.dtype)
    ingest_tok = PiIngest(tok, tok.map)
    for item, text in enumerate(texts):
        n = 0
        for ids in ingest_tok.encode_document(iter([text])):
            acc.add(ids)
            n += ids.size
        if n == 0:
            result.empty_documents += 1
            continue
        if eos is not None:
            acc.add(eos)
            n += 1
        acc.record(n, item)
        result.documents += 1
        result.tokens += n
    acc.close(result)
    return (
        result.ids.tolist(),
        result.records,
        result.documents,
        result.tokens,
        result.empty_documents,
    )


def batched(tok: pi.Tokenizer, texts: list[Any], eos_id: int | None) -> tuple[Any, ...]:
    acc = step.UnitTokens("", "new", "<u4", step.TokenSink())
    result = step.FileResult(None, "jsonl")  # type: ignore[arg-type]
    batches = PiIngest(tok, tok.map).encode_texts(iter(enumerate(texts)), eos_id)
    step.take_batches(batches, acc, result, 0 if eos_id is None else 1)
    acc.close(result)
    ids = [] if result.ids is None else result.ids.tolist()
    return ids, result.records, result.documents, result.tokens, result.empty_documents


@pytest.mark.parametrize(
    "marking",
    [
        None,
        {"scheme": "sentencepiece", "marker": "\u2581", "prefix_space": True},
        {"scheme": "wordpiece", "marker": "\u2581", "lowercase": True, "strip_accents": True},
    ],
)
@pytest.mark.parametrize("norm", ["none", "nfkc", "nfd"])
@pytest.mark.parametrize("eos_id", [1, None])
def test_batches_give_what_each_document_alone_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, marking: Any, norm: str, eos_id: int | None
) -> None:
    tok = small_map(tmp_path, "m", marking, norm)
    monkeypatch.setattr(ingest_tokenizer, "TEXT_BATCH", 8)  # several kernel calls
    want = per_document(tok, TEXTS, eos_id)
    assert batched(tok, TEXTS, eos_id) == want
    # An ASCII text handed over as bytes (a Parquet cell) is the same document.
    mixed = [t.encode() if t.isascii() else t for t in TEXTS]
    assert batched(tok, mixed, eos_id) == want
    # Every text handed over as UTF-8 (a JSON Lines record's, kinds_jsonl.texts) too.
    utf8 = memoryview(b"".join(t.encode() for t in TEXTS))
    views, at = [], 0
    for t in TEXTS:
        views.append(utf8[at : at + len(t.encode())])
        at += len(t.encode())
    assert batched(tok, views, eos_id) == want
    assert want[4] >= 1  # empty documents are counted, not recorded


def test_spilled_batches_give_the_same_pack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tokens past MEM_TOKENS go to the spill file part by part (and a pack of a JSON Lines
    file cut in pieces is the pack of the file read whole)."""
    rows = [
        {"text": f"record {i} " + "caf\u00e9 the quick brown fox " * (i % 7)} for i in range(400)
    ]
    src = tmp_path / "r.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    packs = []
    for n, (mem, batch) in enumerate(((1 << 22, 1 << 22), (100, 64), (7, 1))):
        monkeypatch.setattr(ingest_step, "MEM_TOKENS", mem)
        monkeypatch.setattr(ingest_tokenizer, "TEXT_BATCH", batch)
        monkeypatch.setattr(ingest_units, "SPLIT_MIN", 4096)
        monkeypatch.setattr(ingest_units, "PIECE_BYTES", 2048)
        out = tmp_path / f"p{n}"
        run = run_cli("ingest", "docs", str(src), "-o", str(out))
        assert run.code == 0, run.stderr
        packs.append({p.name: p.read_bytes() for p in sorted(out.iterdir())})
    assert packs[0] == packs[1] == packs[2]


# The map cache -------------------------------------------------------------------------------


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MATRIXCTL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("MATRIXCTL_NO_CACHE", raising=False)
    return tmp_path / "cache"


def entries(folder: Path) -> list[Path]:
    return sorted((folder / "pi").glob("*.bin")) if (folder / "pi").exists() else []


def pack_of(tmp_path: Path, name: str, *args: str, env: dict[str, str] | None = None) -> dict:
    src = tmp_path / "in.jsonl"
    if not src.exists():
        src.write_text(
            "".join(json.dumps({"text": f"doc {i} caf\u00e9 \ufb01"}) + "\n" for i in range(50)),
            encoding="utf-8",
        )
    out = tmp_path / name
    run = run_cli("ingest", "docs", str(src), "-o", str(out), *args, env=env)
    assert run.code == 0, run.stderr
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def test_ingest_takes_the_map_from_the_cache(cache: Path, tmp_path: Path) -> None:
    """--jobs 1 stores the checked map and its matcher, and a later run uses them: off, miss,
    hit and --jobs 2 (workers build their own matchers) give the same pack."""
    off = pack_of(tmp_path, "off", env={"MATRIXCTL_NO_CACHE": "1"})
    assert entries(cache) == []
    miss = pack_of(tmp_path, "miss")
    assert len(entries(cache)) == 1
    hit = pack_of(tmp_path, "hit")
    two = pack_of(tmp_path, "two", "--jobs", "2")
    assert off == miss == hit == two


def test_a_damaged_cache_entry_is_replaced_not_trusted(cache: Path, tmp_path: Path) -> None:
    good = pack_of(tmp_path, "good")
    [entry] = entries(cache)
    sound = entry.read_bytes()
    at = len(sound) - 40  # inside the compiled trie
    entry.write_bytes(sound[:at] + bytes([sound[at] ^ 0x10]) + sound[at + 1 :])
    assert pack_of(tmp_path, "again") == good
    assert entry.read_bytes() == sound  # checked in full again and stored again


def test_a_changed_map_is_checked_again(cache: Path, tmp_path: Path) -> None:
    doc = Path(pi.default_map_path()).read_text(encoding="utf-8")
    path = tmp_path / "map.json"
    path.write_text(doc, encoding="utf-8")
    pack_of(tmp_path, "first", "--symbols", str(path))
    path.write_text(doc.replace('"vocab_size": 61883', '"vocab_size": 1'), encoding="utf-8")
    run = run_cli(
        "ingest",
        "docs",
        str(tmp_path / "in.jsonl"),
        "-o",
        str(tmp_path / "x"),
        "--symbols",
        str(path),
    )
    assert run.code == 1 and "error[PI_" in run.stderr and not (tmp_path / "x").exists()


def test_a_cached_map_pickles_with_its_symbols(cache: Path) -> None:
    """The Dask executor pickles the build's state, map included: a map from the cache (its
    symbols read on first use) pickles whole."""
    path = pi.default_map_path()
    smap, raw, _ = pi_cache.load_tokenizer(path)
    hit = pi_cache.load(raw)
    assert hit is not None
    cached = hit[0]
    assert "symbols" not in cached.__dict__  # not read yet
    again = pickle.loads(pickle.dumps(cached))
    assert again == smap and again.symbols == smap.symbols
    assert again.canonical_hash() == smap.canonical_hash()


# --jobs 1 reads a JSON Lines file once -------------------------------------------------------


def lines_file(path: Path, tail: bytes = b"") -> Path:
    """Records of every length around the piece size (some longer than two pieces, so the
    buffer grows), blank lines, a BOM, CRLF, and no line feed after the last record."""
    rows = [json.dumps({"text": f"r{i} " + "caf\u00e9 word " * (i * 37 % 900)}) for i in range(120)]
    rows.insert(5, "")
    rows.insert(9, "   ")
    path.write_bytes(BOM + "\r\n".join(rows).encode() + tail)
    return path


@pytest.mark.parametrize("tail", [b"", b"\n", b"\n\n"])
def test_one_read_gives_the_pack_of_ranges_and_of_the_whole_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tail: bytes
) -> None:
    monkeypatch.setattr(ingest_units, "SPLIT_MIN", 4096)
    monkeypatch.setattr(ingest_units, "PIECE_BYTES", 2048)
    src = lines_file(tmp_path / "r.jsonl", tail)
    packs = {}
    for name, args in (("one", ()), ("two", ("-j", "2")), ("whole", ("--on-error", "skip"))):
        out = tmp_path / name
        run = run_cli("ingest", "docs", str(src), "-o", str(out), *args)
        assert run.code == 0, run.stderr
        packs[name] = {p.name: p.read_bytes() for p in sorted(out.iterdir())}
    assert packs["one"] == packs["two"]
    for art in ("matrix_atoms.bin", "doc_index.bin"):
        assert packs["one"][art] == packs["whole"][art]


def test_one_read_reports_a_line_too_long_as_ranges_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one line over --max-doc-size (longer than the buffers, so the cut finds no line
    end) is the same error read once, as ranges, or uncut."""
    rows = [json.dumps({"text": f"short {i}"}) for i in range(300)]
    rows[150] = json.dumps({"text": "long " * 3000})
    src = tmp_path / "r.jsonl"
    src.write_text("\n".join(rows) + "\n", encoding="utf-8")
    errors = []
    for jobs, split in (("1", 4096), ("2", 4096), ("1", 1 << 30)):
        monkeypatch.setattr(ingest_units, "SPLIT_MIN", split)
        monkeypatch.setattr(ingest_units, "PIECE_BYTES", 2048)
        run = run_cli(
            "ingest", "docs", str(src), "-o", str(tmp_path / "x"), "-j", jobs,
            "--max-doc-size", "6000",
        )  # fmt: skip
        assert run.code == 1 and not (tmp_path / "x").exists()
        errors.append(run.stderr)
    assert "INGEST_TOO_LARGE" in errors[0] and "line 151 " in errors[0]
    assert errors[0] == errors[1] == errors[2]


@pytest.mark.parametrize("kind", ["gzip", "zstd"])
def test_compressed_pieces_read_ahead_give_the_plain_pack_and_its_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """--jobs 1 decompresses the next pieces on a helper thread: the same pack as the plain
    file, and a damaged stream is one error, the same as when it is not cut."""
    import gzip

    import zstandard

    monkeypatch.setattr(ingest_units, "SPLIT_MIN", 4096)
    monkeypatch.setattr(ingest_units, "PIECE_BYTES", 2048)
    plain = lines_file(tmp_path / "r.jsonl", b"\n")
    data = plain.read_bytes()
    packed = gzip.compress(data) if kind == "gzip" else zstandard.ZstdCompressor().compress(data)
    src = tmp_path / f"r.jsonl.{'gz' if kind == 'gzip' else 'zst'}"
    src.write_bytes(packed)
    packs = []
    for name, path in (("plain", plain), ("packed", src)):
        out = tmp_path / name
        run = run_cli("ingest", "docs", str(path), "-o", str(out))
        assert run.code == 0, run.stderr
        packs.append({a: (out / a).read_bytes() for a in ("matrix_atoms.bin", "doc_index.bin")})
    assert packs[0] == packs[1]
    src.write_bytes(packed[: len(packed) * 2 // 3])  # cut short
    errors = []
    for split in (4096, 1 << 30):
        monkeypatch.setattr(ingest_units, "SPLIT_MIN", split)
        run = run_cli("ingest", "docs", str(src), "-o", str(tmp_path / "x"))
        assert run.code == 1 and not (tmp_path / "x").exists(), run.stderr
        assert run.stderr.count("error[") == 1 and "Traceback" not in run.stderr
        errors.append(run.stderr.split("]")[0])
    assert errors[0] == errors[1]
