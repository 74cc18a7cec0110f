"""Hostile inputs of `ingest docs`' input kinds (issue 32): JSON records Python cannot hold,
dictionary bombs in Parquet and Arrow, Markdown that made the regexes quadratic, damaged
page checksums, truncated Arrow streams, zstd skippable frames, gzip padding and the error
messages of odd columns and codecs."""

from __future__ import annotations

import json
from pathlib import Path

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
