"""ingest docs on the inputs people have: text trees with odd files, the per-file error policy,
compressed files, Parquet/Arrow, stdin, work units inside one file, size bounds."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from matrixctl.ingest import docs, units, writer
from matrixctl.ingest.kinds import base as kinds_base
from matrixctl.ingest.tokenizer import PiIngest
from matrixctl.validate.engine import examine
from tests.helpers.cli import run_cli


def tree_bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def manifest(pack: Path) -> dict:
    return json.loads((pack / "ingest_manifest.json").read_text())


def codes_of(pack: Path) -> set[str]:
    report, _ = examine(str(pack), scan=True)
    return {f.code for f in report.findings}


def docs_tree(root: Path) -> Path:
    """A documentation tree with the files that used to stop a run."""
    src = root / "doc"
    (src / "bash").mkdir(parents=True)
    (src / "bash" / "README.abs-guide").write_text(
        "[ This is just a pointer to the Advanced Bash Scripting Guide ]\nSee the web.\n"
    )
    (src / "bash" / "README.md").write_text(
        "[![Build status](https://ci.example/x.svg)](https://ci.example)\n# Tool\nWords.\n"
    )
    (src / "bash" / "notes.txt").write_text("{ braces first } then words\n")
    (src / "bash" / "changes").write_text("Plain text changes file.\n")
    (src / "broken.json").write_text('{"text": "a"')
    (src / "bad.jsonl").write_text('{"text": "a"}\n{oops\n')
    (src / "latin1").write_bytes(b"caf\xe9 au lait\n")
    return src


# Part 1: names decide, one bad file never aborts the run ---------------------------------------


def test_markdown_and_text_names_are_never_parsed_as_json(tmp_path: Path) -> None:
    """Decision: .md/.txt files that start with `[` or `{` are Markdown/text, not JSON."""
    src = docs_tree(tmp_path)
    for name in ("broken.json", "latin1", "bad.jsonl"):
        (src / name).unlink()
    run = run_cli("ingest", "docs", str(src), "-o", str(tmp_path / "p"), "--json")
    assert run.code == 0, run.stderr
    kinds = {s["path"].rsplit("/", 1)[-1]: s["kind"] for s in manifest(tmp_path / "p")["sources"]}
    assert kinds == {
        "README.abs-guide": "text",  # `[ This is...`: the JSON parser rejects it mid-line
        "README.md": "markdown",
        "changes": "text",
        "notes.txt": "text",
    }


def test_one_bad_file_fails_the_run_by_default(tmp_path: Path) -> None:
    src = docs_tree(tmp_path)
    run = run_cli("ingest", "docs", str(src), "-o", str(tmp_path / "p"))
    assert run.code == 1 and "INGEST_JSON" in run.stderr and "bad.jsonl" in run.stderr
    assert not (tmp_path / "p").exists()
    assert sorted(os.listdir(tmp_path)) == ["doc"]


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_on_error_skip_names_and_counts_every_skipped_file(tmp_path: Path, jobs: str) -> None:
    """Decision: --on-error skip leaves out any file that fails (parse, encoding, unreadable),
    names it with its error code in the report and the manifest, and goes on."""
    src = docs_tree(tmp_path)
    out = tmp_path / "p"
    run = run_cli("ingest", "docs", str(src), "-o", str(out), "--on-error", "skip", "-j", jobs)
    assert run.code == 0, run.stderr
    assert "skipped 3 files" in run.stderr
    for name in ("bad.jsonl", "broken.json", "latin1"):
        assert f"/{name}: INGEST_" in run.stderr
    m = manifest(out)
    skipped = {s["path"].rsplit("/", 1)[-1]: s for s in m["skipped"]}
    assert {k: v["code"] for k, v in skipped.items()} == {
        "bad.jsonl": "INGEST_JSON",
        "broken.json": "INGEST_JSON",
        "latin1": "INGEST_UTF8",
    }
    assert "at byte 3" in skipped["latin1"]["reason"]
    assert all(isinstance(v["ordinal"], int) for v in skipped.values())
    assert m["options"]["on_error"] == "skip"
    assert len(m["sources"]) == 4
    assert codes_of(out) == set()
    js = run_cli(
        "ingest", "docs", str(src), "-o", str(tmp_path / "q"), "--on-error", "skip", "--json"
    )
    assert js.json()["skipped"] == 3
    assert sorted(s["code"] for s in js.json()["skipped_files"]) == [
        "INGEST_JSON",
        "INGEST_JSON",
        "INGEST_UTF8",
    ]


def test_on_error_skip_gives_the_same_bytes_whatever_jobs(tmp_path: Path) -> None:
    src = docs_tree(tmp_path)
    for n in range(40):
        (src / f"f{n:02}.txt").write_text(f"file {n} " * (n * 50 + 1))
    packs = []
    for jobs in ("1", "2", "3"):
        out = tmp_path / f"p{jobs}"
        run = run_cli("ingest", "docs", str(src), "-o", str(out), "--on-error", "skip", "-j", jobs)
        assert run.code == 0, run.stderr
        packs.append(tree_bytes(out))
    assert packs[0] == packs[1] == packs[2]


def test_a_file_that_vanishes_is_skipped_as_unreadable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = docs_tree(tmp_path)
    real = writer.enumerate_sources

    def listing_then_delete(*args, **kwargs):  # type: ignore[no-untyped-def]
        out = real(*args, **kwargs)
        (src / "bash" / "changes").unlink()
        return out

    monkeypatch.setattr(writer, "enumerate_sources", listing_then_delete)
    out = tmp_path / "p"
    run = run_cli("ingest", "docs", str(src), "-o", str(out), "--on-error", "skip")
    assert run.code == 0, run.stderr
    skipped = {s["path"].rsplit("/", 1)[-1]: s["code"] for s in manifest(out)["skipped"]}
    assert skipped["changes"] == "IO_NOT_FOUND"


def test_verify_checks_the_skipped_list(tmp_path: Path) -> None:
    """A pack written under --on-error fail cannot list files left out for an error, and an
    input cannot be both a source and skipped."""
    src = docs_tree(tmp_path)
    out = tmp_path / "p"
    assert run_cli("ingest", "docs", str(src), "-o", str(out), "--on-error", "skip").code == 0
    path = out / "ingest_manifest.json"
    good = path.read_text()
    m = json.loads(good)
    m["options"]["on_error"] = "fail"
    path.write_text(json.dumps(m))
    assert "PACK_MANIFEST" in codes_of(out)
    m = json.loads(good)
    m["skipped"][0]["ordinal"] = m["sources"][0]["ordinal"]
    path.write_text(json.dumps(m))
    assert "PACK_MANIFEST" in codes_of(out)
    m = json.loads(good)
    m["skipped"][0]["code"] = 7
    path.write_text(json.dumps(m))
    assert "PACK_MANIFEST" in codes_of(out)
    path.write_text(good)
    assert codes_of(out) == set()


# Kinds by content, names as hints -------------------------------------------------------------


def records(n: int, first: int = 0) -> list[dict]:
    out = [{"id": i, "text": f"Record {i}: the quick brown fox {i * 7} jumps."} for i in range(n)]
    if first:
        out[0]["text"] = "long first record " * (first // 18)
    return out


def write_jsonl(path: Path, rows: list[dict], blank: bool = False) -> Path:
    lines = [json.dumps(r, ensure_ascii=False) for r in rows]
    if blank:
        lines.insert(2, "")
        lines.insert(4, "   \t ")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def ingest_ok(tmp_path: Path, *args: str, name: str = "p", stdin: bytes = b"") -> Path:
    out = tmp_path / name
    run = run_cli("ingest", "docs", *args, "-o", str(out), stdin=stdin)
    assert run.code == 0, run.stderr
    return out


def fail(tmp_path: Path, *args: str, stdin: bytes = b"") -> str:
    """Run an ingest that must fail: exit 1 or 2, one error line, no pack, no temporary."""
    before = sorted(os.listdir(tmp_path))
    run = run_cli("ingest", "docs", *args, "-o", str(tmp_path / "failed"), stdin=stdin)
    assert run.code in (1, 2), run.stderr
    assert "Traceback" not in run.stderr
    assert len([ln for ln in run.stderr.splitlines() if "error[" in ln]) == 1, run.stderr
    assert sorted(os.listdir(tmp_path)) == before
    return run.stderr


@pytest.mark.parametrize("name", ["big.jsonl", "big"])
def test_a_long_first_record_is_read_whole_before_deciding(tmp_path: Path, name: str) -> None:
    """Decision: one complete first record decides JSON Lines, however long (up to
    --max-doc-size); the 8 KiB sniff window no longer cuts it."""
    src = write_jsonl(tmp_path / name, records(20, first=20_000))
    pack = ingest_ok(tmp_path, str(src))
    m = manifest(pack)
    assert m["sources"][0]["kind"] == "jsonl" and m["documents"] == 20


def test_a_file_that_contradicts_its_name_is_named_with_line_and_offset(tmp_path: Path) -> None:
    pretty = tmp_path / "pretty.jsonl"
    pretty.write_text('{\n  "text": "a"\n}\n')
    err = fail(tmp_path, str(pretty))
    assert "INGEST_JSON" in err and "pretty.jsonl" in err and "line 1" in err and "offset" in err
    lines = write_jsonl(tmp_path / "lines.json", records(3))
    err = fail(tmp_path, str(lines))
    assert "INGEST_JSON" in err and "line 2" in err and "offset" in err and ".jsonl" in err


def test_blank_and_whitespace_lines_in_json_lines_are_skipped(tmp_path: Path) -> None:
    """Decision: blank and white-space-only lines of JSON Lines are not records: skipped, not
    counted; the line numbers of the records (their index items) stay those of the file."""
    import numpy as np

    from matrixctl.formats import doc_index

    src = write_jsonl(tmp_path / "b.jsonl", records(5), blank=True)
    pack = ingest_ok(tmp_path, str(src))
    idx = (pack / "doc_index.bin").read_bytes()
    items = doc_index.records_view(idx, doc_index.IndexHeader.parse(idx))["item"]
    assert np.asarray(items).tolist() == [1, 2, 4, 6, 7]
    assert manifest(pack)["sources"][0]["skipped_records"] == 0


# Compressed inputs ----------------------------------------------------------------------------


def compress(kind: str, data: bytes, members: int = 1) -> bytes:
    import bz2
    import gzip
    import lzma

    import zstandard

    cut = [data[i * len(data) // members : (i + 1) * len(data) // members] for i in range(members)]
    if kind == "gzip":
        return b"".join(gzip.compress(c, mtime=0) for c in cut)
    if kind == "zstd":  # frames alternately with and without a content size
        return b"".join(
            zstandard.ZstdCompressor(write_content_size=n % 2 == 0).compress(c)
            for n, c in enumerate(cut)
        )
    if kind == "xz":
        return b"".join(lzma.compress(c) for c in cut)
    return b"".join(bz2.compress(c) for c in cut)


EXT = {"gzip": ".gz", "zstd": ".zst", "xz": ".xz", "bz2": ".bz2"}


@pytest.mark.parametrize("kind", ["gzip", "zstd", "xz", "bz2"])
@pytest.mark.parametrize("members", [1, 3])
def test_compressed_inputs_give_the_plain_file_tokens(
    tmp_path: Path, kind: str, members: int
) -> None:
    """Decision: compression is recognised by magic bytes; every member/frame/stream is read;
    the manifest's sha256 and bytes are of the file as stored, with `compression` and
    `decompressed_bytes` beside them."""
    import hashlib

    plain = write_jsonl(tmp_path / "c.jsonl", records(300))
    ref = ingest_ok(tmp_path, str(plain), name="ref")
    stored = compress(kind, plain.read_bytes(), members)
    packed = tmp_path / ("c.jsonl" + EXT[kind])
    packed.write_bytes(stored)
    pack = ingest_ok(tmp_path, str(packed))
    for art in ("matrix_atoms.bin", "doc_index.bin"):
        assert (pack / art).read_bytes() == (ref / art).read_bytes()
    src = manifest(pack)["sources"][0]
    assert src["sha256"] == "sha256:" + hashlib.sha256(stored).hexdigest()
    assert src["bytes"] == len(stored) and src["compression"] == kind
    assert src["decompressed_bytes"] == plain.stat().st_size and src["kind"] == "jsonl"
    assert codes_of(pack) == set()


def test_gzip_without_isal_falls_back_to_zlib_ng(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    plain = write_jsonl(tmp_path / "c.jsonl", records(200))
    (tmp_path / "c.jsonl.gz").write_bytes(compress("gzip", plain.read_bytes(), 2))
    fast = ingest_ok(tmp_path, str(tmp_path / "c.jsonl.gz"), name="fast")
    monkeypatch.setitem(sys.modules, "isal", None)
    slow = ingest_ok(tmp_path, str(tmp_path / "c.jsonl.gz"), name="slow")
    assert tree_bytes(fast) == tree_bytes(slow)


@pytest.mark.parametrize("kind", ["gzip", "zstd", "xz", "bz2"])
def test_truncated_and_damaged_streams_are_one_error(tmp_path: Path, kind: str) -> None:
    plain = write_jsonl(tmp_path / "c.jsonl", records(2000)).read_bytes()
    stored = compress(kind, plain)
    (tmp_path / "t.gz").write_bytes(stored[: len(stored) * 2 // 3])
    err = fail(tmp_path, str(tmp_path / "t.gz"))
    assert "INGEST_COMPRESSED" in err and "truncated" in err
    damaged = bytearray(stored)
    damaged[len(stored) // 2] ^= 0xFF
    (tmp_path / "d.gz").write_bytes(bytes(damaged))
    err = fail(tmp_path, str(tmp_path / "d.gz"))
    assert "INGEST_" in err


def test_invalid_utf8_in_a_compressed_file_names_the_decompressed_offset(tmp_path: Path) -> None:
    (tmp_path / "u.jsonl.zst").write_bytes(
        compress("zstd", b'{"text": "fine"}\n{"text": "caf\xe9"}\n')
    )
    err = fail(tmp_path, str(tmp_path / "u.jsonl.zst"))
    assert "INGEST_UTF8" in err and "offset 30" in err and "zstd-decompressed stream" in err


def test_an_empty_compressed_file_writes_no_empty_pack(tmp_path: Path) -> None:
    """Decision: a run that yields no document at all fails (INGEST_NO_DOCUMENTS) instead of
    writing an empty pack; inside a folder an empty compressed file is a source with none."""
    (tmp_path / "e.jsonl.gz").write_bytes(compress("gzip", b""))
    err = fail(tmp_path, str(tmp_path / "e.jsonl.gz"))
    assert "INGEST_NO_DOCUMENTS" in err
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "e.txt.gz").write_bytes(compress("gzip", b""))
    (folder / "a.txt").write_text("words here\n")
    pack = ingest_ok(tmp_path, str(folder))
    assert [s["documents"] for s in manifest(pack)["sources"]] == [1, 0]


def test_a_zstd_bomb_stays_bounded_in_memory(tmp_path: Path) -> None:
    """A 1 GiB single line compressed to a few KiB: --max-doc-size stops it, memory bounded."""
    import subprocess
    import sys

    import zstandard

    bomb = tmp_path / "bomb.jsonl.zst"
    with open(bomb, "wb") as fp, zstandard.ZstdCompressor().stream_writer(fp) as w:
        w.write(b'{"text": "')
        block = b"a" * (1 << 20)
        for _ in range(1024):
            w.write(block)
    assert bomb.stat().st_size < 1 << 20
    # The peak is measured by a fresh parent of its own: RUSAGE_CHILDREN of this test process
    # would be the largest of every child any earlier test in this worker waited for.
    measure = (
        "import resource, subprocess, sys\n"
        "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "sys.stderr.write(p.stderr)\n"
        "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    )
    cmd = [
        sys.executable,
        "-m",
        "matrixctl",
        "ingest",
        "docs",
        str(bomb),
        "-o",
        str(tmp_path / "p"),
    ]
    proc = subprocess.run(
        [sys.executable, "-c", measure, *cmd], capture_output=True, text=True, check=False
    )
    code, peak_kib = (int(v) for v in proc.stdout.split())
    assert code == 1 and "INGEST_TOO_LARGE" in proc.stderr, proc.stderr
    peak_mb = peak_kib / 1024
    assert peak_mb < 600, peak_mb  # the default limit (a 256 MiB line), then the error
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "matrixctl",
            "ingest",
            "docs",
            str(bomb),
            "-o",
            str(tmp_path / "p"),
            "--max-doc-size",
            "1M",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1 and "INGEST_TOO_LARGE" in proc.stderr
    assert not (tmp_path / "p").exists()


def test_max_doc_size_is_an_error_or_a_counted_skip(tmp_path: Path) -> None:
    """Decision: a document over --max-doc-size is INGEST_TOO_LARGE for its file; --on-error
    skip leaves the file out and lists it."""
    src = tmp_path / "s"
    src.mkdir()
    write_jsonl(src / "big.jsonl", records(3, first=5000))
    write_jsonl(src / "small.jsonl", records(3))
    err = fail(tmp_path, str(src), "--max-doc-size", "4K")
    assert "INGEST_TOO_LARGE" in err and "line 1" in err
    pack = ingest_ok(tmp_path, str(src), "--max-doc-size", "4K", "--on-error", "skip")
    m = manifest(pack)
    assert [s["code"] for s in m["skipped"]] == ["INGEST_TOO_LARGE"]
    assert m["options"]["max_doc_size"] == 4096
    assert (
        run_cli("ingest", "docs", str(src), "-o", str(tmp_path / "x"), "--max-doc-size", "0").code
        == 2
    )


# Folders --------------------------------------------------------------------------------------


def test_folders_list_non_documents_and_strict_refuses_them(tmp_path: Path) -> None:
    """Decision: a binary file in a folder (after decompression too) is listed under skipped and
    named in the report; --strict makes it an error; hidden files and folders are never read."""
    src = tmp_path / "tree"
    (src / ".git").mkdir(parents=True)
    (src / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (src / ".hidden.txt").write_text("secret\n")
    (src / "a.txt").write_text("a document\n")
    (src / "b.txt.gz").write_bytes(compress("gzip", b"compressed document\n"))
    (src / "blob.bin.gz").write_bytes(compress("gzip", b"\x00\x01\x02" * 100))
    (src / "raw.bin").write_bytes(b"\x00" * 64)
    out = tmp_path / "p"
    run = run_cli("ingest", "docs", str(src), "-o", str(out))
    assert run.code == 0, run.stderr
    assert "blob.bin.gz: binary" in run.stderr and "raw.bin: binary" in run.stderr
    m = manifest(out)
    assert [s["path"].rsplit("/", 1)[-1] for s in m["sources"]] == ["a.txt", "b.txt.gz"]
    assert sorted(s["path"].rsplit("/", 1)[-1] for s in m["skipped"]) == ["blob.bin.gz", "raw.bin"]
    assert not any(
        ".git" in s["path"] or "hidden" in s["path"] for s in m["sources"] + m["skipped"]
    )
    err = fail(tmp_path, str(src), "--strict")
    assert "INGEST_BINARY" in err and "after gzip decompression" in err


# stdin ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [None, "gzip", "zstd"])
def test_stdin_is_one_stream_compressed_or_not(tmp_path: Path, kind: str | None) -> None:
    plain = write_jsonl(tmp_path / "c.jsonl", records(50)).read_bytes()
    ref = ingest_ok(tmp_path, str(tmp_path / "c.jsonl"), name="ref")
    data = plain if kind is None else compress(kind, plain)
    pack = ingest_ok(tmp_path, "-", stdin=data)
    assert (pack / "matrix_atoms.bin").read_bytes() == (ref / "matrix_atoms.bin").read_bytes()
    src = manifest(pack)["sources"][0]
    assert src["path"] == "-" and src["compression"] == kind and src["bytes"] == len(data)


def test_stdin_input_kind_and_usage(tmp_path: Path) -> None:
    text = b'{"text": "not json lines, a text"}\n'
    pack = ingest_ok(tmp_path, "-", "--input-kind", "text", stdin=text)
    assert manifest(pack)["sources"][0]["kind"] == "text"
    assert "USAGE" in fail(tmp_path, "-", "-", stdin=text)
    assert "INGEST_COLUMNAR" in fail(tmp_path, "-", "--input-kind", "parquet", stdin=text)


def test_progress_moves_within_one_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:

    monkeypatch.setattr(kinds_base, "PIECE", 4096)
    src = tmp_path / "one.txt"
    src.write_text("words and more words\n" * 20_000)
    ticks: list[tuple[int, int, int]] = []
    docs.ingest_docs(
        [str(src)], str(tmp_path / "p"), docs.IngestOptions(), tick=lambda *a: ticks.append(a)
    )
    before_done = [b for f, b, _ in ticks if f == 0]
    assert len(set(before_done)) > 10 and max(before_done) == src.stat().st_size


# Parquet and Arrow ----------------------------------------------------------------------------


def parquet_rows(n: int) -> list[dict]:
    rows = records(n)
    rows[3]["text"] = None  # a null cell: skipped and counted
    return rows


def write_parquet(path: Path, rows: list[dict], group: int, nested: bool = False) -> Path:
    import pyarrow
    from pyarrow import parquet

    if nested:
        table = pyarrow.table(
            {"id": [r["id"] for r in rows], "doc": [{"body": r["text"]} for r in rows]}
        )
    else:
        table = pyarrow.table({"id": [r["id"] for r in rows], "text": [r["text"] for r in rows]})
    parquet.write_table(table, path, row_group_size=group)
    return path


@pytest.mark.parametrize("group", [1, 7, 1000])
def test_parquet_rows_are_documents_whatever_the_row_groups(tmp_path: Path, group: int) -> None:
    """Decision: each row is a document, its item its row number; a null or non-string cell is
    skipped and counted like a JSON record without the field; row groups never matter."""
    rows = parquet_rows(40)
    jsonl = write_jsonl(tmp_path / "r.jsonl", rows)
    ref = ingest_ok(tmp_path, str(jsonl), name="ref")
    pq_path = write_parquet(tmp_path / "r.parquet", rows, group)
    pack = ingest_ok(tmp_path, str(pq_path))
    assert (pack / "matrix_atoms.bin").read_bytes() == (ref / "matrix_atoms.bin").read_bytes()
    src = manifest(pack)["sources"][0]
    assert src["kind"] == "parquet" and src["documents"] == 39 and src["skipped_records"] == 1
    assert codes_of(pack) == set()
    err = fail(tmp_path, str(pq_path), "--missing-field", "error")
    assert "INGEST_TEXT_FIELD" in err and "row 3" in err


def test_a_folder_of_parquet_shards_and_nested_fields(tmp_path: Path) -> None:
    rows = parquet_rows(30)
    data = tmp_path / "ds" / "data"
    data.mkdir(parents=True)
    for i in range(3):
        write_parquet(data / f"train-{i:05}-of-00003.parquet", rows[i * 10 : i * 10 + 10], 4, True)
    pack = ingest_ok(tmp_path, str(tmp_path / "ds"), "--text-field", "doc.body")
    m = manifest(pack)
    assert [s["documents"] for s in m["sources"]] == [9, 10, 10]
    ref = ingest_ok(tmp_path, str(write_jsonl(tmp_path / "r.jsonl", rows)), name="ref")
    assert (pack / "matrix_atoms.bin").read_bytes() == (ref / "matrix_atoms.bin").read_bytes()


@pytest.mark.parametrize("layout", ["file", "stream"])
def test_arrow_ipc_files_and_streams(tmp_path: Path, layout: str) -> None:
    import pyarrow

    rows = parquet_rows(25)
    table = pyarrow.table({"text": [r["text"] for r in rows]})
    path = tmp_path / "data-00000-of-00001.arrow"
    opener = pyarrow.ipc.new_file if layout == "file" else pyarrow.ipc.new_stream
    with opener(str(path), table.schema) as writer:
        writer.write_table(table, max_chunksize=6)
    pack = ingest_ok(tmp_path, str(path))
    ref = ingest_ok(tmp_path, str(write_jsonl(tmp_path / "r.jsonl", rows)), name="ref")
    assert (pack / "matrix_atoms.bin").read_bytes() == (ref / "matrix_atoms.bin").read_bytes()
    assert manifest(pack)["sources"][0]["kind"] == "arrow"


def test_hostile_parquet_is_one_error(tmp_path: Path) -> None:
    good = write_parquet(tmp_path / "g.parquet", parquet_rows(50), 10).read_bytes()
    (tmp_path / "footer.parquet").write_bytes(good[:-12] + b"\xff" * 8 + good[-4:])
    assert "INGEST_COLUMNAR" in fail(tmp_path, str(tmp_path / "footer.parquet"))
    (tmp_path / "cut.parquet").write_bytes(good[: len(good) // 2])
    assert "INGEST_COLUMNAR" in fail(tmp_path, str(tmp_path / "cut.parquet"))
    err = fail(tmp_path, str(tmp_path / "g.parquet"), "--text-field", "body")
    assert "INGEST_TEXT_FIELD" in err and "no column 'body'" in err and "id, text" in err


def test_parquet_without_pyarrow_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    path = write_parquet(tmp_path / "g.parquet", parquet_rows(5), 10)
    for mod in ("pyarrow", "pyarrow.parquet", "pyarrow.ipc"):
        monkeypatch.setitem(sys.modules, mod, None)
    err = fail(tmp_path, str(path))
    assert "INGEST_COLUMNAR" in err and "pip install 'matrixctl[parquet]'" in err


# One big file on every core -------------------------------------------------------------------


@pytest.fixture
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pieces of ~2 KiB and files cut from 4 KiB on, so small test files are cut."""
    monkeypatch.setattr(units, "PIECE_BYTES", 2048)
    monkeypatch.setattr(units, "SPLIT_MIN", 4096)


