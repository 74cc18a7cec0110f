"""CLI contract for the tensor commands: help text, generated docs, cheap start-up, inspect."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from tests.helpers.cli import ROOT, run_cli


def test_generated_docs_are_current() -> None:
    """docs/cli.md and docs/errors.md carry generated sections; they must match the code."""
    proc = subprocess.run(
        [sys.executable, "-m", "matrixctl.cli.docgen", "--check"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


def test_help_does_not_import_heavy_modules() -> None:
    code = (
        "import sys\n"
        "from matrixctl.cli.app import main\n"
        "main(['convert', '--help'])\n"
        "heavy = {'numpy', 'zstandard', 'cbor2', 'safetensors', 'ml_dtypes', 'google_crc32c'}\n"
        "print(sorted(heavy & set(sys.modules)))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout


def test_convert_help_names_every_option() -> None:
    result = run_cli("convert", "--help")
    assert result.code == 0
    for option in ("--select", "--dtype", "--compress", "--digest", "--densify", "--to"):
        assert option in result.out


def test_inspect_shows_the_tensor_table(tmp_path: Path) -> None:
    src = tmp_path / "m.npz"
    np.savez(src, w=np.ones((2, 3), np.float32))
    out = tmp_path / "m.zt"
    assert run_cli("convert", str(src), str(out), "--compress", "zstd").code == 0
    human = run_cli("inspect", str(out))
    assert human.code == 0 and human.stdout == b""
    for word in ("name", "layout", "dtype", "nbytes", "logical_bytes", "zstd", "crc32c"):
        assert word in human.stderr
    doc = run_cli("inspect", "--json", str(out)).json()["files"][0]
    row = doc["tensors"][0]
    extra = row["extra"]
    assert (row["name"], row["shape"], extra["logical_bytes"], extra["encoding"]) == (
        "w",
        [2, 3],
        24,
        "zstd",
    )


def test_verify_exit_codes_for_containers(tmp_path: Path) -> None:
    src = tmp_path / "m.npz"
    np.savez(src, w=np.ones(64, np.float32))
    good = tmp_path / "g.zt"
    assert run_cli("convert", str(src), str(good)).code == 0
    assert run_cli("verify", str(good)).code == 0
    bad = tmp_path / "b.zt"
    data = bytearray(good.read_bytes())
    data[80] ^= 4
    bad.write_bytes(bytes(data))
    result = run_cli("verify", "--json", str(bad))
    assert result.code == 1
    assert result.json()["files"][0]["findings"][0]["code"] == "ZT_DIGEST"
    assert run_cli("verify", str(tmp_path / "none.zt")).code == 2
