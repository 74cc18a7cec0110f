"""Benchmark: MATRIX-ATOM packing and verification, and CLI start-up.

    python bench/bench_atoms.py [--gib 1.0] [--out bench/out]

Measures, in one run and on the same data:
  1. `matrixctl pack atoms STREAM -o OUT --atom-size 256` against numpy `ndarray.tofile` of the
     same ids (the anchor), both as separate processes; wall time, throughput, peak RSS.
  2. `matrixctl verify OUT` against a bare `zlib.crc32` pass over the same file (the anchor).
  3. CPU time of `matrixctl --help` and `matrixctl inspect --json small.bin` against
     `python -c pass` and `python -c "import numpy"`.
Prints a markdown table with ratios against each anchor.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from matrixctl.formats.token_stream import TokenStreamWriter

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


def run(cmd: list[str], repeat: int = 1, fresh: Path | None = None) -> tuple[float, float, int]:
    """Best wall time, its CPU time (user+sys) and peak RSS (KiB) of `cmd` over `repeat` runs.

    `fresh`: an output file removed before each run, so every run writes a new file (replacing
    a 1 GiB file costs the file system a synchronous truncate and flush of the old one).
    """
    best = (float("inf"), 0.0, 0)
    for _ in range(repeat):
        if fresh is not None:
            fresh.unlink(missing_ok=True)
            subprocess.run(["sync"], check=False)
        wrapper = (
            "import resource, subprocess, sys, time\n"
            "t = time.perf_counter()\n"
            "p = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL)\n"
            "w = time.perf_counter() - t\n"
            "r = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
            "print(p.returncode, w, r.ru_utime + r.ru_stime, r.ru_maxrss)\n"
        )
        out = subprocess.run([PY, "-c", wrapper, *cmd], capture_output=True, text=True, check=True)
        code, wall, cpu, rss = out.stdout.split()
        if int(code) != 0:
            raise SystemExit(f"failed: {' '.join(cmd)}")
        if float(wall) < best[0]:
            best = (float(wall), float(cpu), int(rss))
    return best


def make_inputs(out: Path, gib: float) -> tuple[Path, Path, int]:
    """A token stream and the raw ids (.npy) of the same tokens, zipf-ish uint16 ids."""
    stream = out / "tokens.mxt"
    raw = out / "tokens.npy"
    n = int(gib * (1 << 30)) // 2
    if stream.exists() and raw.exists() and np.load(raw, mmap_mode="r").size == n:
        return stream, raw, n
    rng = np.random.default_rng(7)
    ids = np.lib.format.open_memmap(raw, mode="w+", dtype="<u2", shape=(n,))
    step = 1 << 24
    with open(stream, "wb") as fp:
        writer = TokenStreamWriter(fp, dtype="uint16", vocab_size=50000)
        for start in range(0, n, step):
            part = (rng.zipf(1.3, min(step, n - start)) % 50000).astype("<u2")
            ids[start : start + part.size] = part
            for s in range(0, part.size, 1 << 20):
                writer.write(part[s : s + (1 << 20)])
            writer.end_document(f"doc{start // step}")
        writer.close()
    ids.flush()
    del ids
    return stream, raw, n


TOFILE = """
import sys, time, numpy as np
ids = np.load(sys.argv[1])  # the same ids, in memory
t = time.perf_counter()
ids.tofile(sys.argv[2])
sys.stderr.write(f"{time.perf_counter() - t}\\n")
"""

TOFILE_SYNC = """
import os, sys, numpy as np
ids = np.load(sys.argv[1])
with open(sys.argv[2], "wb") as f:
    ids.tofile(f)
    f.flush()
    os.fsync(f.fileno())
"""

CRC = """
import sys, zlib
crc = 0
buf = bytearray(16 << 20)
view = memoryview(buf)
with open(sys.argv[1], "rb", buffering=0) as f:
    while n := f.readinto(buf):
        crc = zlib.crc32(view[:n], crc)