@pytest.mark.usefixtures("small_pieces")
@pytest.mark.parametrize("compressed", [False, True])
def test_one_jsonl_file_is_cut_into_pieces_with_the_same_bytes(
    tmp_path: Path, compressed: bool
) -> None:
    """Decision: a large JSON Lines file is cut at line ends into pieces that every worker
    takes; the pack is byte-identical for any --jobs (and to --jobs 1, which does not cut)."""
    rows = records(400)
    rows[17]["text"] = "x" * 9000  # a line longer than a piece
    path = write_jsonl(tmp_path / "one.jsonl", rows, blank=True)
    if compressed:
        data = compress("zstd", path.read_bytes(), 3)
        path = tmp_path / "one.jsonl.zst"
        path.write_bytes(data)
    packs = [
        tree_bytes(ingest_ok(tmp_path, str(path), "-j", jobs, name=f"p{jobs}"))
        for jobs in ("1", "2", "3")
    ]
    assert packs[0] == packs[1] == packs[2]
    whole = ingest_ok(tmp_path, str(path), "--on-error", "skip", name="whole")  # never cut
    for art in ("matrix_atoms.bin", "doc_index.bin"):
        assert (whole / art).read_bytes() == packs[0][art]
    stdin = ingest_ok(tmp_path, "-", "-j", "2", name="stdin", stdin=path.read_bytes())
    assert (stdin / "matrix_atoms.bin").read_bytes() == packs[0]["matrix_atoms.bin"]


