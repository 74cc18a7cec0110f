"""`ingest docs --executor dask` on a real Dask LocalCluster (processes, 127.0.0.1): the same
pack bytes as a local run, a worker SIGKILLed mid-task, a client killed and resumed, corrupt
staged units redone, a bad input failing once with the local error (docs/scale-out.md)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from matrixctl.ingest.executors import dask as dask_ex
from matrixctl.ingest.executors import dask_staging
from matrixctl.ingest.kinds import base as kinds_base
from tests.helpers.cli import ROOT, Run, run_cli, run_sub

distributed = pytest.importorskip(
    "distributed", reason="the dask extra is not installed (pip install 'matrixctl[dask]')"
)

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "the",
    "of",
    "and",
    "matrix",
    "tensor",
    "pi",
    "token",
    "atom",
    "shard",
    "unit",
]


def _corpus(root: Path, files: int, words: int) -> Path:
    import random

    rng = random.Random(7)
    src = root / "corpus"
    src.mkdir()
    for i in range(files):
        text = " ".join(rng.choice(WORDS) for _ in range(words))
        (src / f"doc{i:03}.txt").write_text(text, encoding="utf-8")
    lines = [
        json.dumps({"text": " ".join(rng.choice(WORDS) for _ in range(30))}) for _ in range(400)
    ]
    (src / "lines.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return src


def _tree(pack: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(pack.iterdir())}


def _staging(pack: Path) -> Path:
    return pack.parent / f".{pack.name}.dask-staging"


@pytest.fixture(scope="module")
def cluster():
    with (
        distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=":0",
        ) as lc,
        distributed.Client(lc) as client,
    ):
        yield lc, client


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    root = tmp_path_factory.mktemp("small")
    src = _corpus(root, 40, 2000)
    local = root / "local"
    run = run_cli("ingest", "docs", str(src), "-o", str(local), "-j", "1")
    assert run.code == 0, run.stderr
    return src, _tree(local)


def _popen(*args: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, MATRIXCTL_NO_PROGRESS="1")
    return subprocess.Popen(
        [sys.executable, "-m", "matrixctl", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=ROOT,
    )


def test_local_cluster_builds_the_local_pack(cluster, small, tmp_path: Path) -> None:
    lc, _ = cluster
    src, expected = small
    out = tmp_path / "pack"
    run = _ingest_on(lc, src, out, "--json")
    assert run.code == 0, run.stderr
    from tests.cli.test_json_contract import check

    doc = check("ingest docs", run)  # the --json schema, executor included
    assert doc["executor"]["name"] == "dask"
    assert doc["executor"]["reused"] == 0
    assert doc["executor"]["redone"] == doc["executor"]["units"] > 1
    assert _tree(out) == expected
    assert not _staging(out).exists()  # removed after a complete build


def test_scheduler_address_from_the_environment(cluster, small, tmp_path: Path) -> None:
    lc, _ = cluster
    src, expected = small
    out = tmp_path / "pack"
    run = run_cli(
        "ingest",
        "docs",
        str(src),
        "-o",
        str(out),
        "--executor",
        "dask",
        "-j",
        "2",
        env={"DASK_SCHEDULER_ADDRESS": lc.scheduler_address},
    )
    assert run.code == 0, run.stderr
    assert lc.scheduler_address in run.stderr
    assert _tree(out) == expected


@pytest.mark.slow
def test_own_local_cluster_from_the_cli(small, tmp_path: Path) -> None:
    src, expected = small
    out = tmp_path / "pack"
    run = run_sub("ingest", "docs", str(src), "-o", str(out), "--executor", "dask", "-j", "2")
    assert run.code == 0, run.stderr
    assert "LocalCluster" in run.stderr
    assert _tree(out) == expected


SHOUT = """
import logging, sys
import distributed
from matrixctl.ingest.kinds import base as kinds_base
from matrixctl.ingest.executors.dask import _local_cluster

def shout():
    logging.getLogger("distributed.worker").error("worker shouts\\nTraceback (most recent call)")
    return 7

if __name__ == "__main__":
    lc = _local_cluster(distributed, 1)
    with distributed.Client(lc) as client:
        assert client.submit(shout, pure=False).result() == 7
        logging.getLogger("distributed.scheduler").error("scheduler shouts")
    lc.close()
    print("done")
