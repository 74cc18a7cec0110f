"""Packaging: building the project prints no setuptools warning about its metadata."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.conftest import ROOT


def test_building_prints_no_license_warning_and_declares_an_spdx_licence(tmp_path: Path) -> None:
    """Decision: `license = "MIT"` (an SPDX expression, setuptools>=77 in build-system.requires),
    not the deprecated `{ text = ... }` table, so installing prints no warning about it. The
    wheel is built from a copy, so the checkout gets no build/ or .egg-info folder."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(
        ROOT / "matrixctl", src / "matrixctl", ignore=shutil.ignore_patterns("__pycache__")
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-v",
            "-w",
            str(tmp_path / "w"),
            str(src),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    log = proc.stdout + proc.stderr
    assert "project.license" not in log and "License classifiers are deprecated" not in log
    (wheel,) = (tmp_path / "w").glob("matrixctl-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        lines = zf.read(meta).decode().splitlines()
    assert "License-Expression: MIT" in lines