@pytest.mark.usefixtures("small_pieces")
def test_pieces_are_stable_self_contained_and_checkable(tmp_path: Path) -> None:
    import hashlib

    from matrixctl.ingest.sources import SourceFile

    path = write_jsonl(tmp_path / "one.jsonl", records(300))
    data = path.read_bytes()
    sf = SourceFile(0, str(path), "one.jsonl", len(data), True)
    cutting = units.Cutting(keep_stored=True)  # the serial executor's: pieces with bytes

    def cut() -> list[tuple[units.Piece, bytes]]:  # a piece's bytes are valid until the next
        split = units.split_file(sf, kinds_base.Options(), cutting, None)
        return [(p, bytes(memoryview(p.data)[: p.data_size])) for p in split if p is not None]

    cuts = cut()
    pieces = [p for p, _ in cuts]
    assert len(pieces) > 5 and [p.id for p in pieces] == [p.id for p, _ in cut()]
    assert b"".join(b for _, b in cuts) == data
    for n, (p, got) in enumerate(cuts):
        start, end = (int(x) for x in p.id.split(":")[1].split("-"))
        assert data[start:end] == got and got.endswith(b"\n") and p.index == n
        assert p.first_line == -1  # a file as stored: lines counted by the worker
    assert pieces[-1].last and not any(p.last for p in pieces[:-1])
    assert pieces[-1].file_sha256 == "sha256:" + hashlib.sha256(data).hexdigest()


