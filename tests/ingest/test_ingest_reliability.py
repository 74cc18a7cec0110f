"""Ingest packs under kill -9, folder swaps, symlinks and dying parents (docs/reliability.md)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from matrixctl.ingest import swap
from matrixctl.ingest.kinds import base as kinds_base
from matrixctl.validate import ingest_pack as pack_checks
from matrixctl.validate.engine import examine
from tests.helpers.cli import ROOT, run_cli

CORPUS = ROOT / "fixtures" / "corpus"
TIMEOUT = 60.0
POINTS = 20


def tree_bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def siblings(dest: Path) -> list[str]:
    """The hidden names beside `dest` that belong to it (temporary or old folders)."""
    return sorted(n for n in os.listdir(dest.parent) if n.startswith(f".{dest.name}."))


def verifies(path: Path) -> bool:
    report, _ = examine(str(path), scan=True)
    return report.format == "ingest-pack" and report.ok()


def env() -> dict[str, str]:
    e = dict(os.environ)
    e.pop("SOURCE_DATE_EPOCH", None)
    e["PYTHONPATH"] = str(ROOT)
    return e


def killed_at(step: int, countfile: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "tests.helpers.killpoint", str(step), str(countfile), *args],
        cwd=ROOT,
        env=env(),
        capture_output=True,
        timeout=TIMEOUT,
        check=False,
    )


def small_corpus(tmp_path: Path) -> Path:
    src = tmp_path / "small"
    src.mkdir()
    (src / "one.txt").write_text("the previous version of the pack\n", encoding="utf-8")
    return src


# Crash consistency -------------------------------------------------------------------------


def _kill_everywhere(tmp_path: Path, args: list[str], dest: Path, prev: Path | None) -> None:
    """Kill the writer at 20 steps spread over its run; after each kill PACKDIR is the previous pack
    or the new one, whole and verifying; the next run completes and leaves no temporary."""
    reference = tmp_path / "reference"
    ref_args = [a if a != str(dest) else str(reference) for a in args]
    assert run_cli(*ref_args).code == 0
    new_bytes = tree_bytes(reference)
    prev_bytes = tree_bytes(prev) if prev is not None else None
    countfile = tmp_path / "count"

    def reset() -> None:
        if dest.exists():
            shutil.rmtree(dest)
        if prev is not None:
            shutil.copytree(prev, dest)

    reset()
    run = killed_at(0, countfile, *args)
    assert run.returncode == 0, run.stderr
    total = int(countfile.read_text())
    assert total >= 20, f"only {total} steps: the kill points would not cover the run"
    # POINTS kill points spread evenly from the first step to the last (all when fewer).
    points = sorted({1 + round(i * (total - 1) / (POINTS - 1)) for i in range(POINTS)})
    seen = set()
    for step in points:
        reset()
        run = killed_at(step, countfile, *args)
        assert run.returncode == -signal.SIGKILL, (step, run.returncode, run.stderr)
        assert b"Traceback" not in run.stderr
        if not dest.exists():
            assert prev is None, f"step {step}: the previous pack is gone"
            seen.add("absent")
        else:
            got = tree_bytes(dest)
            assert got in (prev_bytes, new_bytes), f"step {step}: a mixed or partial folder"
            assert verifies(dest), f"step {step}"
            seen.add("new" if got == new_bytes else "previous")
        # The next run writing the same PACKDIR completes and removes the dead run's folders.
        nxt = run_cli(*args)
        assert nxt.code == 0, (step, nxt.stderr)
        assert tree_bytes(dest) == new_bytes
        assert siblings(dest) == [], f"step {step}"
    # The points cover the run: both sides of the publishing step were hit.
    assert seen == ({"previous", "new"} if prev is not None else {"absent", "new"})


def test_kill_ingest_docs_anywhere_over_a_previous_pack(tmp_path: Path) -> None:
    prev = tmp_path / "prev"
    assert run_cli("ingest", "docs", str(small_corpus(tmp_path)), "-o", str(prev)).code == 0
    dest = tmp_path / "pack"
    _kill_everywhere(tmp_path, ["ingest", "docs", str(CORPUS), "-o", str(dest)], dest, prev)


def test_kill_ingest_docs_anywhere_into_a_new_folder(tmp_path: Path) -> None:
    dest = tmp_path / "pack"
    _kill_everywhere(tmp_path, ["ingest", "docs", str(CORPUS), "-o", str(dest)], dest, None)


def test_kill_ingest_merge_anywhere(tmp_path: Path) -> None:
    shards = []
    for i in range(2):
        shard = tmp_path / f"s{i}"
        assert (
            run_cli("ingest", "docs", str(CORPUS), "-o", str(shard), "--shard", f"{i}/2").code == 0
        )
        shards.append(str(shard))
    prev = tmp_path / "prev"
    assert run_cli("ingest", "docs", str(small_corpus(tmp_path)), "-o", str(prev)).code == 0
    dest = tmp_path / "merged"
    _kill_everywhere(tmp_path, ["ingest", "merge", *shards, "-o", str(dest)], dest, prev)


def test_pack_left_with_a_partial_manifest_is_replaced(tmp_path: Path) -> None:
    """An older version killed between its last two renames left the manifest's .partial
    name: the next run replaces that folder instead of refusing with INGEST_OUTPUT."""
    dest = tmp_path / "pack"
    assert run_cli("ingest", "docs", str(small_corpus(tmp_path)), "-o", str(dest)).code == 0
    os.rename(dest / "ingest_manifest.json", dest / "ingest_manifest.json.partial")
    run = run_cli("ingest", "docs", str(CORPUS), "-o", str(dest))
    assert run.code == 0, run.stderr
    assert not (dest / "ingest_manifest.json.partial").exists()
    assert verifies(dest)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_only_dead_runs_temporaries_are_removed(tmp_path: Path) -> None:
    dest = tmp_path / "pack"
    from matrixctl import io as mio

    host = mio._host_tag()
    live = Path(mio.sibling_temp_name(str(dest)))
    dead = tmp_path / f".pack.mx{_dead_pid()}-1-{host}-{'b' * 12}.tmp"
    other = tmp_path / f".other.mx{_dead_pid()}-1-{host}-{'c' * 12}.tmp"
    for folder in (live, dead, other):
        folder.mkdir()
        (folder / "atoms.matrix").write_bytes(b"x")
    assert run_cli("ingest", "docs", str(CORPUS), "-o", str(dest)).code == 0
    assert live.exists(), "a live run's folder was removed"
    assert not dead.exists()
    assert other.exists(), "another destination's folder was touched"


def test_a_dead_runs_old_pack_comes_back_when_packdir_is_missing(tmp_path: Path) -> None:
    """The fallback without an atomic exchange moves the old pack aside first; a kill right
    after leaves PACKDIR missing. The next run puts the previous pack back before anything."""
    dest = tmp_path / "pack"
    assert run_cli("ingest", "docs", str(small_corpus(tmp_path)), "-o", str(dest)).code == 0
    prev = tree_bytes(dest)
    os.rename(dest, tmp_path / f".pack.{_dead_pid()}-1.{'d' * 12}.old")
    assert swap.clean_stale(str(dest)) == []
    assert tree_bytes(dest) == prev
    assert siblings(dest) == []


def test_fallback_without_exchange_replaces_the_pack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dest = tmp_path / "pack"
    assert run_cli("ingest", "docs", str(small_corpus(tmp_path)), "-o", str(dest)).code == 0
    monkeypatch.setattr(swap, "_exchange", lambda a, b: False)
    assert run_cli("ingest", "docs", str(CORPUS), "-o", str(dest)).code == 0
    assert verifies(dest)
    assert json.loads((dest / "ingest_manifest.json").read_text())["documents"] == 10
    assert siblings(dest) == []


# Verify while the pack is replaced -----------------------------------------------------------


def test_verify_sees_one_whole_pack_when_swapped_midway(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pack is replaced right after verify read its manifest: without the identity check
    the members of the new pack would be checked against the old manifest (PACK_MISMATCH)."""
    dest = tmp_path / "pack"
    other = tmp_path / "other"
    assert run_cli("ingest", "docs", str(small_corpus(tmp_path)), "-o", str(dest)).code == 0
    assert run_cli("ingest", "docs", str(CORPUS), "-o", str(other)).code == 0
    real_load = pack_checks.load_dir
    calls = []

    def load_then_swap(path: str):
        subject = real_load(path)
        if not calls:
            swap.publish(str(other), str(dest))
        calls.append(path)
        return subject

    monkeypatch.setattr(pack_checks, "load_dir", load_then_swap)
    report, _ = examine(str(dest), scan=True)
    assert report.ok(), [f.code for f in report.findings]
    assert len(calls) == 2  # checked again, on the new pack


