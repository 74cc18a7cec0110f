"""Start-up cost: `--help` and `inspect` of a small file must not import the heavy modules."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests import golden_bytes as gb
from tests.conftest import ROOT

HEAVY = (
    "numpy",
    "rich",
    "gguf",
    "safetensors",
    "cbor2",
    "zstandard",
    "blake3",
    "pyarrow",  # optional extras of ingest docs
    "isal",
    "dask",  # ingest docs --executor dask only
    "distributed",
)

PROBE = """
import sys
from matrixctl.cli.app import main
code = main(sys.argv[1:])
sys.stdout.flush()
heavy = sorted(m for m in {heavy!r} if m in sys.modules)
sys.stderr.write("LOADED:" + ",".join(heavy) + "\\n")
raise SystemExit(code)
"""


def loaded_after(*args: str) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE.format(heavy=HEAVY), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    line = [ln for ln in proc.stderr.splitlines() if ln.startswith("LOADED:")][-1]
    return [m for m in line[len("LOADED:") :].split(",") if m]


def test_help_imports_no_heavy_module() -> None:
    assert loaded_after("--help") == []
    assert loaded_after("pack", "atoms", "--help") == []
    assert loaded_after("ingest", "docs", "--help") == []


def test_inspect_json_of_a_small_atom_file_imports_no_heavy_module(tmp_path: Path) -> None:
    path = tmp_path / "a.bin"
    path.write_bytes(gb.MATRIX_ATOM)
    assert loaded_after("inspect", "--json", str(path)) == []