@pytest.mark.usefixtures("small_pieces")
def test_an_error_in_a_later_piece_names_the_file_line_and_offset(tmp_path: Path) -> None:
    rows = [json.dumps(r) for r in records(300)]
    rows[250] = "{broken"
    path = tmp_path / "one.jsonl"
    path.write_text("\n".join(rows) + "\n")
    offset = len(("\n".join(rows[:250]) + "\n").encode())
    for jobs in ("1", "2"):
        err = fail(tmp_path, str(path), "-j", jobs)
        assert "INGEST_JSON" in err and "line 251" in err and f"offset {offset + 1} " in err


@pytest.mark.usefixtures("small_pieces")
def test_one_parquet_file_is_cut_by_row_groups_with_the_same_bytes(tmp_path: Path) -> None:
    rows = parquet_rows(600)
    path = write_parquet(tmp_path / "one.parquet", rows, 40)
    assert path.stat().st_size >= 4096
    from matrixctl.ingest.kinds import columnar

    assert len(columnar.row_group_pieces(str(path), "one.parquet", 2048)) > 3
    packs = [
        tree_bytes(ingest_ok(tmp_path, str(path), "-j", jobs, name=f"p{jobs}"))
        for jobs in ("1", "2", "3")
    ]
    assert packs[0] == packs[1] == packs[2]
    assert codes_of(tmp_path / "p2") == set()
    whole = ingest_ok(tmp_path, str(path), "--on-error", "skip", name="whole")  # never cut
    for art in ("matrix_atoms.bin", "doc_index.bin"):
        assert (whole / art).read_bytes() == packs[0][art]


