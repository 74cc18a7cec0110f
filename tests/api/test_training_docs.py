"""The examples of docs/training.md run as written (in a folder that holds a pack named
`pack`): the plain loop, StatefulDataLoader resume and elastic resume in one process, DDP under
`torchrun` with two gloo ranks on CPU."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import FIXTURES, ROOT, run_cli

DOC = ROOT / "docs" / "training.md"


def _blocks() -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    # `...` stands for the user's training step.
    return [re.sub(r"^(\s+)\.\.\.", r"\1pass", b, flags=re.M) for b in blocks]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("torchdata")
    out = tmp_path_factory.mktemp("training-docs")
    pack = str(out / "pack")
    res = run_cli("ingest", "docs", str(FIXTURES / "corpus"), "-o", pack, "--atom-size", "16")
    assert res.code == 0, res.stderr
    return out


def _run(folder: Path, argv: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        argv, cwd=folder, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]


def test_the_loop_and_resume_examples_run(folder: Path) -> None:
    blocks = _blocks()
    loop, _ddp, resume, elastic = blocks[:4]
    (folder / "loop.py").write_text(loop)
    (folder / "resume.py").write_text(resume + "\n" + elastic)
    _run(folder, [sys.executable, "loop.py"])
    _run(folder, [sys.executable, "resume.py"])


def test_the_ddp_example_runs_under_torchrun(folder: Path) -> None:
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    if torchrun is None:
        pytest.skip("torchrun is not installed beside this Python")
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    (folder / "train.py").write_text(_blocks()[1])
    argv = [torchrun, "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", port]
    _run(folder, [*argv, "train.py"])
