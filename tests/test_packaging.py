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
    for name in ("pyproject.toml", "README.md", "setup.py"):  # setup.py builds the C kernel
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(
        ROOT / "matrixctl", src / "matrixctl", ignore=shutil.ignore_patterns("__pycache__", "*.so")
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


def test_the_wheel_carries_the_compiled_pi_kernel(tmp_path: Path) -> None:
    """`pip install`/`pip wheel` compiles matrixctl/_pi_kernel.c with the machine's compiler
    (setup.py); the wheel holds the extension and its type stub, built from the source alone
    (no prebuilt .so copied along)."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "setup.py"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(
        ROOT / "matrixctl", src / "matrixctl", ignore=shutil.ignore_patterns("__pycache__", "*.so")
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-q",
            "-w",
            str(tmp_path / "w"),
            str(src),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = (tmp_path / "w").glob("matrixctl-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    assert any(n.startswith("matrixctl/_pi_kernel.") and n.endswith(".so") for n in names)
    assert "matrixctl/_pi_kernel.pyi" in names
    # The SCX kernel (matrixctl/_scx_kernel.c) is built the same way.
    assert any(n.startswith("matrixctl/_scx_kernel.") and n.endswith(".so") for n in names)
    assert "matrixctl/_scx_kernel.pyi" in names
