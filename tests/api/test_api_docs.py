"""The examples of docs/api.md run as doctests, in an empty folder holding one ingest pack."""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest

from tests.helpers.cli import FIXTURES, ROOT, run_cli


def test_docs_api_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    res = run_cli("ingest", "docs", str(FIXTURES / "corpus"), "-o", str(tmp_path / "pack"),
                  "--atom-size", "16")  # fmt: skip
    assert res.code == 0, res.stderr
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MATRIXCTL_SCX_TRUST", raising=False)
    result = doctest.testfile(
        str(ROOT / "docs" / "api.md"),
        module_relative=False,
        optionflags=doctest.ELLIPSIS,
        raise_on_error=False,
        verbose=False,
    )
    assert result.attempted >= 30
    assert result.failed == 0


def test_readme_python_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    import matrixctl

    text = (ROOT / "README.md").read_text()
    start = text.index("## From Python")
    block = text[text.index("```python\n", start) + 10 : text.index("```\n", start + 20)]
    assert len(block.strip().splitlines()) == 5
    res = run_cli("ingest", "docs", str(FIXTURES / "corpus"), "-o", str(tmp_path / "pack"))
    assert res.code == 0, res.stderr
    matrixctl.save(tmp_path / "weights.zt", {"w": np.ones((2, 2), np.float32)})
    monkeypatch.chdir(tmp_path)
    exec(compile(block, "README.md", "exec"), {})
    assert matrixctl.load("copy.safetensors")["w"].tolist() == [[1.0, 1.0], [1.0, 1.0]]
