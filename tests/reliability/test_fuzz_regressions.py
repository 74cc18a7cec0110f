"""Every crash the fuzz harnesses found, kept as a file under tests/fuzz_regressions/ (named
FORMAT_WHAT.EXT): verify and inspect answer with exit 0, 1 or 2 and no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.cli import run_cli

FILES = sorted((Path(__file__).resolve().parents[1] / "fuzz_regressions").iterdir())


def test_the_npz_local_header_name_crash_is_kept() -> None:
    """The first crash found (atheris, fuzz_npz): a zip member whose local header name is not
    the UTF-8 it claims raised UnicodeDecodeError from zipfile (exit 70)."""
    assert any(f.name == "npz_local_name_not_utf8.npz" for f in FILES)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_fuzz_crash_files_give_one_clear_answer(path: Path) -> None:
    for args in (["verify", str(path)], ["inspect", str(path)]):
        res = run_cli(*args)
        assert res.code in (0, 1, 2), (args, res.code, res.stderr)
        assert "Traceback" not in res.stderr and "INTERNAL" not in res.stderr


INGESTED = [f for f in FILES if f.name.startswith(("columnar_", "decompress_"))]


def test_the_arrow_crashes_are_kept() -> None:
    """fuzz_columnar_arrow (atheris): string offsets past the data made pyarrow's to_pylist
    raise SystemError; a column name that is not UTF-8 raised UnicodeDecodeError."""
    names = {f.name for f in INGESTED}
    assert {"columnar_arrow_string_offsets.arrow", "columnar_arrow_name_not_utf8.arrow"} <= names


@pytest.mark.parametrize("path", INGESTED, ids=lambda p: p.name)
def test_ingest_crash_files_give_one_clear_error(path: Path, tmp_path: Path) -> None:
    """The inputs of `ingest docs` the harnesses found: one error line, nothing written."""
    pytest.importorskip("pyarrow")
    res = run_cli("ingest", "docs", str(path), "-o", str(tmp_path / "pack"))
    assert res.code in (1, 2), res.stderr
    assert "error[INGEST_" in res.stderr and res.stderr.count("error[") == 1, res.stderr
    assert "Traceback" not in res.stderr and "INTERNAL" not in res.stderr
    assert not (tmp_path / "pack").exists()
