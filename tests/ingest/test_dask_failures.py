"""`ingest docs --executor dask` when the cluster fails (docs/scale-out.md, "When the
scheduler fails"): a scheduler killed or frozen mid-build, an address that accepts TCP and never
answers, addresses matrixctl cannot use, and a full disk on a worker. Each is one error line
with its code, exit 1 or 2, never a `distributed` traceback, never a wait without end."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from matrixctl.ingest.executors import dask as dask_ex
from matrixctl.ingest.executors import dask_staging
from tests.helpers.cli import ROOT, run_cli, run_sub

distributed = pytest.importorskip(
    "distributed", reason="the dask extra is not installed (pip install 'matrixctl[dask]')"
)


def _wait(cond: Any, what: str, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _corpus(root: Path) -> Path:
    src = root / "corpus"
    src.mkdir()
    for i in range(6):
        (src / f"d{i}.txt").write_text(f"alpha beta gamma {i} " * 200, encoding="utf-8")
    return src


def _one_error_line(err: str, code: str) -> None:
    assert "Traceback" not in err and "distributed." not in err, err
    errors = [line for line in err.splitlines() if not line.startswith("matrixctl: hint")]
    assert len(errors) == 1 and f"error[{code}]" in errors[0], err


@pytest.mark.parametrize("where", ["option", "environment"])
@pytest.mark.parametrize("address", ["ucx://127.0.0.1:8786", "bogus://nowhere", "tcp://"])
def test_addresses_matrixctl_cannot_use_are_usage_errors(
    tmp_path: Path, where: str, address: str
) -> None:
    """A ucx:// address gave INTERNAL (Dask's UCX connector needs ucx-py): every scheme but
    tcp:// and tls:// is INGEST_DASK_ADDRESS, exit 2, before anything is staged."""
    src = _corpus(tmp_path)
    out = tmp_path / "p"
    args = ["ingest", "docs", str(src), "-o", str(out), "--executor", "dask"]
    if where == "option":
        run = run_cli(*args, "--scheduler", address)
    else:
        run = run_cli(*args, env={"DASK_SCHEDULER_ADDRESS": address})
    assert run.code == 2, run.stderr
    _one_error_line(run.stderr, "INGEST_DASK_ADDRESS")
    assert address in run.stderr
    assert not out.exists() and not (tmp_path / ".p.dask-staging").exists()


@pytest.mark.parametrize("value", ["abc", "0", "-5", "1e9"])
def test_a_bad_timeout_is_a_usage_error(tmp_path: Path, value: str) -> None:
    src = _corpus(tmp_path)
    run = run_cli(
        "ingest", "docs", str(src), "-o", str(tmp_path / "p"), "--executor", "dask",
        "--scheduler", "tcp://127.0.0.1:1", env={"MATRIXCTL_DASK_TIMEOUT": value},
    )  # fmt: skip
    assert run.code == 2, run.stderr
    _one_error_line(run.stderr, "USAGE")
    assert "MATRIXCTL_DASK_TIMEOUT" in run.stderr


@pytest.fixture
def silent_listener() -> Iterator[str]:
    """A TCP port that accepts connections and never says a word."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"tcp://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()


def test_an_address_that_never_answers_is_a_bounded_error(
    tmp_path: Path, silent_listener: str
) -> None:
    """The client waited forever on a port that accepts TCP and never answers (Dask's own
    timeout covers the connection only): now INGEST_DASK_CLUSTER after MATRIXCTL_DASK_TIMEOUT
    seconds. (The subprocess timeout only keeps a regression from hanging the suite.)"""
    src = _corpus(tmp_path)
    out = tmp_path / "p"
    run = run_sub(
        "ingest", "docs", str(src), "-o", str(out), "--executor", "dask",
        "--scheduler", silent_listener, env={"MATRIXCTL_DASK_TIMEOUT": "1"}, timeout=90,
    )  # fmt: skip
    assert run.code == 2, run.stderr
    _one_error_line(run.stderr, "INGEST_DASK_CLUSTER")
    assert "did not answer within 1 s" in run.stderr and silent_listener in run.stderr
    assert not out.exists()


def _start_scheduler(tmp_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A scheduler of its own process and no worker: the build's tasks wait on it."""
    info = tmp_path / "scheduler.json"
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
            "--port", "0", "--no-dashboard", "--scheduler-file", str(info),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
    )  # fmt: skip

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError("the scheduler ended")
        try:
            return bool(json.loads(info.read_text())["address"])
        except (OSError, ValueError, KeyError):
            return False

    _wait(ready, "the scheduler's address")
    return proc, json.loads(info.read_text())["address"]


