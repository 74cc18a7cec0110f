"""Packaging: building the project prints no setuptools warning about its metadata, and the
wheel carries the compiled kernels."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers.cli import ROOT


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """One wheel built from a copy of the source (so the checkout gets no build/ or .egg-info
    folder, and no prebuilt .so is copied along): the build log and the wheel."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "setup.py"):  # setup.py builds the C kernels
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(
        ROOT / "matrixctl", src / "matrixctl", ignore=shutil.ignore_patterns("__pycache__", "*.so")
    )
    out = tmp / "w"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w", str(out), str(src)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = out.glob("matrixctl-*.whl")
    return proc.stdout + proc.stderr, wheel


def test_building_prints_no_license_warning_and_declares_an_spdx_licence(
    built: tuple[str, Path],
) -> None:
    """Decision: `license = "MIT"` (an SPDX expression, setuptools>=77 in build-system.requires),
    not the deprecated `{ text = ... }` table, so installing prints no warning about it."""
    log, wheel = built
    assert "project.license" not in log and "License classifiers are deprecated" not in log
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        lines = zf.read(meta).decode().splitlines()
    assert "License-Expression: MIT" in lines


def test_the_wheel_carries_the_compiled_kernels(built: tuple[str, Path]) -> None:
    """`pip install`/`pip wheel` compiles the C kernels (matrixctl/_*_kernel.c) with the
    machine's compiler (setup.py); the wheel holds each extension and its type stub."""
    _, wheel = built
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    kernels = sorted(p.stem for p in (ROOT / "matrixctl").glob("_*_kernel.c"))
    assert "_bpe_kernel" in kernels
    for kernel in kernels:
        assert any(n.startswith(f"matrixctl/{kernel}.") and n.endswith(".so") for n in names)
        assert f"matrixctl/{kernel}.pyi" in names