print(crc)
"""


def timed_inner(cmd: list[str]) -> float:
    """Time reported by the anchor script itself (excludes loading the array)."""
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return float(out.stderr.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--out", default=str(ROOT / "bench/out"))
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stream, raw, n = make_inputs(out, args.gib)
    payload = n * 2
    atoms = out / "atoms.bin"
    anchor_file = out / "tofile.bin"
    mctl = [PY, "-m", "matrixctl"]
    rows = []

    # 1. pack atoms vs tofile
    pack_cmd = [*mctl, "pack", "atoms", str(stream), "-o", str(atoms), "-n", "256", "-q"]
    pack = run(pack_cmd, args.repeat, fresh=atoms)
    tofile_total = run(
        [PY, "-c", TOFILE, str(raw), str(anchor_file)], args.repeat, fresh=anchor_file
    )
    inner = []
    for _ in range(args.repeat):
        anchor_file.unlink(missing_ok=True)
        subprocess.run(["sync"], check=False)
        inner.append(timed_inner([PY, "-c", TOFILE, str(raw), str(anchor_file)]))
    tofile_inner = min(inner)
    tofile_sync = run(
        [PY, "-c", TOFILE_SYNC, str(raw), str(anchor_file)], args.repeat, fresh=anchor_file
    )
    os.environ["MATRIXCTL_NO_FSYNC"] = "1"
    pack_nosync = run(pack_cmd, args.repeat, fresh=atoms)
    del os.environ["MATRIXCTL_NO_FSYNC"]
    gib = payload / (1 << 30)
    rows.append(("pack atoms (fsync, as shipped)", pack, gib / pack[0], tofile_inner))
    rows.append(
        ("pack atoms (MATRIXCTL_NO_FSYNC=1)", pack_nosync, gib / pack_nosync[0], tofile_inner)
    )
    rows.append(
        (
            "anchor: ndarray.tofile (write only)",
            (tofile_inner, 0, tofile_total[2]),
            gib / tofile_inner,
            tofile_inner,
        )
    )
    sync_inner = tofile_sync[0] - (tofile_total[0] - tofile_inner)  # minus loading the array
    rows.append(
        (
            "anchor 2: tofile + fsync (same durability as pack)",
            (sync_inner, 0, tofile_sync[2]),
            gib / sync_inner,
            tofile_inner,
        )
    )
    rows.append(("pack atoms (fsync) vs anchor 2", pack, gib / pack[0], sync_inner))

    # 2. verify vs zlib.crc32
    verify = run([*mctl, "verify", str(atoms)], args.repeat)
    crc = run([PY, "-c", CRC, str(atoms)], args.repeat)
    rows.append(("verify", verify, gib / verify[0], crc[0]))
    rows.append(("anchor: bare zlib.crc32 pass", crc, gib / crc[0], crc[0]))

    print(f"\n### MATRIX-ATOM: {n:,} uint16 tokens ({gib:.2f} GiB payload)\n")
    print("| what | wall s | GiB/s | ratio vs anchor | peak RSS MiB |")
    print("| --- | --- | --- | --- | --- |")
    for name, (wall, _cpu, rss), rate, anchor in rows:
        print(f"| {name} | {wall:.3f} | {rate:.2f} | {anchor / wall:.2f}x | {rss / 1024:.0f} |")

    # 3. start-up CPU time
    small = out / "small.bin"
    subprocess.run(
        [*mctl, "pack", "atoms", "-o", str(small), "-n", "4", "-q"],
        input=b"5 17 99 0 42",
        check=True,
    )
    reps = 15
    startup = [
        ("python -c pass", [PY, "-c", "pass"]),
        ('python -c "import numpy"', [PY, "-c", "import numpy"]),
        ("matrixctl --help", [*mctl, "--help"]),
        ("matrixctl inspect --json small.bin", [*mctl, "inspect", "--json", str(small)]),
        ("matrixctl inspect small.bin (rich report)", [*mctl, "inspect", str(small)]),
        ("matrixctl verify small.bin", [*mctl, "verify", str(small)]),
    ]
    print("\n### Start-up: CPU time (user+sys), best of", reps, "\n")
    print("| command | CPU ms | vs `python -c pass` | vs `import numpy` |")
    print("| --- | --- | --- | --- |")
    base = numpy_cpu = None
    for name, cmd in startup:
        cpu = min(_cpu_of(cmd) for _ in range(reps))
        base = base if base is not None else cpu
        if "import numpy" in name:
            numpy_cpu = cpu
        vs_np = f"{cpu / numpy_cpu:.2f}x" if numpy_cpu else "-"
        print(f"| {name} | {cpu * 1000:.0f} | {cpu / base:.1f}x | {vs_np} |")
    return 0


def _cpu_of(cmd: list[str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


if __name__ == "__main__":
    t0 = time.perf_counter()
    rc = main()
    sys.stderr.write(f"bench_atoms: {time.perf_counter() - t0:.0f} s\n")
    raise SystemExit(rc)
