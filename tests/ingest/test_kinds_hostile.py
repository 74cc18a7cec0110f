"""Hostile inputs of `ingest docs`' input kinds (issue 32): JSON records Python cannot hold,
dictionary bombs in Parquet and Arrow, Markdown that made the regexes quadratic, damaged
page checksums, truncated Arrow streams, zstd skippable frames, gzip padding and the error
messages of odd columns and codecs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from matrixctl.ingest import units
from tests.helpers.cli import run_cli
from tests.ingest.test_ingest_inputs import fail, ingest_ok, manifest, records

# JSON records Python cannot hold ------------------------------------------------------------

SURROGATE = '{"id": 1, "text": "cut emoji \\ud83d here"}'
DIGITS = '{"id": 1, "n": ' + "7" * 5000 + ', "text": "a long number"}'


def jsonl_with(tmp_path: Path, line: str, at: int = 5, n: int = 9) -> Path:
    lines = [json.dumps(r) for r in records(n)]
    lines[at] = line
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("cut", [False, True])
def test_a_lone_surrogate_is_a_record_error_with_file_and_line(
    tmp_path: Path, cut: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It used to end the build with INTERNAL (exit 70), even under --on-error skip."""
    if cut:  # through the compiled extractor of cut files, which leaves such a line
        monkeypatch.setattr(units, "PIECE_BYTES", 256)
        monkeypatch.setattr(units, "SPLIT_MIN", 512)
    path = jsonl_with(tmp_path, SURROGATE, n=40)
    offset = len(("\n".join(json.dumps(r) for r in records(5)) + "\n").encode())
    for jobs in ("1", "2"):
        err = fail(tmp_path, str(path), "-j", jobs)
        assert "INGEST_UTF8" in err and "in.jsonl" in err and "line 6" in err, err
        assert f"offset {offset} " in err and "surrogate" in err
    # --encoding-errors replace: U+FFFD in its place; the other records are as they were.
    pack = ingest_ok(tmp_path, str(path), "--encoding-errors", "replace", name="replaced")
    assert manifest(pack)["documents"] == 40
    (tmp_path / "plain").mkdir()
    plain = jsonl_with(tmp_path / "plain", '{"id": 1, "text": "cut emoji \\ufffd here"}', n=40)
    same = ingest_ok(tmp_path, str(plain), name="same")
    assert (pack / "matrix_atoms.bin").read_bytes() == (same / "matrix_atoms.bin").read_bytes()


