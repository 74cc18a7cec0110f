"""Benchmark: `ingest docs --executor dask` against local `--jobs 2` (docs/scale-out.md).

    python bench/bench_dask.py [--size-mb 1024] [--repeat N]

Corpus: the JSON Lines of bench/bench_inputs.py (every file's text of bench/corpus.py --large,
one record per file, large files cut into ~256 KiB records), --size-mb of it. Each run is
`matrixctl ingest docs JSONL -o PACK -j 2 --json` in a fresh process:
- local: `--jobs 2` (two forked worker processes);
- dask, own cluster: `--executor dask` (the command starts a LocalCluster of 2 single-threaded
  worker processes on 127.0.0.1 and stops it: what a user without a cluster pays);
- dask, running cluster: `--executor dask --scheduler ADDR` on a LocalCluster of 2
  single-threaded workers started by this script before the clock, once with the worker
  settings docs/scale-out.md recommends (`dask_ex.QUIET_WORKERS`), once with Dask's defaults.
- the fixed cost: local and own LocalCluster on two small files.

Overhead = dask / local - 1 (target: at most 15 %), in wall seconds and in CPU seconds of every
process involved (the command's tree; for the running cluster also the scheduler and workers
in this process's tree): on a loaded machine CPU seconds are what the load distorts least.
Per-unit overhead = (dask - local) / units (for the own LocalCluster, its fixed cost taken off):
what the scheduler, the staging writes and the CRC checks cost each work unit. The packs' hashes must be equal (the tests check the bytes).
"""

from __future__ import annotations

import argparse
import importlib
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
    RUSAGE_CHILDREN) plus what this process's own tree (a running cluster) used meanwhile.
    The destination (after `-o`) is removed first, outside the clock: every run writes a new
    pack. (Until 2026-11-27 each run replaced the pack of the run before, so the Dask run,
    which came after the 660 MB local pack, also paid for deleting it, and the local run,
    which came after a tiny pack, did not.)"""
    shutil.rmtree(cmd[cmd.index("-o") + 1], ignore_errors=True)
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


def cluster(distributed, dask, settings: dict) -> object:
    with dask.config.set(settings):
        return distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=":0",
        )


def median(values: list[float]) -> float:
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=1, help="runs of each, in turn; medians")
    args = ap.parse_args()
    import dask
    import distributed

    from matrixctl.ingest.executors.dask import QUIET_WORKERS

    WORK.mkdir(parents=True, exist_ok=True)
    jsonl = WORK / f"corpus-{args.size_mb}.jsonl"
    ready = bench_inputs.WORK / f"built-{args.size_mb}"  # bench_inputs built this size already
    if not jsonl.exists() and ready.exists():
        jsonl.symlink_to(bench_inputs.WORK / "corpus.jsonl")
    if not jsonl.exists():
        if not bench_inputs.CORPUS.exists():
            subprocess.run([sys.executable, str(HERE / "corpus.py"), "--large"], check=True)
        bench_inputs.build_jsonl(jsonl, args.size_mb << 20)
    tiny = WORK / "tiny"  # two small files: what is left is the fixed cost
    if not tiny.exists():
        tiny.mkdir()
        for i in range(2):
            (tiny / f"{i}.txt").write_text(f"document {i}\n" * 100, encoding="utf-8")
    pack = WORK / "pack"

    def base(src: Path) -> list[str]:
        return ["matrixctl", "ingest", "docs", str(src), "-o", str(pack), "-j", "2", "--json"]

    own = ["--executor", "dask"]
    # A running cluster as a user starts it (Dask's defaults), and one started with the worker
    # settings docs/scale-out.md recommends (those of the command's own LocalCluster). Each is
    # up only for its own run: this process's tree is counted in that run's CPU seconds.
    settings = {
        "dask, running cluster (recommended settings)": QUIET_WORKERS,
        "dask, running cluster (Dask defaults)": {},
    }

    def on_cluster(name: str, src: Path) -> dict:
        lc = cluster(distributed, dask, settings[name])
        try:
            with distributed.Client(lc) as client:
                client.wait_for_workers(2)
                # Workers that have imported matrixctl, as after an earlier build or with
                # `dask worker --preload matrixctl.ingest.executors.dask` (docs/scale-out.md).
                client.run(importlib.import_module, "matrixctl.ingest.executors.dask")
                return run([*base(src), *own, "--scheduler", lc.scheduler_address])
        finally:
            lc.close()

    runs: dict[str, list[dict]] = {}
    fixed: dict[str, list[dict]] = {}
    # Every run of the commands on their own comes first: a cluster started in this process
    # leaves its event loop and helper threads behind after it is closed, and they would take
    # CPU from every later run (measured: local --jobs 2 at 5.0 s after a cluster, 3.5-4.0 s
    # before one).
    for _ in range(args.repeat):
        runs.setdefault("local --jobs 2", []).append(run(base(jsonl)))
        runs.setdefault("dask, own LocalCluster", []).append(run([*base(jsonl), *own]))
        fixed.setdefault("local --jobs 2", []).append(run(base(tiny)))
        fixed.setdefault("dask, own LocalCluster", []).append(run([*base(tiny), *own]))
    for _ in range(args.repeat):
        for name in settings:
            runs.setdefault(name, []).append(on_cluster(name, jsonl))
    shutil.rmtree(pack, ignore_errors=True)
    hashes = {r["hash"] for rs in runs.values() for r in rs}
    if len(hashes) != 1:
        raise SystemExit(f"the packs differ: {hashes}")
    wall = {name: median([r["wall"] for r in rs]) for name, rs in runs.items()}
    cpu = {name: median([r["cpu"] for r in rs]) for name, rs in runs.items()}
    first = runs["local --jobs 2"][0]
    units = runs["dask, own LocalCluster"][0]["executor"]["units"]
    mb = jsonl.stat().st_size / 1e6
    print(f"Corpus: {mb:,.0f} MB of JSON Lines, {first['tokens']:,} tokens, {units} Dask units, ")
    print(f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}, medians of {args.repeat}.\n")
    print("| run | seconds | MB/s | wall vs local | CPU seconds (all processes) | CPU vs local |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    lw, lc = wall["local --jobs 2"], cpu["local --jobs 2"]
    for name in runs:
        print(
            f"| {name} | {wall[name]:.1f} | {mb / wall[name]:.1f} | {wall[name] / lw - 1:+.1%} "
            f"| {cpu[name]:.1f} | {cpu[name] / lc - 1:+.1%} |"
        )
    fw = {name: median([r["wall"] for r in rs]) for name, rs in fixed.items()}
    fc = {name: median([r["cpu"] for r in rs]) for name, rs in fixed.items()}
    own_name = "dask, own LocalCluster"
    print(
        f"\nFixed cost of the own LocalCluster (2 small files): "
        f"{fw[own_name] - fw['local --jobs 2']:+.2f} s wall, "
        f"{fc[own_name] - fc['local --jobs 2']:+.2f} CPU s against local --jobs 2."
    )
    print(
        f"Per-unit overhead (own LocalCluster, {units} units, its fixed cost taken off): "
        f"{(wall[own_name] - lw - (fw[own_name] - fw['local --jobs 2'])) / units * 1000:.0f} ms "
        f"wall, {(cpu[own_name] - lc - (fc[own_name] - fc['local --jobs 2'])) / units * 1000:.0f}"
        " ms CPU."
    )
    for name in list(runs)[2:]:
        print(
            f"Per-unit overhead ({name}, {units} units): "
            f"{(wall[name] - lw) / units * 1000:.0f} ms wall, "
            f"{(cpu[name] - lc) / units * 1000:.0f} ms CPU."
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
