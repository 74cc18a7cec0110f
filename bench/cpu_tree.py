"""CPU seconds of a command and of each process it forks (sampled from /proc every 0.2 s).

    python bench/cpu_tree.py matrixctl ingest docs SRC -o PACK -j 2

Used by docs/benchmarks.md where the machine is shared: CPU seconds per process show the work
and its split between processes (and the main process's share of it, the serial side of
`ingest docs --jobs N`), which wall time on a loaded machine cannot. The last 0.2 s are not
sampled: the whole tree's exact total is `/usr/bin/time -v` of the same command.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

tck = os.sysconf("SC_CLK_TCK")


def tree(pid: int) -> list[int]:
    out = [pid]
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as fp:
                for c in fp.read().split():
                    out += tree(int(c))
    except OSError:
        pass
    return out


def cpu(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat") as fp:
            f = fp.read().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / tck
    except OSError:
        return None


t = time.perf_counter()
p = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
seen: dict[int, float] = {}
while p.poll() is None:
    for q in tree(p.pid):
        c = cpu(q)
        if c is not None:
            seen[q] = c
    time.sleep(0.2)
total = sum(seen.values())
print(
    f"wall {time.perf_counter() - t:.1f} s; CPU seconds per process:",
    {("main" if q == p.pid else f"worker {q}"): round(c, 1) for q, c in seen.items()},
    f"; main process share {seen.get(p.pid, 0.0) / total:.0%}" if total else "",
)