# A writer replacing the pack again and again, at a writer's pace (a pack takes time to build;
# here longer than one verify, about 0.4 s).
SWAPPER = """
import os, shutil, sys, time
from matrixctl.ingest import swap
dest, a, b, ready, stop = sys.argv[1:]
n = 0
while not os.path.exists(stop) and n < 100:
    tmp = swap.temp_name(dest)
    shutil.copytree((a, b)[n % 2], tmp)
    swap.publish(tmp, dest)
    time.sleep(1.5)
    n += 1
    if n == 1:
        open(ready, "w").close()
"""


def test_verify_during_real_replacements_always_passes(tmp_path: Path) -> None:
    dest, a, b = tmp_path / "pack", tmp_path / "a", tmp_path / "b"
    assert run_cli("ingest", "docs", str(small_corpus(tmp_path)), "-o", str(a)).code == 0
    assert run_cli("ingest", "docs", str(CORPUS), "-o", str(b)).code == 0
    shutil.copytree(a, dest)
    ready, stop = tmp_path / "ready", tmp_path / "stop"
    proc = subprocess.Popen(
        [sys.executable, "-c", SWAPPER, str(dest), str(a), str(b), str(ready), str(stop)],
        env=env(),
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + TIMEOUT
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        for _ in range(8):
            report, _ = examine(str(dest), scan=True)
            assert report.ok(), [(f.code, f.message) for f in report.findings]
    finally:
        stop.touch()
        proc.wait(timeout=TIMEOUT)
    assert proc.returncode == 0


# Symbolic links ------------------------------------------------------------------------------


def test_symlinks_in_folders_are_skipped_and_reported(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("hello world\n", encoding="utf-8")
    (src / "zero").symlink_to("/dev/zero")
    (src / "linked").symlink_to(CORPUS)
    named = tmp_path / "named.txt"
    named.symlink_to(src / "a.txt")
    dest = tmp_path / "pack"
    run = run_cli("ingest", "docs", str(src), str(named), "-o", str(dest))
    assert run.code == 0, run.stderr
    assert f"skipped {src}/zero: symbolic link" in run.stderr
    assert f"skipped {src}/linked: symbolic link" in run.stderr
    manifest = json.loads((dest / "ingest_manifest.json").read_text())
    skipped = {s["path"]: s["reason"] for s in manifest["skipped"]}
    assert skipped[f"{src}/zero"] == "symbolic link"
    assert skipped[f"{src}/linked"] == "symbolic link"
    # A link named on the command line is followed (it is the user's explicit choice); here
    # it points at a file already taken, so it is reported as a duplicate.
    assert skipped[str(named)] == "duplicate of an earlier input"
    assert [s["path"] for s in manifest["sources"]] == [f"{src}/a.txt"]


# Dying parents -------------------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as fp:
            out.extend(int(c) for c in fp.read().split())
    return out


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fp:
            state = fp.read().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return True
    return state in (b"Z", b"X")


def _atoms_written(dest: Path) -> bool:
    for name in siblings(dest):
        with contextlib.suppress(OSError):
            if os.path.getsize(dest.parent / name / "matrix_atoms.bin") > 64:
                return True
    return False


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="needs Linux /proc")
def test_killing_the_parent_ends_the_workers_silently(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    text = "".join(f"line {i} of some text to tokenize, the and of\n" for i in range(400))
    for i in range(1200):
        (src / f"f{i:04}.txt").write_text(text, encoding="utf-8")
    errfile = tmp_path / "stderr"
    with open(errfile, "wb") as err:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "matrixctl",
                "ingest",
                "docs",
                str(src),
                "-o",
                str(tmp_path / "pack"),
                "--jobs",
                "2",
            ],
            cwd=ROOT,
            env=env(),
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    deadline = time.monotonic() + TIMEOUT
    workers: list[int] = []
    while len(workers) < 2:
        assert proc.poll() is None, "the ingest ended before its workers were seen"
        assert time.monotonic() < deadline
        workers = _children(proc.pid)
        time.sleep(0.01)
    # Wait until results flow back (tokens reached the atoms file): work is then in flight.
    while not _atoms_written(tmp_path / "pack"):
        assert proc.poll() is None, "the ingest ended before its results were seen"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGSTOP)  # freeze the parent while the workers run on
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=TIMEOUT)
    while not all(_gone(w) for w in workers):
        assert time.monotonic() < deadline, "workers outlived their parent"
        time.sleep(0.01)
    assert b"Traceback" not in errfile.read_bytes()
    assert b"Error" not in errfile.read_bytes()
    # The dead run's temporary folder is removed by the next run writing the same pack.
    run = run_cli("ingest", "docs", str(CORPUS), "-o", str(tmp_path / "pack"))
    assert run.code == 0
    assert siblings(tmp_path / "pack") == []