def test_a_lone_surrogate_follows_skip_file_and_on_error(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    jsonl_with(tmp_path / "src", SURROGATE)
    (tmp_path / "src" / "ok.txt").write_text("fine words\n")
    (tmp_path / "src" / "one.json").write_text('[{"text": "a"}, {"text": "b \\udc00"}]')
    for extra in (["--on-error", "skip"], ["--encoding-errors", "skip-file"]):
        out = tmp_path / f"p{len(extra[1])}"
        run = run_cli("ingest", "docs", str(tmp_path / "src"), "-o", str(out), *extra)
        assert run.code == 0, run.stderr
        skipped = {s["path"].rsplit("/", 1)[-1] for s in manifest(out)["skipped"]}
        assert skipped == {"in.jsonl", "one.json"}, run.stderr
    err = fail(tmp_path, str(tmp_path / "src" / "one.json"))
    assert "INGEST_UTF8" in err and "element 1" in err


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_an_integer_past_pythons_digit_limit_is_a_json_error(tmp_path: Path, suffix: str) -> None:
    path = jsonl_with(tmp_path, DIGITS)
    if suffix == ".json":
        path = path.rename(tmp_path / "in.json")
        path.write_text("[\n" + ",\n".join(path.read_text().splitlines()) + "\n]\n")
    err = fail(tmp_path, str(path))
    line = 7 if suffix == ".json" else 6  # the array's `[` is line 1
    assert "INGEST_JSON" in err and f"line {line} " in err and "4,300 digits" in err, err
    assert ("in" + suffix) in err
    run = run_cli("ingest", "docs", str(path), "-o", str(tmp_path / "p"), "--on-error", "skip")
    assert run.code == 1 and "INGEST_NO_DOCUMENTS" in run.stderr  # the one file was left out


# Markdown: linear in time, bounded in memory -------------------------------------------------

# The regular expressions the Markdown extractor applied before issue 32, line by line, in this
# order: the reference its scanners must agree with (they were quadratic on some lines).
_OLD_INLINE = [
    (r"!\[([^\]]*)\]\([^)]*\)", r"\1"),
    (r"\[([^\]]+)\](?:\([^)]*\)|\[[^\]]*\])", r"\1"),
    (r"<((?:https?|ftp|mailto):[^>\s]+)>", r"\1"),
    (r"`+([^`]+?)`+", r"\1"),
    (r"(\*\*|__)(?=\S)(.+?)(?<=\S)\1", r"\2"),
    (r"(?<![\w*])([*_])(?=\S)(.+?)(?<=\S)\1(?![\w*])", r"\2"),
    (r"</?[A-Za-z][^<>]*>", ""),
]
_OLD_HEADING = r"^ {0,3}#{1,6}(?:\s+|$)(.*?)(?:\s+#+\s*)?$"


def _old_markdown(text: str) -> str:
    """The extractor before issue 32 (its line loop and expressions), for texts of short
    lines: the reference."""
    import re

    out: list[str] = []
    fence = None
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    in_front = False
    for n, raw in enumerate(lines):
        line = raw
        if n == 0 and line.rstrip() == "---":
            in_front = True
            continue
        if in_front:
            if line.rstrip() in ("---", "..."):
                in_front = False
            continue
        m = re.match(r"^ {0,3}(`{3,}|~{3,})", line)
        if fence is not None:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = None
                continue
            out.append(line + "\n")
            continue
        if m:
            fence = m.group(1)
            continue
        if (
            re.match(r"^ {0,3}(?:[-*_] *){3,}$", line)
            or re.match(r"^ {0,3}(?:=+|-+) *$", line)
            or re.match(r"^ {0,3}\[[^\]]+\]:\s+\S", line)
        ):
            continue
        h = re.match(_OLD_HEADING, line)
        if h:
            line = h.group(1)
        line = re.sub(r"^ {0,3}(?:> ?)+", "", line)
        line = re.sub(r"^(\s*)(?:[-*+]|\d{1,9}[.)])\s+", r"\1", line)
        for pattern, repl in _OLD_INLINE:
            line = re.sub(pattern, repl, line)
        out.append(line.rstrip() + "\n")
    return "".join(out)


def _md(text: str, long: int | None = None) -> str:
    from matrixctl.ingest.kinds import markdown

    lines = (
        markdown.split_lines(iter([text]))
        if long is None
        else markdown.split_lines(iter([text]), long)
    )
    return "".join(markdown.markdown_lines(lines))


def test_markdown_scanners_agree_with_the_old_expressions_on_generated_lines() -> None:
    """Output identical to the regular expressions' on lines dense in markup: 20,000 texts
    from small alphabets of delimiters, so every construct opens, closes, nests and fails."""
    import random

    rng = random.Random(32)
    alphabets = [
        [*"*_`[]()!<>#:- \t=.a1\u00a0\x1c", "http:", "mailto:", "**", "__", "![", "]("],
        list("*_ a.\u00a0"),
        list("`a "),
        list("[]()a !"),
        ["<", ">", ":", "http", "https", "ftp:", "a", " "],
        [*"# a\t", "##"],
        ["**", "__", "*", "_", " ", "a", "\u00e9"],
    ]
    for alphabet in alphabets:
        for _ in range(20_000 // len(alphabets)):
            lines = [
                "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 30)))
                for _ in range(rng.randrange(1, 5))
            ]
            text = "\n".join(lines) + "\n"
            assert _md(text) == _old_markdown(text), repr(text)


def test_markdown_output_is_unchanged_on_ordinary_documents() -> None:
    from tests.helpers.cli import ROOT

    text = "".join(p.read_text() for p in sorted((ROOT / "docs").glob("**/*.md")))
    assert _md(text) == _old_markdown(text)


ADVERSARIAL = [" **a", " *a", " _a", "![", "[a", "[a](", "<http:", "```a", "`", "[a]", "__a "]


def _run_child(code: str, tmp_path: Path, timeout: float = 60) -> str:
    """Run `code` in a Python child; its stdout. A hang past `timeout` fails the test."""
    import subprocess
    import sys

    from tests.helpers.cli import ROOT

    script = tmp_path / "child.py"
    script.write_text(code)
    try:
        run = subprocess.run(
            [sys.executable, str(script)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running after {timeout} s")
    assert run.returncode == 0, run.stderr
    return run.stdout


def test_adversarial_markdown_is_extracted_in_linear_time(tmp_path: Path) -> None:
    """` **a` * 50,000 was still running after 60 s (issue 32), 1 MB lines would take hours:
    here 13 lines of about 1 MB each (after `x `, so none opens a fence; one a heading, one
    a list item). The child's timeout is the fail signal; what is asserted is the output:
    each line's length is the old expressions' on the same pattern repeated (affine in the
    repeats, extrapolated from 100, 200 and 300 of them)."""
    lines = [("x ", p) for p in ADVERSARIAL] + [("# ", " **a"), ("- ", " *a")]
    out = _run_child(
        "import json\n"
        "from matrixctl.ingest.kinds import markdown\n"
        f"lines = {lines!r}\n"
        "text = ''.join(h + p * (1_000_000 // len(p) // 100 * 100) + '\\n' for h, p in lines)\n"
        "out = ''.join(markdown.markdown_lines(markdown.split_lines(iter([text]))))\n"
        "print(json.dumps([len(x) for x in out.split('\\n')[:-1]]))\n",
        tmp_path,
    )
    got = json.loads(out)
    assert len(got) == len(lines)
    for (head, pattern), length in zip(lines, got, strict=True):
        old = [len(_old_markdown(head + pattern * k + "\n")) - 1 for k in (100, 200, 300)]
        assert old[2] - old[1] == old[1] - old[0], (pattern, old)
        repeats = 1_000_000 // len(pattern) // 100 * 100
        assert length == old[0] + (old[1] - old[0]) * (repeats - 100) // 100, (head, pattern)


def test_a_huge_markdown_line_is_bounded_in_memory(tmp_path: Path) -> None:
    """One 512 MB Markdown line (a 16 KB `.zst`) took 244 s and 2.5 GB: a 160 MiB line here,
    through the zstd stream and the extractor, under 400 MB in a child (its VmHWM: the
    ru_maxrss of a child carries its parent's across exec, on Linux)."""
    import zstandard

    unit = b"word **a** [b](c) `d` "
    n = 160 * 2**20 // 22
    packed = zstandard.ZstdCompressor().compress(b"# " + unit * n)
    (tmp_path / "x.md.zst").write_bytes(packed)  # made here: the child's peak is its reading
    out = _run_child(
        "from matrixctl.ingest.kinds import base, compressed, markdown\n"
        f"raw = open({str(tmp_path / 'x.md.zst')!r}, 'rb')\n"
        "stream, _ = compressed.decompressing(raw, 'zstd', 'x.md.zst')\n"
        "total = stars = 0\n"
        "for _, pieces in markdown.documents(stream, 'x.md', base.Options(), base.Counters()):\n"
        "    for p in pieces:\n"
        "        total += len(p)\n"
        "        stars += p.count('*')\n"
        "status = open('/proc/self/status').read().split('VmHWM:')[1]\n"
        "print(total, stars, int(status.split()[0]) // 1024)\n",
        tmp_path,
        timeout=300,
    )
    total, stars, peak = (int(x) for x in out.split())
    # `word a b d ` per unit: strong, link and code removed, within each 1 Mi segment (a
    # unit cut by a segment's end keeps its markup); the heading mark goes.
    assert n * 11 <= total < n * 11 + 160 * 22 and stars <= 160 * 4, (total, stars)
    assert peak < 400, f"peak {peak} MB"


def test_long_lines_are_cut_into_the_same_segments_whatever_the_reads() -> None:
    import random

    from matrixctl.ingest.kinds import markdown

    rng = random.Random(7)
    for _ in range(2000):
        text = "".join(rng.choice("ab\n  ") for _ in range(rng.randrange(0, 120)))
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randrange(6))))
        reads = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        whole = list(markdown.split_lines(iter([text]), 7))
        assert list(markdown.split_lines(iter(reads), 7)) == whole
        assert all(len(s) <= 7 for s, _ in whole) and all(s for s, ends in whole if not ends)
        joined, line = [], ""
        for s, ends in whole:
            line += s
            if ends:
                joined.append(line)
                line = ""
        assert joined == text.removesuffix("\n").split("\n") if text else joined == []


def test_a_long_line_keeps_its_block_markup_from_its_first_segment() -> None:
    """Decision (docs/inputs.md, "Markdown"): a line longer than a segment is a heading,
    quote or list item by its first segment; it is never a rule or setext underline; inline
    markup is removed within each segment, trailing white space of the line only."""
    assert _md("# Title **b** and more  \nnext\n", long=8) == "Title b and more\nnext\n"
    assert _md("- - - - - x\n", long=4) == "- - - - x\n"  # a list item, not a rule
    assert _md("```\n" + "k" * 20 + "\n```\n", long=8) == "k" * 20 + "\n"
    assert _md("a" * 9 + "   \n", long=4) == "a" * 9 + "\n"
    assert _md("a" * 7 + "   b\n", long=4) == "a" * 7 + "   b\n"


# Parquet and Arrow: bombs, checksums, truncation, odd columns ----------------------------------


def _dictionary_table(value_mib: int = 20, rows: int = 5000, small: int = 0) -> Any:
    """`small` rows of their own short entries, then `rows` rows of one long entry: a
    dictionary whose entries average under 4 KiB, so no page header gives the long one away."""
    import numpy as np
    import pyarrow

    entries = [f"t{i}" for i in range(small)] + ["x" * (value_mib << 20)]
    indices = np.concatenate([np.arange(small), np.full(rows, small)]).astype(np.int32)
    column = pyarrow.DictionaryArray.from_arrays(pyarrow.array(indices), entries)
    return pyarrow.table({"text": column})


def write_bomb(path: Path, small: int = 0) -> Path:
    """One 20 MiB value used by 5,000 rows (zstd): 100 GB of text in about 1.5 KB."""
    import pyarrow
    from pyarrow import ipc, parquet

    table = _dictionary_table(small=small)
    if path.suffix == ".parquet":
        parquet.write_table(table, path, compression="zstd")
    else:
        options = ipc.IpcWriteOptions(compression="zstd")
        with (
            pyarrow.OSFile(str(path), "wb") as out,
            ipc.new_file(out, table.schema, options=options) as w,
        ):
            w.write_table(table)
    assert path.stat().st_size < 4096 + 16 * small
    return path


@pytest.mark.parametrize("name", ["bomb.parquet", "bomb.arrow", "plain-bomb.parquet"])
def test_a_dictionary_bomb_is_refused_in_bounded_memory(tmp_path: Path, name: str) -> None:
    """Issue 32: 22-23 GB and the OOM killer, 10.4 GB (Parquet) or 23 GB (Arrow) with
    --max-doc-size 4096. Here the build runs in a child whose peak memory is measured."""
    small = 10_000 if name == "bomb.parquet" else 0  # past the page header check
    path = write_bomb(tmp_path / name, small)
    out = _run_child(
        "import resource, subprocess, sys\n"
        "run = subprocess.run([sys.executable, '-m', 'matrixctl', 'ingest', 'docs',"
        f" {str(path)!r}, '-o', {str(tmp_path / 'p')!r}, '--max-doc-size', '4096'])\n"
        "print(run.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)\n",
        tmp_path,
        timeout=300,
    )
    code, peak = (int(x) for x in out.split()[-2:])
    assert code == 1 and peak < 400, out
    err = fail(tmp_path, str(path), "--max-doc-size", "4096")
    row = "(row group 0)" if name.startswith("plain") else f"row {small} "
    assert "INGEST_TOO_LARGE" in err and row in err, err


@pytest.mark.parametrize("suffix", [".parquet", ".arrow"])
def test_dictionary_columns_give_the_plain_columns_documents(tmp_path: Path, suffix: str) -> None:
    """Read as a dictionary, cell by cell as views of the entries: the same pack as the same
    rows stored plain, nulls, CRLF and a struct field included."""
    import pyarrow
    from pyarrow import ipc, parquet

    texts = [
        f"entry {i % 7} words\r\nline" if i % 5 == 0 else f"entry {i % 7}" for i in range(3000)
    ]
    texts[11] = None
    plain = pyarrow.array(texts)
    encoded = plain.dictionary_encode()
    for column, name in ((plain, "plain"), (encoded, "dict")):
        table = pyarrow.table(
            {"text": column, "doc": pyarrow.StructArray.from_arrays([column], ["body"])}
        )
        path = tmp_path / f"{name}{suffix}"
        if suffix == ".parquet":
            parquet.write_table(table, path, row_group_size=700)
        else:
            with pyarrow.OSFile(str(path), "wb") as out, ipc.new_file(out, table.schema) as w:
                w.write_table(table, max_chunksize=700)
    for field in ("text", "doc.body"):
        packs = [
            ingest_ok(
                tmp_path, str(tmp_path / f"{n}{suffix}"), "--text-field", field, name=f"{n}-{field}"
            )
            for n in ("plain", "dict")
        ]
        for art in ("matrix_atoms.bin", "doc_index.bin"):
            assert (packs[0] / art).read_bytes() == (packs[1] / art).read_bytes()
        assert manifest(packs[1])["documents"] == 2999


def test_parquet_page_checksums_are_verified(tmp_path: Path) -> None:
    """Issue 32: 26 of 100 mutants of a checksummed file went in with changed text."""
    import pyarrow
    from pyarrow import parquet

    rows = [f"document number {i} with some words" for i in range(3000)]
    path = tmp_path / "crc.parquet"
    parquet.write_table(
        pyarrow.table({"text": rows}),
        path,
        write_page_checksum=True,
        use_dictionary=False,
        compression="none",
    )
    ingest_ok(tmp_path, str(path))
    data = bytearray(path.read_bytes())
    data[data.find(b"document number 1500") + 9] ^= 0x20  # still valid UTF-8 text
    path.write_bytes(bytes(data))
    for jobs in ("1", "2"):
        err = fail(tmp_path, str(path), "-j", jobs)
        assert "INGEST_PARQUET_CRC" in err and "crc.parquet" in err


def test_an_arrow_stream_without_its_end_marker_is_truncated(tmp_path: Path) -> None:
    """Issue 32: a stream cut between record batches was read as complete (1,200 of 2,000
    rows)."""
    import pyarrow
    from pyarrow import ipc

    table = pyarrow.table({"text": [f"row {i}" for i in range(2000)]})
    sink = pyarrow.BufferOutputStream()
    with ipc.new_stream(sink, table.schema) as w:
        w.write_table(table, max_chunksize=100)
    data = sink.getvalue().to_pybytes()
    assert data.endswith(b"\xff\xff\xff\xff\x00\x00\x00\x00")
    (tmp_path / "whole.arrow").write_bytes(data)
    assert manifest(ingest_ok(tmp_path, str(tmp_path / "whole.arrow")))["documents"] == 2000
    (tmp_path / "whole.arrow").unlink()
    (tmp_path / "p").rename(tmp_path / "kept")
    cut = tmp_path / "cut.arrow"
    cut.write_bytes(data[:-8])  # every batch, no end marker
    err = fail(tmp_path, str(cut))
    assert "INGEST_COLUMNAR" in err and "truncated" in err and "end-of-stream" in err
    cut.write_bytes(data[: len(data) // 2])  # inside a batch
    err = fail(tmp_path, str(cut))
    assert "INGEST_COLUMNAR" in err and "Arrow IPC" in err and "Traceback" not in err


@pytest.mark.parametrize("suffix", [".parquet", ".arrow"])
def test_a_text_column_that_is_not_text_names_itself_and_its_type(
    tmp_path: Path, suffix: str
) -> None:
    """Issue 32: a list or integer `text` column gave "the inputs hold no document"."""
    import pyarrow
    from pyarrow import ipc, parquet

    cases = {
        "list": (pyarrow.array([["a", "b"], ["c"]]), "list<"),
        "int": (pyarrow.array([1, 2]), "int64"),
        "binary": (pyarrow.array([b"a", b"b"]), "binary"),
    }
    for name, (column, shown) in cases.items():
        table = pyarrow.table({"text": column})
        path = tmp_path / f"{name}{suffix}"
        if suffix == ".parquet":
            parquet.write_table(table, path)
        else:
            with pyarrow.OSFile(str(path), "wb") as out, ipc.new_file(out, table.schema) as w:
                w.write_table(table)
        err = fail(tmp_path, str(path))
        assert "INGEST_TEXT_FIELD" in err and "column 'text'" in err and shown in err, err
    err = fail(tmp_path, str(tmp_path / f"int{suffix}"), "--text-field", "text.x")
    assert "INGEST_TEXT_FIELD" in err and "no field 'x'" in err


@pytest.mark.parametrize("jobs", ["1", "2"])
@pytest.mark.parametrize("suffix", [".parquet", ".arrow"])
def test_parquet_and_arrow_on_stdin_are_refused_at_any_jobs(
    tmp_path: Path, jobs: str, suffix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decision (docs/inputs.md): refused at every --jobs (it was refused at 1, read at 2)."""
    import pyarrow
    from pyarrow import ipc, parquet

    monkeypatch.setattr(units, "SPLIT_MIN", 4096)  # a large one is cut at --jobs 2: refused too
    table = pyarrow.table({"text": [f"row {i} of some text" for i in range(5000)]})
    path = tmp_path / f"in{suffix}"
    if suffix == ".parquet":
        parquet.write_table(table, path, row_group_size=500)
    else:
        with pyarrow.OSFile(str(path), "wb") as out, ipc.new_file(out, table.schema) as w:
            w.write_table(table)
    err = fail(tmp_path, "-", "-j", jobs, stdin=path.read_bytes())
    assert "INGEST_COLUMNAR" in err and "stdin" in err


# Compressed inputs: zstd skippable frames, gzip padding, messages -----------------------------


def skippable(payload: bytes, nibble: int = 0) -> bytes:
    return bytes([0x50 + nibble]) + b"\x2a\x4d\x18" + len(payload).to_bytes(4, "little") + payload


def text_lines(n: int) -> bytes:
    return b"".join(b"line %d of the corpus, with words\n" % i for i in range(n))


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_zstd_skippable_frames_anywhere_are_accepted(
    tmp_path: Path, jobs: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`pzstd` writes a skippable frame before each frame; the format allows them anywhere.
    Refused before, and skipped as binary inside a folder (issue 32)."""
    import zstandard

    monkeypatch.setattr(units, "PIECE_BYTES", 2048)  # JSON Lines cut into pieces too
    monkeypatch.setattr(units, "SPLIT_MIN", 4096)
    data = b"".join(b'{"text": "record %d of many"}\n' % i for i in range(3000))
    parts = [data[i : i + 20000] for i in range(0, len(data), 20000)]
    frames = b"".join(
        skippable(len(p).to_bytes(4, "little"), n % 16) + zstandard.ZstdCompressor().compress(p)
        for n, p in enumerate(parts)
    )
    stored = skippable(b"") + frames + skippable(b"trailing metadata", 15)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "in.jsonl.zst").write_bytes(stored)
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "in.jsonl").write_bytes(data)
    got = ingest_ok(tmp_path, str(tmp_path / "src"), "-j", jobs, name="got")
    want = ingest_ok(tmp_path, str(tmp_path / "plain"), "-j", jobs, name="want")
    assert manifest(got)["skipped"] == [] and manifest(got)["documents"] == 3000
    for art in ("matrix_atoms.bin", "doc_index.bin"):
        assert (got / art).read_bytes() == (want / art).read_bytes()


@pytest.mark.parametrize("delta", [-9, -1, 0, 1, 5, 64])
def test_gzip_zero_padding_is_skipped_wherever_the_reads_end(tmp_path: Path, delta: int) -> None:
    """Decision (docs/inputs.md, "Compressed inputs"): zero bytes between and after gzip
    members are padding, skipped. It used to depend on where a 64 KiB read ended: here the
    first member ends `delta` bytes from the 64 KiB boundary, then 100 zero bytes."""
    import gzip

    from matrixctl.ingest.kinds import compressed

    text = text_lines(3000)
    target = compressed.IN_PIECE + delta
    size = target - 23  # stored blocks: 18 bytes of header and trailer, 5 per block
    first, member = b"", b""
    for size in range(target - 30, target):
        first = text[:size]
        member = gzip.compress(first, compresslevel=0, mtime=0)
        if len(member) == target:
            break
    assert len(member) == target
    second = text_lines(10)
    padded = member + b"\0" * 100 + gzip.compress(second, mtime=0) + b"\0" * 37
    (tmp_path / "padded.txt.gz").write_bytes(padded)
    (tmp_path / "plain.txt").write_bytes(first + second)
    got = ingest_ok(tmp_path, str(tmp_path / "padded.txt.gz"), name="got")
    want = ingest_ok(tmp_path, str(tmp_path / "plain.txt"), name="want")
    assert (got / "matrix_atoms.bin").read_bytes() == (want / "matrix_atoms.bin").read_bytes()


def test_compressed_edge_cases_give_the_right_message(tmp_path: Path) -> None:
    import gzip

    import zstandard

    data = text_lines(200)
    member = gzip.compress(data, mtime=0)
    frame = zstandard.ZstdCompressor().compress(data)
    cases = {
        "then-zstd.txt.gz": (
            member + frame,
            f"followed by a zstd stream, not another member [offset {len(member)} ",
        ),
        "then-gzip.txt.zst": (
            frame + member,
            f"followed by a gzip stream, not another frame [offset {len(frame)} ",
        ),
        "junk.txt.gz": (
            member + b"\0\0junk",
            f"followed by data, not another member [offset {len(member) + 2} ",
        ),
        "cut-magic.txt.zst": (frame[:3], "zstd stream ends inside its magic bytes"),
        "cut-skippable.txt.zst": (
            skippable(b"x" * 40)[:20],
            "zstd stream ends before its end marker",
        ),
    }
    (tmp_path / "src").mkdir()
    for name, (stored, message) in cases.items():
        (tmp_path / "src" / name).write_bytes(stored)
        err = fail(tmp_path, str(tmp_path / "src" / name))
        assert "INGEST_COMPRESSED" in err and message in err, err
    (tmp_path / "src" / "ok.txt").write_bytes(data)
    pack = ingest_ok(tmp_path, str(tmp_path / "src"), "--on-error", "skip")
    skipped = manifest(pack)["skipped"]  # every one an error, none "binary"
    assert sorted(s["code"] for s in skipped) == ["INGEST_COMPRESSED"] * len(cases), skipped


@pytest.mark.parametrize("dictionary", [True, False])
def test_a_huge_parquet_cell_is_refused_before_it_is_read(tmp_path: Path, dictionary: bool) -> None:
    """Issue 32: one 300 MB cell (a 10 KB file) peaked at 1.0 GB with --max-doc-size 4096.
    The page's header (160 MiB for 2 values) refuses it before the page is decompressed."""
    import pyarrow
    from pyarrow import parquet

    path = tmp_path / "cell.parquet"
    table = pyarrow.table({"text": ["y" * (160 << 20), "small"]})
    parquet.write_table(table, path, compression="zstd", use_dictionary=dictionary)
    del table
    assert path.stat().st_size < 64 << 10
    out = _run_child(
        "import resource, subprocess, sys\n"
        "run = subprocess.run([sys.executable, '-m', 'matrixctl', 'ingest', 'docs',"
        f" {str(path)!r}, '-o', {str(tmp_path / 'p')!r}, '--max-doc-size', '4096'],"
        " capture_output=True, text=True)\n"
        "print(run.stderr)\n"
        "print(run.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)\n",
        tmp_path,
    )
    code, peak = (int(x) for x in out.split()[-2:])
    assert code == 1 and "INGEST_TOO_LARGE" in out and "(row group 0)" in out, out
    assert peak < 300, out


def test_a_footer_pyarrow_aborts_on_is_one_error(tmp_path: Path) -> None:
    """Found by fuzz/fuzz_columnar_dictionary_parquet.py: pyarrow's accessor of a column
    chunk's metadata aborts the process (an untranslated C++ exception, "Definition level
    histogram size mismatch") on this footer; the column chunks are read from the footer
    by matrixctl's own reader instead. Run in a child: an abort would end this process."""
    import subprocess
    import sys

    from tests.helpers.cli import FUZZ_REGRESSIONS

    path = FUZZ_REGRESSIONS / "columnar_parquet_level_histogram.parquet"
    for jobs in ("1", "2"):
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "matrixctl",
                "ingest",
                "docs",
                str(path),
                "-j",
                jobs,
                "-o",
                str(tmp_path / "p"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert run.returncode == 1, (run.returncode, run.stderr)
        assert "INGEST_COLUMNAR" in run.stderr and "histogram" in run.stderr
        assert not (tmp_path / "p").exists()


def test_a_string_view_column_is_read_in_bounded_runs(tmp_path: Path) -> None:
    """A `string_view` column (Polars' Arrow files) may point many rows at one long value:
    it is made into strings in runs of bounded text, a cell over the limit never made."""
    import pyarrow
    from pyarrow import ipc

    from matrixctl.ingest.kinds import base, columnar

    texts = ["hello", None, "x" * 5000, "world\r\nz"]
    table = pyarrow.table({"text": pyarrow.array(texts, type=pyarrow.string_view())})
    path = tmp_path / "view.arrow"
    with pyarrow.OSFile(str(path), "wb") as out, ipc.new_file(out, table.schema) as w:
        w.write_table(table)
    counters = base.Counters()
    got = list(columnar.texts("arrow", str(path), "view.arrow", base.Options(), counters))
    assert got == [(0, "hello"), (2, "x" * 5000), (3, "world\nz")]
    assert counters.skipped_records == 1
    with pytest.raises(Exception, match="row 2 is larger than --max-doc-size"):
        list(columnar.texts("arrow", str(path), "v", base.Options(max_doc=4096), base.Counters()))