def text_corpus(paragraphs: int) -> str:
    """Paragraphs of words, separated by runs of 1 to 3 line feeds (the bundled map has a
    symbol for two line feeds), with CRLF, indented and non-ASCII lines here and there."""
    import random

    rng = random.Random(13)
    words = [
        "the",
        "of",
        "and",
        "to",
        "in",
        "is",
        "that",
        "for",
        "it",
        "as",
        "was",
        "with",
        "café",
        "naïve",
        "über",
        "two",
        "may",
    ]
    out = ["\ufeff"]
    for i in range(paragraphs):
        out.append(" ".join(rng.choice(words) for _ in range(rng.randint(3, 40))))
        out.append(rng.choice(["\n", "\n\n", "\n\n\n", "\r\n", "\r\n\r\n"]))
        if i % 7 == 0:
            out.append("  indented line\n")
        if i % 11 == 0:
            out.append("\u0301accent first\n\u00e9t\u00e9\n")
    return "".join(out)


@pytest.fixture
def text_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pieces of 64 KiB, files cut from 128 KiB on: a few-MB text file becomes many pieces."""
    monkeypatch.setattr(units, "PIECE_BYTES", 64 << 10)
    monkeypatch.setattr(units, "SPLIT_MIN", 128 << 10)


@pytest.mark.usefixtures("text_pieces")
def test_a_large_text_file_is_cut_into_pieces_with_the_same_bytes(tmp_path: Path) -> None:
    """Decision (docs/inputs.md, "Plain text in pieces"): a plain text file is one document,
    cut for --jobs N only right after a line feed and before an ASCII byte that no symbol has
    after a line feed (not between two line feeds with the bundled map's "\\n\\n"
    symbol): the greedy tiling has a token boundary there and normalization cannot reach
    across it, so the pack is byte-identical to --jobs 1 (which reads the file whole)."""
    from matrixctl.ingest.sources import SourceFile
    from matrixctl.tokenizers import pi

    path = tmp_path / "book.txt"
    path.write_bytes(text_corpus(60_000).encode("utf-8"))
    assert path.stat().st_size > 2 << 20
    data = path.read_bytes()
    smap = pi.load_symbol_map(pi.default_map_path())[0]
    followers = PiIngest(pi.Tokenizer(smap), smap).cut_followers
    sf = SourceFile(0, str(path), "book.txt", len(data), True)
    pieces = list(units.split_file(sf, kinds_base.Options(), units.Cutting(), followers))
    assert len(pieces) > 20 and all(p is not None and p.kind == "text" for p in pieces)
    cuts = [p.start for p in pieces[1:] if p is not None]
    assert all(data[c - 1] == 10 and data[c] < 0x80 and data[c] not in b"\r\n" for c in cuts)
    packs = [
        tree_bytes(ingest_ok(tmp_path, str(path), "-j", jobs, name=f"p{jobs}"))
        for jobs in ("1", "2")
    ]
    assert packs[0] == packs[1]
    m = manifest(tmp_path / "p2")
    assert m["documents"] == 1 and m["sources"][0]["documents"] == 1
    assert codes_of(tmp_path / "p2") == set()


def test_text_is_never_cut_where_each_document_gets_a_prefix(tmp_path: Path) -> None:
    """Decision: with a map whose space marking adds a space before each document
    (sentencepiece prefix_space, wordpiece) or under --encoding-errors skip-file, a text
    file is one work unit: a piece would start a new document's prefix or word."""
    from matrixctl.tokenizers import pi

    base = json.loads(Path(pi.default_map_path()).read_bytes())
    for marking, expect_cut in (
        (None, True),
        ({"scheme": "sentencepiece", "prefix_space": True}, False),
        ({"scheme": "sentencepiece", "prefix_space": False}, True),
        ({"scheme": "wordpiece", "continuation": "##"}, False),
    ):
        doc = dict(base)
        if marking is not None:
            doc["space_marking"] = marking
        smap = pi.check_map_bytes(json.dumps(doc).encode(), "m.json")
        followers = PiIngest(pi.Tokenizer(smap), smap).cut_followers()
        assert (followers is not None) is expect_cut, marking
    # --encoding-errors skip-file: a file must be skipped whole, so it is never cut.
    from matrixctl.ingest.executors import plan
    from matrixctl.ingest.sources import SourceFile
    from matrixctl.ingest.step import Step

    big = tmp_path / "big.txt"
    big.write_text("words\n" * 4096, encoding="utf-8")
    sf = SourceFile(0, str(big), "big.txt", units.SPLIT_MIN, True)  # as large as cut files
    smap = pi.load_symbol_map(pi.default_map_path())[0]
    tok = PiIngest(pi.Tokenizer(smap), smap)
    cutting = units.Cutting(piece_bytes=1024)
    for encoding, cut in (("error", True), ("skip-file", False)):
        step = Step(tok, None, kinds_base.Options(encoding_errors=encoding), str(tmp_path))
        work = list(plan([sf], step, 1, cutting))
        assert any(isinstance(u, units.Piece) for u in work) is cut, encoding


