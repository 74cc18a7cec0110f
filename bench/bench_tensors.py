"""Tensor containers: write, read and convert against ztensor 1.1.1, safetensors and a copy.

    .venv/bin/python bench/bench_tensors.py            # full run (~2 min), markdown on stdout
    .venv/bin/python bench/bench_tensors.py --quick    # 16 MiB workloads, for a smoke test

Workloads: (a) one 256 MiB float32 tensor, (b) 100 float32 tensors of 1 MiB.
Every measurement runs in a child process of its own (`--one ...`), so its peak memory is that
child's maximum resident set (from os.wait4); the time is measured inside the child around the
operation only (interpreter start-up and imports excluded), best of REPEATS runs (each read in a
fresh process, since a mapping kept from a previous read would make the next one free). The
page cache is warm (files were just written); nothing is dropped from it: the machine is shared.

- write: numpy arrays in memory -> file. safetensors.numpy.save_file (alone, and followed by an
  fsync of the file); ztensor.Writer; matrixctl ZtWriter through atomic_output (temp file,
  fsync, rename) with CRC-32C digests, and the same without the fsync (what the other two do).
- read: file -> every tensor as a numpy array, touching one byte per 4 KiB page (so lazy
  mappings pay for their pages). safetensors safe_open(framework="np").get_tensor; ztensor
  Reader.read_tensor (zero-copy); matrixctl open_source(...).array (zero-copy view), and the
  same with every digest checked first.
- read, in turn: PAIRS rounds of one ztensor 1.1.1 read then one matrixctl read of the same
  file (ztensor's), each in a fresh process as above; the medians of each tool's times and of
  the per-round ratios. On a shared machine the load moves a best-of-7 by more than the
  difference between the readers; two reads a few milliseconds apart see the same load, and
  one file is in one page-cache state for both (each tool reading its own file compared the
  files too: a bare read of matrixctl's file once came out at 0.80x of ztensor on its own).
  In the same rounds, a bare mapped read of the same file (open, map, footer, CBOR
  manifest, a numpy view: no sniff, no schema, no structural rule): the floor of any reader
  driven from Python, so that matrixctl minus bare is what its checked open costs. And
  matrixctl with its parse and structural rules done before the clock starts (`bound.py`):
  what its read would take if a compiled kernel made them free, the most a compiled port of
  them could give.
- convert: `matrixctl convert model.safetensors model.zt` (the whole CLI, start-up included,
  raw encoding, CRC-32C digests, fsync) against shutil.copyfile of the same file, and against
  a copy followed by fsync; and the same convert called in-process (start-up and imports
  excluded). Peak memory of the convert is reported against the largest tensor.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bound import NAME as BOUND
from bound import checks_ahead

ROOT = Path(__file__).resolve().parents[1]
REPEATS = 7  # reads of a few milliseconds: the best of 7 child processes
PAIRS = 15  # the paired read rows: ztensor 1.1.1 and matrixctl in turn, fresh processes
MiB = 1 << 20


def workloads(quick: bool) -> dict[str, list[tuple[str, int]]]:
    big = (16 if quick else 256) * MiB
    small = (MiB // 16) if quick else MiB
    return {
        "one 256 MiB tensor" if not quick else "one 16 MiB tensor": [("weight", big // 4)],
        "100 x 1 MiB tensors" if not quick else "100 x 64 KiB tensors": [
            (f"layer.{i}.weight", small // 4) for i in range(100)
        ],
    }


def arrays(spec: list[tuple[str, int]]):
    import numpy as np

    rng = np.random.default_rng(0)
    return {name: rng.standard_normal(n, dtype=np.float32) for name, n in spec}


def touch(arr) -> int:
    import numpy as np

    flat = np.asarray(arr).reshape(-1).view(np.uint8)
    return int(flat[::4096].sum()) if flat.size else 0


# One measurement, in this (child) process ---------------------------------------------------


def run_one(tool: str, op: str, spec_json: str, path: str) -> float:
    spec = [tuple(x) for x in json.loads(spec_json)]
    if op == "convert":
        from matrixctl.cli.app import main

        best = float("inf")
        for i in range(REPEATS):
            t = time.perf_counter()
            if main(["convert", path, f"{path}.{i}.zt"]) != 0:
                raise SystemExit("convert failed")
            best = min(best, time.perf_counter() - t)
        return best
    if op == "write":
        data = arrays(spec)
        best = float("inf")
        for _ in range(REPEATS):
            if os.path.exists(path):
                os.unlink(path)
            t = time.perf_counter()
            write_with(tool, data, path)
            best = min(best, time.perf_counter() - t)
        return best
    # One read per process: a mapping left over from a previous read in the same process
    # would make the next one free. Imports happen before the clock starts.
    if tool == BOUND:
        checks_ahead(path)
    warm_imports(tool)
    t = time.perf_counter()
    read_with(tool, path)
    return time.perf_counter() - t


def warm_imports(tool: str) -> None:
    """Read a tiny file of the same kind first, so every lazy import has happened."""
    import numpy as np

    base = "matrixctl" if tool.startswith("matrixctl") else tool
    with tempfile.TemporaryDirectory() as tmp:
        tiny = os.path.join(tmp, "tiny")
        write_with(base, {"x": np.zeros(4, np.float32)}, tiny)
        read_with(tool, tiny)


def write_with(tool: str, data, path: str) -> None:
    if tool.startswith("safetensors"):
        from safetensors.numpy import save_file

        save_file(data, path)
        if tool.endswith("+ fsync"):
            fd = os.open(path, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
    elif tool == "ztensor 1.1.1":
        import ztensor

        with ztensor.Writer(path) as w:
            for name, arr in data.items():
                w.add_tensor(name, arr)
    else:
        from matrixctl.formats.ztensor import ZtWriter
        from matrixctl.io import atomic_output

        if tool.endswith("(no fsync)"):
            os.fsync = lambda fd: None  # type: ignore[assignment]
        with atomic_output(path) as fp:
            w = ZtWriter(fp)
            for name, arr in data.items():
                w.add(name, arr.shape, "dense", [("data", "f32", arr.nbytes, iter([arr.data]))])
            w.finish()


def read_with(tool: str, path: str) -> None:
    total = 0
    if tool == "safetensors":
        from safetensors import safe_open

        with safe_open(path, framework="np") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                total += touch(f.get_tensor(name))
    elif tool == "ztensor 1.1.1":
        import ztensor

        with ztensor.Reader(path) as r:
            for name in r.tensor_names:
                total += touch(r.read_tensor(name))
    elif tool == BARE:
        total += bare_read(path)
    else:
        from matrixctl.converters.tensors import open_source

        with open_source(path) as src:
            verify = tool.endswith("(digests checked)")
            for info in src.tensors():
                arr = src.array(info, verify=verify)
                total += touch(arr)
                del arr


BARE = "bare mapped read"


def bare_read(path: str) -> int:
    """The mechanics alone, the floor of any reader driven from Python: open, map, the footer,
    the CBOR manifest (matrixctl's decoder, in C), a numpy view per dense tensor. No sniff, no
    schema, no structural rule: not a reader anyone should ship; the measured floor."""
    import mmap
    import struct

    import numpy as np

    from matrixctl import cbor

    total = 0
    with (
        open(path, "rb", buffering=0) as fp,
        mmap.mmap(fp.fileno(), 0, access=mmap.ACCESS_READ) as m,
    ):
        size = len(m)
        (msize,) = struct.unpack("<Q", m[size - 16 : size - 8])
        with memoryview(m) as view:
            manifest = cbor.loads(view[size - 16 - msize : size - 16])
        for obj in manifest["objects"].values():
            data = obj["components"]["data"]
            arr = np.frombuffer(m, np.float32, data["length"] // 4, data["offset"])
            total += touch(arr)
            del arr
    return total


# The parent: spawn children, collect time and peak memory -----------------------------------


def child(*args: str) -> tuple[float, float]:
    """Best time and highest peak over REPEATS children for reads, one child otherwise."""
    runs = [_child(*args) for _ in range(REPEATS if args[1] == "read" else 1)]
    return min(r[0] for r in runs), max(r[1] for r in runs)


def _child(*args: str) -> tuple[float, float]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--one", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
    )
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise SystemExit(f"child failed: {args}")
    return float(out.decode().strip()), usage.ru_maxrss / 1024


def timed_cli(args: list[str]) -> tuple[float, float]:
    best, peak = float("inf"), 0.0
    for _ in range(REPEATS):
        t = time.perf_counter()
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - t
        if status != 0:
            raise SystemExit(f"failed: {args}")
        best = min(best, elapsed)
        peak = max(peak, usage.ru_maxrss / 1024)
    return best, peak


def copy_bench(src: str, dst: str, fsync: bool) -> float:
    best = float("inf")
    for _ in range(REPEATS):
        t = time.perf_counter()
        shutil.copyfile(src, dst)
        if fsync:
            fd = os.open(dst, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        best = min(best, time.perf_counter() - t)
    return best


def main(argv: list[str]) -> int:
    if argv[:1] == ["--one"]:
        print(run_one(*argv[1:5]))
        return 0
    quick = "--quick" in argv
    rows: list[str] = []
    header = "| workload | operation | tool | time (s) | MiB/s | ratio vs anchor | peak RSS (MiB) |"
    rows += [header, "| --- | --- | --- | --- | --- | --- | --- |"]
    with tempfile.TemporaryDirectory(
        dir=ROOT / "bench" if (ROOT / "bench").is_dir() else None
    ) as tmp:
        for label, spec in workloads(quick).items():
            size_mib = sum(n * 4 for _, n in spec) / MiB
            spec_json = json.dumps(spec)
            files = {
                "safetensors": f"{tmp}/w.safetensors",
                "safetensors + fsync": f"{tmp}/w2.safetensors",
                "ztensor 1.1.1": f"{tmp}/ref.zt",
                "matrixctl": f"{tmp}/mx.zt",
                "matrixctl (no fsync)": f"{tmp}/mx2.zt",
            }
            writes = {tool: child(tool, "write", spec_json, path) for tool, path in files.items()}
            anchor = writes["safetensors"][0]
            for tool, (secs, peak) in writes.items():
                rows.append(
                    f"| {label} | write | {tool} | {secs:.3f} | {size_mib / secs:,.0f} | "
                    f"{anchor / secs:.2f}x safetensors | {peak:.0f} |"
                )
            reads = {
                "safetensors": child("safetensors", "read", spec_json, files["safetensors"]),
                "ztensor 1.1.1": child("ztensor 1.1.1", "read", spec_json, files["ztensor 1.1.1"]),
                "matrixctl": child("matrixctl", "read", spec_json, files["matrixctl"]),
                "matrixctl (digests checked)": child(
                    "matrixctl (digests checked)", "read", spec_json, files["matrixctl"]
                ),
            }
            # Like for like: each tool reading the other's file as well. A mapped read's page
            # faults depend on how the file was written (the page cache keeps it in folios as
            # large as its writes), so two tools on two files compare the files as much as
            # the readers; on the same file they do the same work (map, view, touch a byte
            # per page).
            same = {
                "ztensor 1.1.1": child("ztensor 1.1.1", "read", spec_json, files["matrixctl"]),
                "matrixctl": child("matrixctl", "read", spec_json, files["ztensor 1.1.1"]),
            }
            fastest = min(reads["safetensors"][0], reads["ztensor 1.1.1"][0])
            for tool, (secs, peak) in reads.items():
                rows.append(
                    f"| {label} | read | {tool} | {secs:.4f} | {size_mib / secs:,.0f} | "
                    f"{fastest / secs:.2f}x faster of the two | {peak:.0f} |"
                )
            for written_by, reader, other in (
                ("matrixctl", "ztensor 1.1.1", reads["matrixctl"][0]),
                ("ztensor 1.1.1", "matrixctl", reads["ztensor 1.1.1"][0]),
            ):
                secs, peak = same[reader]
                mine = secs if reader == "matrixctl" else other
                theirs = other if reader == "matrixctl" else secs
                rows.append(
                    f"| {label} | read {written_by}'s file | {reader} | {secs:.4f} | "
                    f"{size_mib / secs:,.0f} | matrixctl {theirs / mine:.2f}x ztensor 1.1.1 on "
                    f"the same file | {peak:.0f} |"
                )
            theirs_t, ours_t, bound_t, bare_t = [], [], [], []
            ratios, bound_ratios, bare_ratios = [], [], []
            for _ in range(PAIRS):
                theirs_t.append(
                    _child("ztensor 1.1.1", "read", spec_json, files["ztensor 1.1.1"])[0]
                )
                ours_t.append(_child("matrixctl", "read", spec_json, files["ztensor 1.1.1"])[0])
                bound_t.append(_child(BOUND, "read", spec_json, files["ztensor 1.1.1"])[0])
                bare_t.append(_child(BARE, "read", spec_json, files["ztensor 1.1.1"])[0])
                ratios.append(theirs_t[-1] / ours_t[-1])
                bound_ratios.append(theirs_t[-1] / bound_t[-1])
                bare_ratios.append(theirs_t[-1] / bare_t[-1])
            rows.append(
                f"| {label} | read, {PAIRS} rounds in turn | ztensor 1.1.1 | "
                f"{statistics.median(theirs_t):.4f} | {size_mib / statistics.median(theirs_t):,.0f}"
                " | median | - |"
            )
            rows.append(
                f"| {label} | read, {PAIRS} rounds in turn | matrixctl | "
                f"{statistics.median(ours_t):.4f} | {size_mib / statistics.median(ours_t):,.0f} | "
                f"matrixctl {statistics.median(ratios):.2f}x ztensor 1.1.1 (median of the "
                "per-round ratios) | - |"
            )
            rows.append(
                f"| {label} | read, {PAIRS} rounds in turn | {BOUND} | "
                f"{statistics.median(bound_t):.4f} | "
                f"{size_mib / statistics.median(bound_t):,.0f} | "
                f"{statistics.median(bound_ratios):.2f}x ztensor 1.1.1 (median of the per-round "
                "ratios) | - |"
            )
            rows.append(
                f"| {label} | read, {PAIRS} rounds in turn | {BARE} (no sniff, no checks: the "
                f"floor) | {statistics.median(bare_t):.4f} | "
                f"{size_mib / statistics.median(bare_t):,.0f} | "
                f"{statistics.median(bare_ratios):.2f}x ztensor 1.1.1 (median of the per-round "
                "ratios) | - |"
            )
            src = files["safetensors"]
            cli = [sys.executable, "-m", "matrixctl", "convert", src, f"{tmp}/conv.zt"]
            conv, conv_peak = timed_cli(cli)
            lib, lib_peak = child("matrixctl", "convert", spec_json, src)
            plain = copy_bench(src, f"{tmp}/copy.bin", fsync=False)
            synced = copy_bench(src, f"{tmp}/copy2.bin", fsync=True)
            largest = max(n * 4 for _, n in spec) / MiB
            rows.append(
                f"| {label} | copy | shutil.copyfile | {plain:.3f} | {size_mib / plain:,.0f} | "
                "anchor | - |"
            )
            rows.append(
                f"| {label} | copy | copyfile + fsync | {synced:.3f} | {size_mib / synced:,.0f} | "
                f"{plain / synced:.2f}x copy | - |"
            )
            rows.append(
                f"| {label} | convert st -> zt | matrixctl CLI | {conv:.3f} | "
                f"{size_mib / conv:,.0f} | {plain / conv:.2f}x copy, {synced / conv:.2f}x "
                f"copy+fsync | {conv_peak:.0f} (largest tensor {largest:.0f}) |"
            )
            rows.append(
                f"| {label} | convert st -> zt | matrixctl, in-process (no start-up) | {lib:.3f} | "
                f"{size_mib / lib:,.0f} | {plain / lib:.2f}x copy, {synced / lib:.2f}x "
                f"copy+fsync | {lib_peak:.0f} |"
            )
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
