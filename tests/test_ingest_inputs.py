"""ingest docs on the inputs people have: text trees with odd files, the per-file error policy,
compressed files, Parquet/Arrow, stdin, work units inside one file, size bounds."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from matrixctl.ingest import pipeline
from matrixctl.validate.engine import examine
from tests.conftest import run_cli


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
    (src / "latin1").write_bytes(b"caf\xe9 au lait\n")
    return src


# Part 1: names decide, one bad file never aborts the run ---------------------------------------


def test_markdown_and_text_names_are_never_parsed_as_json(tmp_path: Path) -> None:
    """Decision: .md/.txt files that start with `[` or `{` are Markdown/text, not JSON."""
    src = docs_tree(tmp_path)
    for name in ("broken.json", "latin1", "bash/README.abs-guide"):
        (src / name).unlink()
    run = run_cli("ingest", "docs", str(src), "-o", str(tmp_path / "p"), "--json")
    assert run.code == 0, run.stderr
    kinds = {s["path"].rsplit("/", 1)[-1]: s["kind"] for s in manifest(tmp_path / "p")["sources"]}
    assert kinds == {"README.md": "markdown", "changes": "text", "notes.txt": "text"}


def test_one_bad_file_fails_the_run_by_default(tmp_path: Path) -> None:
    src = docs_tree(tmp_path)
    run = run_cli("ingest", "docs", str(src), "-o", str(tmp_path / "p"))
    assert run.code == 1 and "INGEST_JSON" in run.stderr and "README.abs-guide" in run.stderr
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
    for name in ("README.abs-guide", "broken.json", "latin1"):
        assert f"/{name}: INGEST_" in run.stderr
    m = manifest(out)
    skipped = {s["path"].rsplit("/", 1)[-1]: s for s in m["skipped"]}
    assert {k: v["code"] for k, v in skipped.items()} == {
        "README.abs-guide": "INGEST_JSON",
        "broken.json": "INGEST_JSON",
        "latin1": "INGEST_UTF8",
    }
    assert "at byte 3" in skipped["latin1"]["reason"]
    assert all(isinstance(v["ordinal"], int) for v in skipped.values())
    assert m["options"]["on_error"] == "skip"
    assert len(m["sources"]) == 3
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
    real = pipeline.enumerate_sources

    def listing_then_delete(*args, **kwargs):  # type: ignore[no-untyped-def]
        out = real(*args, **kwargs)
        (src / "bash" / "changes").unlink()
        return out

    monkeypatch.setattr(pipeline, "enumerate_sources", listing_then_delete)
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
