"""The `ingest docs` summary is exact: it counts the files and bytes actually ingested, the
files skipped (with their bytes) and why, the records skipped inside ingested files (no text
field), and the bytes read from stdin (issue 31)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.cli import run_cli


def inputs(folder: Path) -> tuple[int, int]:
    """8 good files and 4 that are not UTF-8; (count, bytes) of the good ones."""
    folder.mkdir()
    good = 0
    for i in range(7):
        good += (folder / f"t{i}.txt").write_bytes(f"hello world number {i}\n".encode())
    good += (folder / "r.jsonl").write_bytes(
        b'{"text": "a b"}\n{"other": "x"}\n{"text": "c"}\n{"nope": 1}\n{"other": 2}\n'
    )
    for i in range(4):
        (folder / f"bad{i}.txt").write_bytes(b"\xff\xfe not text " + bytes([i]) * i)
    return 8, good


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_the_summary_counts_what_was_ingested_and_what_was_skipped(
    tmp_path: Path, jobs: str
) -> None:
    count, nbytes = inputs(tmp_path / "src")
    done = run_cli(
        "ingest", "docs", "--json", str(tmp_path / "src"), "-o", str(tmp_path / "pack"),
        "--encoding-errors", "skip-file", "--jobs", jobs,
    )  # fmt: skip
    assert done.code == 0, done.stderr
    doc = done.json()
    assert doc["files"] == count and doc["bytes"] == nbytes
    assert doc["skipped"] == 4 and len(doc["skipped_files"]) == 4
    assert doc["skipped_bytes"] == sum(
        p.stat().st_size for p in (tmp_path / "src").glob("bad*.txt")
    )
    assert doc["skipped_records"] == 3  # records of r.jsonl without a "text" field


def test_the_terminal_lines_say_the_same(tmp_path: Path) -> None:
    count, nbytes = inputs(tmp_path / "src")
    done = run_cli(
        "ingest", "docs", str(tmp_path / "src"), "-o", str(tmp_path / "pack"),
        "--encoding-errors", "skip-file",
    )  # fmt: skip
    assert done.code == 0, done.stderr
    assert f"ingested {count:,} files ({nbytes:,} bytes)" in done.stderr
    assert "skipped 4 files" in done.stderr
    assert "skipped 3 records inside ingested files (no 'text' field" in done.stderr


def test_stdin_bytes_are_counted(tmp_path: Path) -> None:
    text = b"some text from a pipe, read once\n" * 3
    done = run_cli("ingest", "docs", "--json", "-", "-o", str(tmp_path / "pack"), stdin=text)
    assert done.code == 0, done.stderr
    assert done.json()["files"] == 1 and done.json()["bytes"] == len(text)
