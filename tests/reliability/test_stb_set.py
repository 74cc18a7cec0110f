"""STB sets (`NAME.stb`, `NAME.1.stb`, ... and the `NAME.stb.json` sidecar) appear whole or not
at all: `convert` publishes them through `matrixctl.io.output_set` (every file synced under a
temporary name, gathered in a folder whose rename is the commit point, then renamed into
place, sidecar last). A kill after the commit point leaves a set folder that the next run
writing into the folder completes; until then `verify` of a file of the set reports TORN_SET.
docs/reliability.md, "Crash consistency"."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from tests.helpers.cli import ROOT, run_cli

NAMES = ["o.stb", "o.1.stb", "o.2.stb", "o.stb.json"]


def _digests(folder: Path) -> list[str | None]:
    return [
        hashlib.sha256((folder / n).read_bytes()).hexdigest() if (folder / n).exists() else None
        for n in NAMES
    ]


def _killpoint(n: int, countfile: Path, argv: list[str]) -> int:
    res = subprocess.run(
        [sys.executable, "-m", "tests.helpers.killpoint", str(n), str(countfile), *argv],
        cwd=ROOT,
        capture_output=True,
        check=False,
        timeout=120,
    )
    assert b"Traceback" not in res.stderr, res.stderr.decode()
    return res.returncode


def test_an_stb_set_killed_at_every_step_is_whole_or_completed_by_the_next_run(
    tmp_path: Path,
) -> None:
    src = tmp_path / "src.npz"
    rng = np.random.default_rng(3)
    np.savez(src, **{k: rng.standard_normal(4000).astype(np.float32) for k in "abc"})
    small = tmp_path / "small.npz"
    np.savez(small, a=np.ones(3, dtype=np.float32), b=np.zeros(2, dtype=np.float32))
    out = tmp_path / "out"
    out.mkdir()
    dest = str(out / "o.stb")
    argv = ["convert", str(src), dest, "--per-file", "1"]
    countfile = tmp_path / "steps"
    assert _killpoint(0, countfile, argv) == 0
    steps = int(countfile.read_text())
    complete = _digests(out)
    assert None not in complete
    # Every step when there are few, else 40 spread evenly from the first to the last.
    points = (
        list(range(1, steps + 1)) if steps <= 60 else [1 + (steps - 1) * i // 39 for i in range(40)]
    )
    assert len(points) >= 20, steps
    torn = 0
    for i, point in enumerate(points):
        for name in os.listdir(out):
            path = out / name
            if path.is_dir():
                import shutil

                shutil.rmtree(path)
            else:
                path.unlink()
        if i % 2:  # a previous set: two files, other data
            assert run_cli("convert", str(small), dest, "--per-file", "1").code == 0
        before = _digests(out)
        code = _killpoint(point, countfile, argv)
        after = _digests(out)
        states = {
            "previous" if a == b else "complete" if a == c else "MIXED"
            for a, b, c in zip(after, before, complete, strict=True)
        }
        assert "MIXED" not in states, (point, after)
        if code == 0:
            assert states == {"complete"}, point
        if len(states) > 1:  # killed between the commit point and the last rename
            torn += 1
            for name in NAMES:  # verify names the torn set, whichever file it is given
                if (out / name).exists():
                    res = run_cli("verify", str(out / name))
                    assert res.code == 1 and "TORN_SET" in res.stderr, (point, res.stderr)
            # The next run writing into the folder completes the set.
            assert run_cli("convert", str(small), str(out / "other.npz")).code == 0
            assert _digests(out) == complete, point
        if _digests(out) == complete:
            assert run_cli("verify", str(out / "o.stb.json")).code == 0
        if (out / "o.stb").exists():
            assert run_cli("verify", str(out / "o.stb")).code in (0, 1)  # never a crash
    # A full run after all the kills: the complete set, no temporary name left behind.
    assert _killpoint(0, countfile, argv) == 0
    assert _digests(out) == complete
    assert sorted(n for n in os.listdir(out) if n.startswith(".")) == []
    assert torn >= 1, "no kill landed between the commit point and the last rename"


def _dead_set(out: Path, members: dict[str, bytes], placed: list[str]) -> Path:
    """A set a killed run committed in `out` (its owner dead): `placed` already renamed into
    place, the other members still in the set folder."""
    made = subprocess.run(  # the folder named by a process that is gone once it returns
        [
            sys.executable,
            "-c",
            "import os, sys; from matrixctl.io import sibling_temp_name; "
            "p = sibling_temp_name(sys.argv[1]); os.mkdir(p); print(p)",
            str(out / "o.stb.set"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    folder = Path(made.stdout.strip())
    (folder / "set-order").write_text("".join(n + "\n" for n in members))
    for name, data in members.items():
        (out / name if name in placed else folder / name).write_bytes(data)
    return folder


def test_a_dead_set_is_completed_unless_a_member_put_in_place_was_removed(tmp_path: Path) -> None:
    """The crash campaign caught this: a torn set (o.stb in place, the sidecar in the set
    folder), its outputs then removed, and the next run published the old sidecar alone."""
    small = tmp_path / "small.npz"
    np.savez(small, a=np.ones(3, dtype=np.float32))
    members = {"o.stb": b"new data", "o.stb.json": b"{}"}
    for removed in (False, True):
        out = tmp_path / f"out{int(removed)}"
        out.mkdir()
        _dead_set(out, members, placed=["o.stb"])
        res = run_cli("verify", str(out / "o.stb"))
        assert res.code == 1 and "TORN_SET" in res.stderr, res.stderr
        if removed:
            (out / "o.stb").unlink()
        # The next run writing into the folder: completes the set, or drops what is left.
        assert run_cli("convert", str(small), str(out / "other.npz")).code == 0
        assert not [n for n in os.listdir(out) if n.startswith(".")]
        if removed:
            assert not (out / "o.stb").exists() and not (out / "o.stb.json").exists()
        else:
            assert (out / "o.stb").read_bytes() == b"new data"
            assert (out / "o.stb.json").read_bytes() == b"{}"
