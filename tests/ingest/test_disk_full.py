"""A full disk or a file size limit while `ingest docs` writes its pack is the output error
naming the pack, never `<stdout>` or an input (docs/reliability.md, "Full disks and size
limits"); nothing is left behind."""

from __future__ import annotations

import errno
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import ROOT, run_cli


def _corpus(root: Path) -> Path:
    src = root / "corpus"
    src.mkdir()
    for i in range(8):
        (src / f"d{i}.txt").write_text(f"alpha beta gamma delta {i} " * 20_000, encoding="utf-8")
    return src


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_file_size_limit_names_the_pack(tmp_path: Path, jobs: str) -> None:
    src = _corpus(tmp_path)
    out = tmp_path / "pack"

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 10, 256 << 10))

    proc = subprocess.run(
        [sys.executable, "-m", "matrixctl", "ingest", "docs", str(src), "-o", str(out), "-j", jobs],
        capture_output=True,
        preexec_fn=limit,
        check=False,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "MATRIXCTL_NO_FSYNC": "1"},
    )
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert f"error[OUT_TOO_LARGE]: {out}:" in err and "<stdout>" not in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus"]


@pytest.mark.parametrize("raised", ["bare", "named the input"])
def test_a_full_disk_met_while_an_input_is_read_names_the_pack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, raised: str
) -> None:
    """ENOSPC met while the serial executor reads an input and writes its tokens through:
    a bare write error (no file name: `<stdout>` before), or one translated where the input
    is read (it named the input)."""
    from matrixctl.errors import from_os_error
    from matrixctl.ingest.executors import serial

    src = _corpus(tmp_path)
    out = tmp_path / "pack"
    real = serial.Serial.results

    def full(self, files, out_):  # type: ignore[no-untyped-def]
        for i, result in enumerate(real(self, files, out_)):
            if i == 2:
                exc = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                if raised == "bare":
                    raise exc
                raise from_os_error(exc, str(src / "d2.txt"), writing=True)
            yield result

    monkeypatch.setattr(serial.Serial, "results", full)
    run = run_cli("ingest", "docs", str(src), "-o", str(out))
    assert run.code == 2, run.stderr
    assert f"error[OUT_NO_SPACE]: {out}:" in run.stderr and "<stdout>" not in run.stderr
    assert "d2.txt" not in run.stderr
    assert not out.exists()