def _ingest_state() -> object:
    from matrixctl.ingest.step import Step
    from matrixctl.ingest.tokenizer import PiIngest
    from matrixctl.tokenizers import pi

    smap, _ = pi.load_symbol_map(pi.default_map_path())
    opts = kinds_base.Options("text", "skip", "error", 1 << 20, "auto")
    return Step(PiIngest(pi.Tokenizer(smap), smap), smap.eos_id, opts, "")


def test_workers_closed_as_they_start_end_by_their_sigterm() -> None:
    """The CLI's SIGTERM handler raises an exception; a worker inherits it until it sets its
    own. Closing the workers right after the fork (an error or Ctrl-C as they start) must end
    every one by that SIGTERM: one that received it in between used to lose it in an
    "Exception ignored" and live on, and the parent waited for it forever."""
    from matrixctl.ingest.executors.processes import Processes

    def raising(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    state = _ingest_state()
    previous = signal.signal(signal.SIGTERM, raising)
    try:
        for _ in range(4):
            workers = Processes(state, 2)  # type: ignore[arg-type]
            procs = list(workers.procs)
            started = time.monotonic()
            workers.close()
            assert time.monotonic() - started < 4.0  # close() waits 5 s before SIGKILL
            assert [p.exitcode for p in procs] == [-signal.SIGTERM] * 2
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_worker_killed_midway_is_a_clear_error(tmp_path: Path) -> None:
    """A worker that dies without its reply (the kernel's out-of-memory killer, say) is
    INGEST_WORKER_LOST naming the signal: no hang, no traceback, no pack."""
    from matrixctl.errors import InputError
    from matrixctl.ingest.executors.processes import Processes
    from matrixctl.ingest.sources import enumerate_sources

    src = tmp_path / "src"
    src.mkdir()
    for i in range(40):
        (src / f"f{i:02}.txt").write_text("some text\n" * 10000, encoding="utf-8")
    files, _ = enumerate_sources([str(src)], [])
    state = _ingest_state()
    workers = Processes(state, 2)  # type: ignore[arg-type]
    try:
        spill = tmp_path / "spill"
        spill.mkdir()
        results = workers.results(files, types.SimpleNamespace(spill_dir=str(spill)))
        next(results)
        os.kill(workers.procs[0].pid, signal.SIGKILL)
        with pytest.raises(InputError) as caught:
            for _ in results:
                pass
        assert caught.value.code == "INGEST_WORKER_LOST"
        assert "killed by signal 9" in caught.value.message
    finally:
        workers.close()