@pytest.mark.usefixtures("text_pieces")
def test_bad_utf8_in_a_later_text_piece_names_the_file_offset(tmp_path: Path) -> None:
    data = bytearray(text_corpus(20_000).encode("utf-8"))
    bad = data.rfind(b" the ", 0, len(data) - 1000) + 1  # an ASCII byte after an ASCII byte
    data[bad] = 0xFF
    path = tmp_path / "book.txt"
    path.write_bytes(bytes(data))
    for jobs in ("1", "2"):
        err = fail(tmp_path, str(path), "-j", jobs)
        assert "INGEST_UTF8" in err and f"offset {bad} " in err, err


def test_a_file_that_shrinks_under_a_worker_is_one_error(tmp_path: Path) -> None:
    """Decision: a worker that finds fewer bytes than the range the main process cut (the
    file was cut short meanwhile) stops the ingest with INGEST_CHANGED, naming the offset."""
    from matrixctl.errors import InputError
    from matrixctl.ingest.sources import SourceFile

    path = tmp_path / "one.jsonl"
    path.write_bytes(b'{"text": "a"}\n' * 100)
    sf = SourceFile(0, str(path), "one.jsonl", 1400, True)
    assert units.read_range(sf, 14, 28) == b'{"text": "a"}\n' * 2
    with pytest.raises(InputError) as caught:
        units.read_range(sf, 1386, 28)
    assert caught.value.code == "INGEST_CHANGED" and caught.value.offset == 1386


