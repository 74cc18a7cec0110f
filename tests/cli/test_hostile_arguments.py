"""Arguments that are not what an option expects are usage errors (exit 2, one line), never
INTERNAL: a `--meta` that is not UTF-8 (docs/reliability.md, "Arguments")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.cli import ROOT


@pytest.mark.parametrize("dest", ["out.gguf", "out.zt", "out.safetensors", "out.weights"])
@pytest.mark.parametrize("meta", [b"k=\xff\xfe", b"k\xff=value"])
def test_a_meta_that_is_not_utf8_is_a_usage_error(tmp_path: Path, dest: str, meta: bytes) -> None:
    """Linux hands Python such an argument with surrogate escapes, which no writer can encode:
    it ended with INTERNAL (UnicodeEncodeError, exit 70)."""
    npz = tmp_path / "a.npz"
    np.savez(npz, w=np.ones((2, 32), dtype=np.float32))
    args = [
        os.fsencode(sys.executable), b"-m", b"matrixctl", b"convert", os.fsencode(npz),
        os.fsencode(tmp_path / dest), b"--meta", meta,
    ]  # fmt: skip
    proc = subprocess.run(args, capture_output=True, check=False, cwd=ROOT, timeout=120)
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 2, err
    assert "error[USAGE]" in err and "--meta" in err and "not UTF-8" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / dest).exists()
