"""When each thread of a command ran, waited for a core, or slept: a timeline from the scheduler.

    python bench/sched_timeline.py [--cols 100] -- matrixctl tokenize pi encode -j 2 IN -o OUT

Records the command under `perf sched record` (the kernel's scheduler events; needs `perf` and
the right to trace, e.g. root) and prints, for every thread of the command and of the processes
it forks, the time it ran, the time it was ready but waited for a core ("ready": another
process had it, on a shared machine, or a thread of the same command when three want two
cores) and the time it slept (waiting for a lock, a pipe, a read: the part of a parallel run
the code itself leaves idle), with a line per thread in which each character is a slice of the
run: `#` ran, `+` ran most of it, `-` waited for a core, `.` slept, blank not alive.

Used by docs/benchmarks.md (tok18jobs): on a loaded machine wall time says little about a
parallel run, CPU seconds say nothing of its idle time, and the sleep column does: it is what a
quiet machine would also see. The window is from the command's first run to its last.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

LINE = re.compile(r"^\s*([\d.]+)\s+\[(\d+)\]\s+(\S+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\S+)")
TASK = re.compile(r"\[(\d+)(?:/(\d+))?\]$")
FORK = re.compile(r"pid=(\d+) child_comm=.* child_pid=(\d+)")

Interval = tuple[str, float, float]


def record(cmd: list[str], folder: str) -> tuple[str, int]:
    data = os.path.join(folder, "perf.data")
    pidfile = os.path.join(folder, "pid")
    shell = f'echo $$ > {pidfile}; exec "$@"'
    run = ["perf", "sched", "record", "-o", data, "--", "sh", "-c", shell, "sh", *cmd]
    proc = subprocess.run(
        run, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    if proc.returncode:
        sys.stderr.write(proc.stderr)
    with open(pidfile) as fp:
        return data, int(fp.read())


def descendants(data: str, root: int) -> set[int]:
    """The root and every task it forked, directly or not (threads included)."""
    script = subprocess.run(
        ["perf", "script", "-i", data, "-F", "trace"], check=True, capture_output=True, text=True
    ).stdout
    children = collections.defaultdict(list)
    for line in script.splitlines():
        m = FORK.search(line)
        if m:
            children[int(m.group(1))].append(int(m.group(2)))
    seen, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.add(pid)
            todo += children[pid]
    return seen


def intervals(data: str, keep: set[int]) -> dict[tuple[int, int], list[Interval]]:
    """(process, thread) -> intervals of ("run" | "ready" | "sleep", start, end), seconds."""
    timehist = ["perf", "sched", "timehist", "-i", data, "--state"]
    out = subprocess.run(timehist, check=True, capture_output=True, text=True).stdout
    found: dict[tuple[int, int], list[Interval]] = collections.defaultdict(list)
    state: dict[int, str] = {}
    for line in out.splitlines():
        m = LINE.match(line)
        task = TASK.search(m.group(3)) if m else None
        if not m or not task:
            continue
        tid = int(task.group(1))
        pid = int(task.group(2) or tid)
        if tid not in keep:
            continue
        end = float(m.group(1))
        wait, delay, ran = (float(m.group(i)) / 1e3 for i in (4, 5, 6))
        start = end - ran
        key = (pid, tid)
        found[key].append(("run", start, end))
        if wait > 0 and state.get(tid) not in (None, "R"):  # slept, then waited for a core
            found[key].append(("sleep", start - wait, start - delay))
            found[key].append(("ready", start - delay, start))
        elif wait > 0 or delay > 0:  # preempted (or woken): waited for a core all along
            found[key].append(("ready", start - max(wait, delay), start))
        state[tid] = m.group(7)
    return found


def report(found: dict[tuple[int, int], list[Interval]], root: int, cols: int) -> None:
    runs = [(a, b) for spans in found.values() for kind, a, b in spans if kind == "run"]
    t0 = min(a for kind, a, b in found[(root, root)] if kind == "run")
    t1 = max(b for a, b in runs)
    wall = t1 - t0
    cpu = sum(min(b, t1) - max(a, t0) for a, b in runs if b > t0)
    print(f"wall {wall * 1e3:.1f} ms from the command's first run; CPU {cpu * 1e3:.1f} ms", end="")
    print(f" ({cpu / wall:.2f} cores busy on average)")
    for (pid, tid), spans in sorted(found.items()):
        total = {"run": 0.0, "ready": 0.0, "sleep": 0.0}
        for kind, a, b in spans:
            total[kind] += max(0.0, min(b, t1) - max(a, t0))
        if total["run"] < 1e-3:
            continue
        name = "main" if pid == root else f"process {pid}"
        name += "" if tid == pid else f", thread {tid}"
        figures = "  ".join(f"{k} {v * 1e3:7.1f} ms" for k, v in total.items())
        print(f"  {name:28s} {figures}")
        row = []
        for c in range(cols):
            a, b = t0 + wall * c / cols, t0 + wall * (c + 1) / cols
            part = {"run": 0.0, "ready": 0.0, "sleep": 0.0}
            for kind, x, y in spans:
                part[kind] += max(0.0, min(b, y) - max(a, x))
            alive = sum(part.values())
            if alive < (b - a) / 2:
                row.append(" ")
            elif part["run"] >= 0.9 * (b - a):
                row.append("#")
            elif part["sleep"] >= max(part["run"], part["ready"]):
                row.append(".")
            elif part["ready"] >= part["run"]:
                row.append("-")
            else:
                row.append("+")
        print(f"  |{''.join(row)}|")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cols", type=int, default=100)
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        ap.error("no command")
    with tempfile.TemporaryDirectory(prefix="sched-timeline-") as folder:
        data, root = record(cmd, folder)
        report(intervals(data, descendants(data, root)), root, args.cols)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