def _ticks(tmp_path: Path, src: Path, jobs: int, name: str) -> list[tuple[int, int, int]]:
    ticks: list[tuple[int, int, int]] = []
    docs.ingest_docs(
        [str(src)],
        str(tmp_path / name),
        docs.IngestOptions(jobs=jobs),
        tick=lambda *a: ticks.append(a),
    )
    return ticks


@pytest.mark.usefixtures("text_pieces")
@pytest.mark.parametrize("kind", ["jsonl", "jsonl.gz", "text", "markdown", "parquet"])
@pytest.mark.parametrize("jobs", [1, 2])
def test_progress_advances_by_bytes_within_one_file(tmp_path: Path, kind: str, jobs: int) -> None:
    """The progress callback hears the bytes read inside a file before the file is done, for
    every input kind that can be large, with --jobs 1 (as read) and --jobs 2 (as each piece
    is written; a Parquet file by the row groups' ends in the footer)."""
    import gzip
    import random

    rng = random.Random(5)  # text that does not compress away (the .gz is cut in pieces too)
    rows = [{"text": f"paragraph {i} " + rng.randbytes(200).hex()} for i in range(3000)]
    if kind.startswith("jsonl"):
        src = write_jsonl(tmp_path / "in.jsonl", rows)
        if kind == "jsonl.gz":
            data = gzip.compress(src.read_bytes(), mtime=0)
            src = tmp_path / "in.jsonl.gz"
            src.write_bytes(data)
    elif kind == "parquet":
        src = write_parquet(
            tmp_path / "in.parquet", [{"id": i, **r} for i, r in enumerate(rows)], 100
        )
    else:
        src = tmp_path / ("in.txt" if kind == "text" else "in.md")
        src.write_text(text_corpus(20_000))
    if kind == "markdown" and jobs == 2:
        pytest.skip("Markdown is one work unit (its state runs through the file): no pieces")
    size = src.stat().st_size
    ticks = _ticks(tmp_path, src, jobs, "p")
    before_done = [b for f, b, _ in ticks if f == 0]
    assert len(set(before_done)) >= 3, (kind, jobs, ticks[:5])
    assert all(0 < b <= size for b in before_done if b) and ticks[-1][:2] == (1, size), ticks
    assert [b for _, b, _ in ticks] == sorted(b for _, b, _ in ticks)


