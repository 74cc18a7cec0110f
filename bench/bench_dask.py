"""Benchmark: `ingest docs --executor dask` against local `--jobs 2` (docs/scale-out.md).

    python bench/bench_dask.py [--size-mb 1024]

Corpus: the JSON Lines of bench/bench_inputs.py (every file's text of bench/corpus.py --large,
one record per file, large files cut into ~256 KiB records), --size-mb of it. Each run is
`matrixctl ingest docs JSONL -o PACK -j 2 --json` in a fresh process:
- local: `--jobs 2` (two forked worker processes);
- dask, own cluster: `--executor dask` (the command starts a LocalCluster of 2 single-threaded
  worker processes on 127.0.0.1 and stops it: what a user without a cluster pays);
- dask, running cluster: `--executor dask --scheduler ADDR` on a LocalCluster of 2
  single-threaded workers started by this script before the clock.

Overhead = dask / local - 1 (target: at most 15 %), in wall seconds and in CPU seconds of every
process involved (the command's tree; for the running cluster also the scheduler and workers
in this process's tree): on a loaded machine CPU seconds are what the load distorts least.
Per-unit overhead = (running cluster - local) / units: what the scheduler, the transfers, the
staging writes and the hash checks cost each work unit. The packs' hashes must be equal (the tests check the bytes).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_inputs  # noqa: E402

WORK = HERE / "out" / "dask"


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of the live process tree under pid, pid included."""
    total = 0.0
    try:
        with open(f"/proc/{pid}/stat") as fp:
            fields = fp.read().rsplit(")", 1)[1].split()
        total = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as fp:
                total += sum(tree_cpu(int(child)) for child in fp.read().split())
    except OSError:
        pass
    return total


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run(cmd: list[str]) -> dict:
    """Wall seconds and CPU seconds: the command's process tree (reaped, so counted in
    RUSAGE_CHILDREN) plus what this process's own tree (a running cluster) used meanwhile."""
    cpu0, own0 = children_cpu(), tree_cpu(os.getpid())
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"{cmd} failed: {proc.stderr[-2000:]}")
    doc = json.loads(proc.stdout)
    doc["wall"] = wall
    doc["cpu"] = children_cpu() - cpu0 + tree_cpu(os.getpid()) - own0
    return doc


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=1024)
    args = ap.parse_args()
    import distributed

    WORK.mkdir(parents=True, exist_ok=True)
    if not bench_inputs.CORPUS.exists():
        subprocess.run([sys.executable, str(HERE / "corpus.py"), "--large"], check=True)
    jsonl = WORK / f"corpus-{args.size_mb}.jsonl"
    if not jsonl.exists():
        bench_inputs.build_jsonl(jsonl, args.size_mb << 20)
    pack = WORK / "pack"
    base = ["matrixctl", "ingest", "docs", str(jsonl), "-o", str(pack), "-j", "2", "--json"]
    runs: dict[str, dict] = {}
    runs["local --jobs 2"] = run(base)
    runs["dask, own LocalCluster"] = run([*base, "--executor", "dask"])
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
        client.wait_for_workers(2)
        runs["dask, running cluster"] = run(
            [*base, "--executor", "dask", "--scheduler", lc.scheduler_address]
        )
    shutil.rmtree(pack, ignore_errors=True)
    hashes = {r["hash"] for r in runs.values()}
    if len(hashes) != 1:
        raise SystemExit(f"the packs differ: {hashes}")
    local = runs["local --jobs 2"]["wall"]
    units = runs["dask, running cluster"]["executor"]["units"]
    mb = jsonl.stat().st_size / 1e6
    print(f"Corpus: {mb:,.0f} MB of JSON Lines, {runs['local --jobs 2']['tokens']:,} tokens, ")
    print(f"{units} work units, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}.\n")
    cpu = runs["local --jobs 2"]["cpu"]
    print("| run | seconds | MB/s | wall vs local | CPU seconds (all processes) | CPU vs local |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, r in runs.items():
        print(
            f"| {name} | {r['wall']:.1f} | {mb / r['wall']:.1f} | {r['wall'] / local - 1:+.1%} "
            f"| {r['cpu']:.1f} | {r['cpu'] / cpu - 1:+.1%} |"
        )
    running = runs["dask, running cluster"]
    print(
        f"\nPer-unit overhead (running cluster, {units} units): "
        f"{(running['wall'] - local) / units * 1000:.0f} ms wall, "
        f"{(running['cpu'] - cpu) / units * 1000:.0f} ms CPU."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