def _build_waiting_on(address: str, tmp_path: Path, env: dict[str, str]) -> Any:
    """Start a build on `address` and return once the scheduler holds its tasks."""
    src = _corpus(tmp_path)
    build = subprocess.Popen(
        [
            sys.executable, "-m", "matrixctl", "ingest", "docs", str(src), "-o",
            str(tmp_path / "p"), "--executor", "dask", "--scheduler", address,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "MATRIXCTL_NO_PROGRESS": "1", **env},
        cwd=ROOT,
    )  # fmt: skip

    def tasks(dask_scheduler: Any = None) -> int:
        return sum(str(k).startswith("matrixctl-unit-") for k in dask_scheduler.tasks)

    with distributed.Client(address, timeout="30s") as watcher:
        _wait(lambda: watcher.run_on_scheduler(tasks) > 0, "the build's tasks")
    return build


@pytest.mark.slow
@pytest.mark.parametrize("how", ["killed", "frozen"])
def test_a_scheduler_lost_mid_build_is_one_error_line(tmp_path: Path, how: str) -> None:
    """A scheduler SIGKILLed mid-build printed `distributed` tracebacks and ended with
    INTERNAL (exit 70); a SIGSTOPped one made the client wait forever. Both are now the one
    line INGEST_DASK_CLUSTER, exit 2, the staging folder kept for --resume."""
    scheduler, address = _start_scheduler(tmp_path)
    build = None
    try:
        build = _build_waiting_on(address, tmp_path, {"MATRIXCTL_DASK_TIMEOUT": "2"})
        scheduler.send_signal(signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        _, raw = build.communicate(timeout=120)
    finally:
        if build is not None and build.poll() is None:
            build.kill()
        scheduler.send_signal(signal.SIGCONT)
        scheduler.kill()
        scheduler.wait()
    err = raw.decode()
    assert build.returncode == 2, err
    _one_error_line(err, "INGEST_DASK_CLUSTER")
    assert address in err
    if how == "frozen":
        assert "did not answer within 2 s" in err
    assert not (tmp_path / "p").exists() and (tmp_path / ".p.dask-staging").is_dir()


def test_a_full_disk_on_a_worker_is_the_output_error(tmp_path: Path, monkeypatch) -> None:
    """ENOSPC while a worker stages its unit is returned as OUT_NO_SPACE naming the file it
    wrote (before, the task raised and the client reported "the cluster lost unit ...")."""
    from tests.ingest.test_dask import _big_jsonl, _plan, _small_units, _state

    _small_units(monkeypatch)
    src = tmp_path / "big.jsonl"
    _big_jsonl(src)
    staging = tmp_path / "staging"
    first = next(iter(_plan(src, staging)))
    import hashlib
    import pickle

    from matrixctl.ingest.tokenizer import PiRecipe
    from matrixctl.tokenizers import pi

    raw = pi.read_map_bytes(pi.default_map_path())
    state = pickle.dumps((_state(), PiRecipe(pi.check_map_bytes(raw, "map"), raw)))
    blob = tmp_path / "state"
    blob.write_bytes(state)
    full = str(staging / "k.tokens")

    def no_space(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), full)

    monkeypatch.setattr(dask_staging, "_stage", no_space)
    status, payload = dask_staging.run_unit(
        hashlib.sha256(state).hexdigest(), str(blob), first, "k", str(staging)
    )
    assert status == "error" and payload[0] == "OutputError"
    assert payload[1] == "OUT_NO_SPACE" and payload[3] == full


class _Future:
    def __init__(self, status: str, exc: BaseException | None = None) -> None:
        self.status = status
        self._exc = exc

    def exception(self, timeout: float | None = None) -> BaseException | None:
        return self._exc

    def result(self, timeout: float | None = None) -> Any:
        raise self._exc  # type: ignore[misc]


def _client_side(tmp_path: Path, future: _Future) -> dask_ex.DaskExecutor:
    ex = object.__new__(dask_ex.DaskExecutor)
    ex.distributed = type("D", (), {"wait": staticmethod(lambda f, timeout=None: None)})
    ex.timeout = 5.0
    ex.staging = str(tmp_path)
    ex.address = "tcp://127.0.0.1:8786"
    ex.input_error = False
    return ex


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (OSError(errno.ENOSPC, "No space left on device", "/shared/x.tokens"), "OUT_NO_SPACE"),
        (OSError(errno.EFBIG, "File too large"), "OUT_TOO_LARGE"),
        (OSError(errno.ECONNRESET, "Connection reset"), "INGEST_DASK_CLUSTER"),
        (
            RuntimeError("1 Future cancelled:\nReasons: scheduler-connection-lost"),
            "INGEST_DASK_CLUSTER",
        ),
    ],
)
def test_the_client_tells_a_full_disk_from_a_lost_cluster(
    tmp_path: Path, exc: BaseException, code: str
) -> None:
    """A task that raised a full disk (a worker of an older matrixctl, or a write outside
    the staging step) is the output error; anything else Dask raises is the cluster lost, in
    one line (Dask's cancellation messages span several)."""
    from matrixctl.errors import MatrixError

    future = _Future(
        "error" if isinstance(exc, OSError) and exc.errno != errno.ECONNRESET else "lost", exc
    )
    ex = _client_side(tmp_path, future)
    with pytest.raises(MatrixError) as err:
        ex._collect("k", future)
    assert err.value.code == code
    assert "\n" not in err.value.one_line()