# Seeded mutations -----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(int(os.environ.get("MUTATION_SEEDS", "6"))))
def test_mutated_compressed_and_parquet_inputs_never_crash(tmp_path: Path, seed: int) -> None:
    """Bit flips and cuts of gzip, zstd, xz, bzip2 and Parquet inputs: exit 0, 1 or 2 with at
    most one error line, never an internal error, a traceback or a partial pack."""
    import random

    rng = random.Random(seed)
    plain = write_jsonl(tmp_path / "c.jsonl", records(60)).read_bytes()
    samples = {f"m{EXT[k]}": compress(k, plain, 2) for k in EXT}
    samples["m.parquet"] = write_parquet(tmp_path / "g.parquet", parquet_rows(60), 9).read_bytes()
    for name, data in samples.items():
        buf = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
        if rng.random() < 0.3:
            del buf[rng.randrange(len(buf)) :]
        path = tmp_path / name
        path.write_bytes(bytes(buf))
        out = tmp_path / f"out-{name}"
        run = run_cli("ingest", "docs", str(path), "-o", str(out))
        assert run.code in (0, 1, 2), (name, run.code, run.stderr)
        assert "Traceback" not in run.stderr and "INTERNAL" not in run.stderr
        if run.code:
            assert not out.exists() and run.stderr.count("error[") == 1


def test_verify_checks_the_compression_fields(tmp_path: Path) -> None:
    plain = write_jsonl(tmp_path / "c.jsonl", records(20)).read_bytes()
    (tmp_path / "c.jsonl.gz").write_bytes(compress("gzip", plain))
    pack = ingest_ok(tmp_path, str(tmp_path / "c.jsonl.gz"))
    path = pack / "ingest_manifest.json"
    good = path.read_text()
    assert codes_of(pack) == set()
    for comp, size in (("rar", 5), (None, 5), ("gzip", None), ("gzip", "5")):
        m = json.loads(good)
        m["sources"][0].update(compression=comp, decompressed_bytes=size)
        path.write_text(json.dumps(m))
        assert "PACK_MANIFEST" in codes_of(pack), (comp, size)


def test_text_field_paths_in_json_json_lines_and_parquet(tmp_path: Path) -> None:
    """Decision (kinds_base.field_value, columnar.Table): `--text-field a.b` is the key `b` of the
    object under `a` in JSON and JSON Lines, as it is the field `b` of the struct column `a` in
    Parquet; a key or column named exactly `a.b` wins; a path that is not there (or runs into
    something that is not an object) is a missing field: skipped and counted, or the error."""
    import pyarrow
    from pyarrow import parquet

    texts = [f"document {i} caf\u00e9" for i in range(6)]
    records = [{"meta": {"body": t}, "id": i} for i, t in enumerate(texts)]
    records[2] = {"meta": "not an object", "id": 2}  # the path runs into a string
    records[4] = {"meta.body": texts[4], "meta": {"body": "not this one"}}  # the exact key wins
    lines = "".join(json.dumps(r) + "\n" for r in records)
    (tmp_path / "n.jsonl").write_text(lines * 3000, encoding="utf-8")  # pieces, the kernel too
    (tmp_path / "n.json").write_text(json.dumps(records), encoding="utf-8")
    want = [t for i, t in enumerate(texts) if i != 2]
    ref = write_jsonl(tmp_path / "ref.jsonl", [{"text": t} for t in want] * 3000)
    one = write_jsonl(tmp_path / "one.jsonl", [{"text": t} for t in want])
    reference = ingest_ok(tmp_path, str(ref), name="ref")
    for name, copies, out in (("n.jsonl", 3000, "pl"), ("n.json", 1, "pj")):
        pack = ingest_ok(tmp_path, str(tmp_path / name), "--text-field", "meta.body", name=out)
        src = manifest(pack)["sources"][0]
        assert src["documents"] == 5 * copies and src["skipped_records"] == copies
        if copies > 1:
            assert (pack / "matrix_atoms.bin").read_bytes() == (
                reference / "matrix_atoms.bin"
            ).read_bytes()
    small_ref = ingest_ok(tmp_path, str(one), name="one")
    pj = tmp_path / "pj"
    assert (pj / "matrix_atoms.bin").read_bytes() == (small_ref / "matrix_atoms.bin").read_bytes()
    err = fail(
        tmp_path, str(tmp_path / "n.json"), "--text-field", "meta.body", "--missing-field", "error"
    )
    assert "INGEST_TEXT_FIELD" in err and "element 2" in err
    # Parquet: a column named "doc.body" is that column, not the path (a struct column "doc"
    # beside it would have the same dotted path in the Parquet schema, which is ambiguous
    # there whatever a reader does).
    table = pyarrow.table({"doc.body": want, "other": list(range(5))})
    parquet.write_table(table, tmp_path / "n.parquet")
    pack = ingest_ok(tmp_path, str(tmp_path / "n.parquet"), "--text-field", "doc.body", name="pq")
    assert (pack / "matrix_atoms.bin").read_bytes() == (small_ref / "matrix_atoms.bin").read_bytes()