"""


@pytest.mark.slow
def test_own_cluster_processes_keep_stderr_clean(tmp_path: Path) -> None:
    """The own cluster's scheduler and workers log nothing below CRITICAL: an error a worker
    logs (the heartbeat that meets the scheduler closing at the end of a build logs one, with
    its traceback) never reaches the user's terminal; the build reports its own errors."""
    script = tmp_path / "shout.py"
    script.write_text(SHOUT)
    proc = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "done", proc.stderr
    assert "shouts" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def _wait(cond, what: str, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


@pytest.mark.slow
def test_worker_sigkilled_mid_task_is_survived(cluster, tmp_path: Path) -> None:
    lc, client = cluster
    src = _corpus(tmp_path, 60, 12000)
    local = tmp_path / "local"
    assert run_cli("ingest", "docs", str(src), "-o", str(local)).code == 0
    out = tmp_path / "pack"
    pids = client.run(os.getpid)
    proc = _popen(
        "ingest",
        "docs",
        str(src),
        "-o",
        str(out),
        "--executor",
        "dask",
        "--scheduler",
        lc.scheduler_address,
        "-j",
        "2",
    )
    busy: list[str] = []

    def running() -> bool:
        for worker, keys in client.processing().items():
            if any(str(k).startswith("matrixctl-unit-") for k in keys):
                busy.append(worker)
                return True
        return proc.poll() is not None

    try:
        _wait(running, "a unit task on a worker")
        assert busy, "the build ended before a task could be killed"
        os.kill(pids[busy[0]], signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err.decode()
    assert pids[busy[0]] not in client.run(os.getpid).values()  # the worker really died
    assert _tree(out) == _tree(local)
    client.wait_for_workers(2, timeout=60)


def _ingest_on(lc, src: Path, out: Path, *extra: str) -> Run:
    """`ingest docs SRC -o OUT --executor dask` on the test cluster, two workers."""
    return run_cli(
        "ingest", "docs", str(src), "-o", str(out),
        "--executor", "dask", "--scheduler", lc.scheduler_address, "-j", "2", *extra,
    )  # fmt: skip


def _merged(staging: Path) -> dict[str, list[Any]]:
    """The staged units whose record points at their tokens in a pack's atom file: units the
    client had merged (their own tokens file is gone)."""
    merged = {}
    for record in staging.glob("*.done"):
        try:
            tokens = json.loads(record.read_bytes())["tokens"]
        except (OSError, ValueError, KeyError):
            continue
        if tokens[0].startswith("atoms-"):
            merged[record.stem] = tokens
    return merged


def _kill_client_after(lc, src: Path, out: Path, done: int, merged: int = 0) -> None:
    proc = _popen(
        "ingest",
        "docs",
        str(src),
        "-o",
        str(out),
        "--executor",
        "dask",
        "--scheduler",
        lc.scheduler_address,
        "-j",
        "2",
    )
    staging = _staging(out)

    def enough() -> bool:
        return proc.poll() is not None or (
            staging.is_dir()
            and len(list(staging.glob("*.done"))) >= done
            and (not merged or len(_merged(staging)) >= merged)
        )

    try:
        _wait(enough, f"{done} staged units")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL, "the build ended before the client was killed"
    assert not out.exists()


@pytest.mark.slow
def test_killed_client_resumes_reusing_staged_units(cluster, tmp_path: Path) -> None:
    lc, _ = cluster
    src = _corpus(tmp_path, 60, 12000)
    local = tmp_path / "local"
    assert run_cli("ingest", "docs", str(src), "-o", str(local)).code == 0
    out = tmp_path / "pack"
    _kill_client_after(lc, src, out, 3)
    run = _ingest_on(lc, src, out, "--resume", "--json")
    assert run.code == 0, run.stderr
    ex = json.loads(run.out)["executor"]
    assert ex["reused"] >= 3
    assert ex["reused"] + ex["redone"] == ex["units"]
    assert _tree(out) == _tree(local)
    assert not _staging(out).exists()


@pytest.mark.slow
def test_merged_units_resume_from_the_killed_builds_atom_file(cluster, tmp_path: Path) -> None:
    """Units the killed client had merged keep their tokens only in its pack's atom file,
    which the staging folder links: the resumed build reuses them from there, checked by
    their CRC-32; one whose bytes there were changed is redone."""
    lc, _ = cluster
    src = _corpus(tmp_path, 150, 12000)
    local = tmp_path / "local"
    assert run_cli("ingest", "docs", str(src), "-o", str(local)).code == 0
    out = tmp_path / "pack"
    _kill_client_after(lc, src, out, 4, merged=3)
    staging = _staging(out)
    merged = _merged(staging)
    assert len(merged) >= 3
    # The client points a merged unit's record at the atom file, then drops its tokens file
    # (DaskWorkers._merged), one unit after the other: the kill may land between the two steps
    # of the unit being merged (a CI run caught it there), never of an earlier one.
    left = [key for key in merged if (staging / f"{key}.tokens").exists()]
    assert len(left) <= 1, left
    key, (atoms, offset, size) = sorted(merged.items())[0]
    with open(staging / atoms, "r+b") as fp:  # one byte of one merged unit's tokens
        fp.seek(offset + size // 2)
        byte = fp.read(1)
        fp.seek(offset + size // 2)
        fp.write(bytes([byte[0] ^ 0xFF]))
    from matrixctl.ingest.executors.dask_staging import load_unit

    assert load_unit(str(staging), key) is None
    assert all(load_unit(str(staging), k) is not None for k in merged if k != key)
    run = _ingest_on(lc, src, out, "--resume", "--json")
    assert run.code == 0, run.stderr
    ex = json.loads(run.out)["executor"]
    assert ex["reused"] >= len(merged) - 1 and ex["redone"] >= 1
    assert _tree(out) == _tree(local)
    assert not _staging(out).exists()


@pytest.mark.slow
def test_corrupt_staged_units_are_redone(cluster, tmp_path: Path) -> None:
    lc, _ = cluster
    src = _corpus(tmp_path, 60, 12000)
    local = tmp_path / "local"
    assert run_cli("ingest", "docs", str(src), "-o", str(local)).code == 0
    out = tmp_path / "pack"
    _kill_client_after(lc, src, out, 4)
    staging = _staging(out)
    records = sorted(staging.glob("*.done"))[:3]
    # A completion record that does not parse, a records file with one byte changed, and
    # staged files without their record (what a worker killed between the two leaves behind).
    records[0].write_bytes(records[0].read_bytes()[:-5])
    results = records[1].with_suffix(".records")
    data = bytearray(results.read_bytes())
    data[len(data) // 2] ^= 0xFF
    results.write_bytes(bytes(data))
    records[2].unlink()
    from matrixctl.ingest.executors.dask_staging import load_unit

    for record in records:
        assert load_unit(str(staging), record.stem) is None
    run = _ingest_on(lc, src, out, "--resume", "--json")
    assert run.code == 0, run.stderr
    ex = json.loads(run.out)["executor"]
    assert ex["redone"] >= 3
    assert ex["reused"] + ex["redone"] == ex["units"]
    assert _tree(out) == _tree(local)


def test_bad_input_fails_once_with_the_local_error(cluster, tmp_path: Path) -> None:
    lc, client = cluster
    src = _corpus(tmp_path, 6, 200)
    (src / "doc003.txt").write_bytes(b"good text \xff\xfe bad bytes")
    local = run_cli("ingest", "docs", str(src), "-o", str(tmp_path / "local"))
    out = tmp_path / "pack"
    before = client.run_on_scheduler(_attempts)
    run = _ingest_on(lc, src, out)
    assert local.code == 1 and "INGEST_UTF8" in local.stderr, local.stderr
    assert run.code == local.code
    assert run.stderr == local.stderr
    assert not out.exists() and not _staging(out).exists()
    # The failing unit ran once: no unit task of this build was scheduled a second time.
    attempts = client.run_on_scheduler(_attempts)
    new = {k: n for k, n in attempts.items() if k not in before}
    assert new and all(n == 1 for n in new.values()), new


def test_a_bad_line_in_a_later_piece_names_the_files_line(
    cluster, tmp_path: Path, monkeypatch
) -> None:
    """Workers count a piece's lines from 0 (the client does not count them): a bad record
    deep in a large JSON Lines file still gets the local run's error, with the file's own
    line number and offset."""
    lc, _ = cluster
    _small_units(monkeypatch)
    src = tmp_path / "big.jsonl"
    data = _big_jsonl(src).split(b"\n")
    data[2500] = b'{"text": "broken'
    src.write_bytes(b"\n".join(data))
    local = run_cli("ingest", "docs", str(src), "-o", str(tmp_path / "local"))
    assert local.code == 1 and "line 2501" in local.stderr, local.stderr
    run = _ingest_on(lc, src, tmp_path / "pack")
    assert (run.code, run.stderr) == (local.code, local.stderr)


def test_a_line_longer_than_max_doc_size_deep_in_the_file_is_the_local_error(
    cluster, tmp_path: Path, monkeypatch
) -> None:
    """The client cuts without counting lines; a line past --max-doc-size found while cutting
    is reported as the local run reports it (its line number and offset in the file)."""
    lc, _ = cluster
    _small_units(monkeypatch)
    src = tmp_path / "big.jsonl"
    data = _big_jsonl(src).split(b"\n")
    data[2000] = json.dumps({"text": "long " * 30000}).encode()
    src.write_bytes(b"\n".join(data))
    args = ("--max-doc-size", "100000")
    local = run_cli("ingest", "docs", str(src), "-o", str(tmp_path / "local"), *args)
    assert local.code == 1 and "line 2001" in local.stderr, local.stderr
    run = _ingest_on(lc, src, tmp_path / "pack", *args)
    assert (run.code, run.stderr) == (local.code, local.stderr)


def _attempts(dask_scheduler=None) -> dict[str, int]:
    """How often the scheduler sent each unit task to a worker (its transition log)."""
    counts: dict[str, int] = {}
    for entry in dask_scheduler.transition_log:
        key, finish = str(entry[0]), entry[2]
        if key.startswith("matrixctl-unit-") and finish == "processing":
            counts[key] = counts.get(key, 0) + 1
    return counts


def test_resume_and_scheduler_need_the_dask_executor(tmp_path: Path) -> None:
    run = run_cli("ingest", "docs", str(tmp_path), "-o", str(tmp_path / "p"), "--resume")
    assert run.code == 2
    assert "--executor dask" in run.stderr


def test_missing_extra_is_one_error_line(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("hello", encoding="utf-8")
    code = (
        "import sys; sys.modules['distributed'] = None; sys.modules['dask'] = None\n"
        "from matrixctl.cli.app import main; raise SystemExit(main(sys.argv[1:]))"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "ingest",
            "docs",
            str(tmp_path),
            "-o",
            str(tmp_path / "p"),
            "--executor",
            "dask",
        ],
        capture_output=True,
        check=False,
        cwd=ROOT,
    )
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert "INGEST_DASK_MISSING" in err and "pip install 'matrixctl[dask]'" in err
    assert "Traceback" not in err and not (tmp_path / "p").exists()
    assert not (tmp_path / ".p.dask-staging").exists()


def test_own_cluster_that_cannot_start_is_one_error_line(tmp_path: Path, monkeypatch) -> None:
    """The own LocalCluster starts on a helper thread while the client cuts the first units;
    a cluster that cannot start is the one error line INGEST_DASK_CLUSTER, raised where the
    build needs it, and leaves neither a pack nor a staging folder."""

    src = _corpus(tmp_path, 5, 40)
    started: list[str] = []

    def refuse(distributed: Any, jobs: int) -> Any:
        import threading

        started.append(threading.current_thread().name)
        raise OSError(98, "Address already in use")

    monkeypatch.setattr(dask_ex, "_local_cluster", refuse)
    out = tmp_path / "p"
    run = run_cli("ingest", "docs", str(src), "-o", str(out), "--executor", "dask")
    assert run.code == 2, run.stderr
    assert "INGEST_DASK_CLUSTER" in run.stderr and "Address already in use" in run.stderr
    assert "Traceback" not in run.stderr
    assert started == ["matrixctl-dask-start"]
    assert not out.exists() and not (tmp_path / ".p.dask-staging").exists()


def test_pieces_of_a_large_jsonl_file_travel_to_the_workers(
    cluster, tmp_path: Path, monkeypatch
) -> None:
    """A JSON Lines file cut into pieces (sizes lowered here, in the client that cuts): the
    workers read each piece's byte range from the file and the pack is that of --jobs 1."""
    from matrixctl.ingest import units

    lc, _ = cluster
    monkeypatch.setattr(units, "SPLIT_MIN", 64 << 10)
    monkeypatch.setattr(units, "PIECE_BYTES", 16 << 10)
    src = tmp_path / "big.jsonl"
    lines = [json.dumps({"text": f"{WORDS[i % len(WORDS)]} matrix {i} " * 8}) for i in range(3000)]
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert src.stat().st_size > 4 * (64 << 10)
    local = tmp_path / "local"
    assert run_cli("ingest", "docs", str(src), "-o", str(local)).code == 0
    out = tmp_path / "pack"
    run = run_cli(
        "ingest", "docs", str(src), "-o", str(out), "--executor", "dask",
        "--scheduler", lc.scheduler_address, "-j", "2", "--json",
    )  # fmt: skip
    assert run.code == 0, run.stderr
    assert json.loads(run.out)["executor"]["units"] > 4  # one file, many pieces
    assert _tree(out) == _tree(local)


def test_unreachable_scheduler_is_one_error_line(tmp_path: Path) -> None:
    """A scheme matrixctl does not connect over is a usage error (test_dask_failures.py has
    the others)."""
    (tmp_path / "a.txt").write_text("hello", encoding="utf-8")
    out = tmp_path / "p"
    run = run_cli(
        "ingest", "docs", str(tmp_path), "-o", str(out), "--executor", "dask",
        "--scheduler", "bogus://nowhere",
    )  # fmt: skip
    assert run.code in (1, 2)
    assert "INGEST_DASK_ADDRESS" in run.stderr and "bogus://nowhere" in run.stderr
    assert "Traceback" not in run.stderr and not out.exists()


# Range pieces, compressed and stdin sources, the staged merge (docs/scale-out.md) ------------


def _big_jsonl(path: Path, n: int = 3000) -> bytes:
    import random

    rng = random.Random(3)  # random numbers: the gzip of it is still larger than SPLIT_MIN
    lines = [
        json.dumps(
            {"text": " ".join(f"{rng.choice(WORDS)} {rng.getrandbits(40)}" for _ in range(8))}
        )
        for _ in range(n)
    ]
    data = ("\n".join(lines) + "\n").encode()
    path.write_bytes(data)
    return data


def _small_units(monkeypatch) -> None:
    from matrixctl.ingest import units

    monkeypatch.setattr(units, "SPLIT_MIN", 64 << 10)
    monkeypatch.setattr(units, "PIECE_BYTES", 16 << 10)


def _state():
    from matrixctl.ingest.step import Step
    from matrixctl.tokenizers import pi

    smap, _ = pi.load_symbol_map(pi.default_map_path())
    opts = kinds_base.Options("text", "skip", "error", kinds_base.MAX_WHOLE, "auto")
    return Step(None, smap.eos_id, opts, "", "<u2")


def _plan(path: Path, staging: Path) -> Any:
    from matrixctl.ingest.executors import dask as dask_ex
    from matrixctl.ingest.sources import enumerate_sources

    files, _ = enumerate_sources([str(path)], exclude=[])
    staging.mkdir(exist_ok=True)
    return dask_ex.plan(files, _state(), 2, str(staging))


def test_range_pieces_cover_the_file_in_whole_lines(tmp_path: Path, monkeypatch) -> None:
    """The client cuts a stored JSON Lines file into byte ranges of whole lines that cover it
    back to back; each worker read gives exactly those bytes, and the last piece carries the
    file's SHA-256."""
    import hashlib

    from matrixctl.ingest.executors import dask as dask_ex
    from matrixctl.ingest.executors import dask_staging

    _small_units(monkeypatch)
    src = tmp_path / "big.jsonl"
    data = _big_jsonl(src)
    units = list(_plan(src, tmp_path / "staging"))
    assert len(units) > 4 and all(isinstance(u, dask_staging.RangePiece) for u in units)
    pos = 0
    # A worker's reused buffer (dask_staging._unit_buffer): left longer by an earlier unit.
    buf = bytearray(b"\xff" * (max(u.length for u in units) + 7))
    for index, u in enumerate(units):
        assert u.path == str(src) and u.offset == pos and u.piece.index == index
        # Lines are counted by the worker, from 0 (the writer adds the lines before it).
        assert u.piece.first_line == -1
        got = dask_staging.read_range(u)
        assert got == data[pos : pos + u.length] and got.endswith(b"\n")
        assert dask_staging.read_range(u, buf) is buf and bytes(buf[: u.length]) == got
        pos += u.length
    assert dask_staging.read_range(units[0], bytearray()) == data[: units[0].length]  # grown
    # The worker's own buffer is kept for units up to twice the largest; a longer piece
    # (one long line) gets a buffer of its own.
    kept = dask_staging._unit_buffer(1)
    assert dask_staging._unit_buffer(2 * dask_ex.UNIT_MAX_BYTES) is kept
    assert dask_staging._unit_buffer(2 * dask_ex.UNIT_MAX_BYTES + 1) is not kept
    assert pos == len(data)
    assert units[-1].piece.last and not any(u.piece.last for u in units[:-1])
    assert units[-1].piece.file_sha256 == "sha256:" + hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("change", ["rewritten", "appended", "replaced"])
def test_a_source_changed_under_a_worker_is_io_changed(
    tmp_path: Path, monkeypatch, change: str
) -> None:
    """A worker reads a range only from the file the client cut (same size, mtime_ns and
    inode): a source rewritten in place, grown, or replaced by another file at its path gives
    the IO_CHANGED error for the unit, never tokens of other bytes."""
    from matrixctl.ingest.executors import dask_staging

    _small_units(monkeypatch)
    src = tmp_path / "big.jsonl"
    data = _big_jsonl(src)
    staging = tmp_path / "staging"
    first = next(iter(_plan(src, staging)))
    if change == "rewritten":  # same size, new content and mtime
        src.write_bytes(data.replace(b"matrix", b"MATRIX"))
    elif change == "appended":
        with open(src, "ab") as fp:
            fp.write(b'{"text": "late"}\n')
    else:
        other = tmp_path / "other.jsonl"
        other.write_bytes(data)
        os.replace(other, src)
    st = src.stat()
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # a tick later, surely
    blob = tmp_path / "state"
    import hashlib
    import pickle

    from matrixctl.ingest.tokenizer import PiRecipe
    from matrixctl.tokenizers import pi

    raw = pi.read_map_bytes(pi.default_map_path())
    recipe = PiRecipe(pi.check_map_bytes(raw, "map"), raw)
    state = pickle.dumps((_state(), recipe))  # the state file: (step, the tokenizer's recipe)
    blob.write_bytes(state)
    status, payload = dask_staging.run_unit(
        hashlib.sha256(state).hexdigest(), str(blob), first, "k", str(staging)
    )
    assert status == "error"
    assert payload[1] == "IO_CHANGED" and payload[3] == str(src)
    assert not list(staging.glob("k.*"))  # nothing staged


def test_a_source_changed_while_the_client_cuts_it_is_io_changed(
    tmp_path: Path, monkeypatch
) -> None:
    """The client checks, after its last read, that the file it hashed and cut is still the
    one at its path: a change in between stops the build with IO_CHANGED."""
    from matrixctl.errors import InputError

    _small_units(monkeypatch)
    src = tmp_path / "big.jsonl"
    _big_jsonl(src)
    units = _plan(src, tmp_path / "staging")
    next(units)
    with open(src, "ab") as fp:
        fp.write(b'{"text": "late"}\n')
    with pytest.raises(InputError) as err:
        list(units)
    assert err.value.code == "IO_CHANGED" and err.value.path == str(src)


@pytest.mark.parametrize("kind", ["gzip", "stdin"])
def test_compressed_and_stdin_sources_build_the_local_pack(
    cluster, tmp_path: Path, monkeypatch, kind: str
) -> None:
    """Sources that cannot be read by range: a gzip JSON Lines file (the client spools each
    decompressed range to the staging folder, removed once merged) and stdin (spooled whole
    first); both give the pack of --jobs 1."""
    import gzip

    lc, _ = cluster
    _small_units(monkeypatch)
    data = _big_jsonl(tmp_path / "big.jsonl")
    src, stdin = "-", data
    if kind == "gzip":
        src, stdin = str(tmp_path / "big.jsonl.gz"), b""
        Path(src).write_bytes(gzip.compress(data, mtime=0))
    local = tmp_path / "local"
    assert run_cli("ingest", "docs", src, "-o", str(local), stdin=stdin).code == 0
    out = tmp_path / "pack"
    run = run_cli(
        "ingest", "docs", src, "-o", str(out), "--executor", "dask",
        "--scheduler", lc.scheduler_address, "-j", "2", "--json", stdin=stdin,
    )  # fmt: skip
    assert run.code == 0, run.stderr
    assert json.loads(run.out)["executor"]["units"] > 4
    assert _tree(out) == _tree(local)
    assert not _staging(out).exists()


def test_staged_tokens_are_copied_as_written() -> None:
    """The merge copies a staged unit's tokens inside the kernel (or through a buffer where
    the kernel refuses) with the CRC-32 and largest id its record vouches for: the atom file
    is the one `write` makes from the same ids."""
    import io

    import numpy as np

    from matrixctl import io as mio
    from matrixctl.crc import crc32
    from matrixctl.formats import matrix_atom

    ids = (np.arange(70_001, dtype=np.int64) * 7919 % 50_000).astype("<u2")
    staged = io.BytesIO()
    reference = io.BytesIO()
    writer = matrix_atom.AtomWriter(reference, atom_size=256, dtype="uint16", vocab_size=50_000)
    writer.write(ids[:100])
    writer.write(ids[100:])
    writer.finish()
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "staged")
        with open(src, "wb") as fp:
            fp.write(b"head" + ids.tobytes())
        for fast in (True, False):
            dst = os.path.join(tmp, f"atoms-{fast}")
            with open(dst, "w+b") as fp, open(src, "rb") as sfp:
                w = matrix_atom.AtomWriter(fp, atom_size=256, dtype="uint16", vocab_size=50_000)
                w.write(ids[:100])
                rest = ids[100:].tobytes()
                real, real_sendfile = os.copy_file_range, os.sendfile
                if not fast:

                    def refuse(*a: Any) -> int:
                        raise OSError(18, "cross-device")  # EXDEV: the buffered copy

                    mio.os.copy_file_range = refuse  # type: ignore[attr-defined]
                    mio.os.sendfile = refuse  # type: ignore[attr-defined]
                try:
                    w.write_range(
                        sfp.fileno(), 4 + 200, len(rest), "<u2",
                        max_id=int(ids[100:].max()), crc=crc32(rest),
                    )  # fmt: skip
                finally:
                    mio.os.copy_file_range = real  # type: ignore[attr-defined]
                    mio.os.sendfile = real_sendfile  # type: ignore[attr-defined]
                w.finish()
            with open(dst, "rb") as fp:
                staged = fp.read()
            assert staged == reference.getvalue()


def test_workers_take_their_matcher_from_the_map_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker reads the map's bytes with the build's state and takes the compiled matcher
    from its machine's map cache when an entry for them is sound (a few ms instead of about
    0.16 CPU s to build it), storing one after a build; a damaged entry is built again. The
    ids are those of a matcher built from the map."""
    import hashlib
    import pickle

    from matrixctl.ingest.step import Step
    from matrixctl.ingest.tokenizer import PiRecipe
    from matrixctl.tokenizers import pi, pi_cache

    monkeypatch.setenv("MATRIXCTL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("MATRIXCTL_NO_CACHE", raising=False)
    raw = pi.read_map_bytes(pi.default_map_path())
    smap = pi.check_map_bytes(raw, "map")
    state = Step(None, smap.eos_id, kinds_base.Options(), "")
    blob = pickle.dumps((state, PiRecipe(smap, raw)))
    key = hashlib.sha256(blob).hexdigest()
    path = tmp_path / f"state-{key}.pickle"
    path.write_bytes(blob)
    built: list[bool] = []
    real = pi.Tokenizer.__init__

    def spy(self: Any, smap: Any, trie: Any = None, *args: Any, **kwargs: Any) -> None:
        built.append(trie is None)
        real(self, smap, trie, *args, **kwargs)

    monkeypatch.setattr(pi.Tokenizer, "__init__", spy)
    text = "Hello, wörld: the matrix of tokens \ufb01"
    want = pi.Tokenizer.__new__(pi.Tokenizer)
    real(want, smap)
    ids = []
    for round_ in ("empty cache", "entry stored", "entry damaged"):
        if round_ == "entry damaged":
            (entry,) = (tmp_path / "cache" / "pi").glob("*.bin")
            data = bytearray(entry.read_bytes())
            data[-1] ^= 0xFF
            entry.write_bytes(bytes(data))
        dask_staging._WORKER_STEPS.clear()
        built.clear()
        got = dask_staging._worker_step(key, str(path))
        assert built == [round_ != "entry stored"], round_
        assert pi_cache.load(raw) is not None  # stored (again) after a build
        ids.append(got.tok.tok.encode(text).tolist())
    dask_staging._WORKER_STEPS.clear()
    assert ids == [want.encode(text).tolist()] * 3
