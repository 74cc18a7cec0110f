"""zTensor 2: read, verify and write against ztensor 2.1.2 and a bare hash pass.

    .venv/bin/python bench/bench_ztensor2.py            # 256 MiB workload, markdown on stdout
    .venv/bin/python bench/bench_ztensor2.py --quick    # 16 MiB, for a smoke test

Workload: one float32 tensor of 256 MiB (values from a small range, so zstd has something to
do), written raw (canonical) and zstd-seekable, by each writer. Every measurement runs in a
child process of its own; ztensor 2.1.2 runs from `.venv/ztensor2` (it cannot share the
environment with ztensor 1.1.1). Times exclude start-up and imports; best of REPEATS children
for reads (a mapping kept from a previous read would make the next one free), best of REPEATS
runs in one child for writes and verifies. The page cache is warm; nothing is dropped.

- read: file -> the tensor as a numpy array, touching one byte per 4 KiB page. ztensor:
  `np.from_dlpack(src[name])`; matrixctl: `open_source(path)` and `array(info)` (digest not
  checked on the read path in either tool).
- read, in turn (raw): PAIRS rounds of one ztensor 2.1.2 read then one matrixctl read of the
  same file, fresh processes as above; the medians of the times and of the per-round ratios
  (two reads a few milliseconds apart see the same load of a shared machine).
  In the same rounds, a bare mapped read (open, map, footer, manifest hash, CBOR manifest, a
  numpy view: no sniff, no schema, no L1 rule): the floor of any reader driven from Python, so
  that matrixctl minus bare is what its checked open costs. And matrixctl with its parse and
  structural rules done before the clock starts (`bound.py`): what its read would take if a
  compiled kernel made them free, the most a compiled port of them could give.
- read, many tensors (raw): the same rounds on a file of MANY float32 tensors of 1 MiB each
  (64 KiB with --quick), written by ztensor 2.1.2: a model's shape, where each tensor's share
  of the open (its schema, its rules, its `TensorInfo`) shows.
- verify: matrixctl's verify (every rule, digests over the decoded bytes) called as a library
  (`engine.examine(path, scan=True)`) and as the command in-process (`main(["verify", ...])`,
  typer's parsing included), against a bare XXH3-64 pass over the file's bytes through a fresh
  mapping (the anchor), and ztensor's `verify(deep=True)`.
- write: arrays in memory -> file. ztensor `Writer` (canonical; zstd at 4096 alignment);
  matrixctl `save_file` (atomic: temp file, fsync, rename), and the same without the fsync.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bound import NAME as BOUND
from bound import checks_ahead

ROOT = Path(__file__).resolve().parents[1]
REF = ROOT / ".venv" / "ztensor2"
REPEATS = 5
PAIRS = 15  # the paired raw read rows: ztensor 2.1.2 then matrixctl, in turn
MiB = 1 << 20


MANY = 100  # tensors in the many-tensor workload (a file whose name ends in "many.zt")


def data(size: int, many: bool = False):
    """One float32 tensor of `size` bytes, or MANY of `size` / MANY bytes each."""
    import numpy as np

    rng = np.random.default_rng(0)
    if many:
        n = size // MANY // 4
        return {
            f"layer.{i}.weight": (rng.integers(0, 64, n) * 0.25).astype(np.float32)
            for i in range(MANY)
        }
    return {"weight": (rng.integers(0, 64, size // 4) * 0.25).astype(np.float32)}


def touch(arr) -> int:
    import numpy as np

    flat = np.asarray(arr).reshape(-1).view(np.uint8)
    return int(flat[::4096].sum()) if flat.size else 0


def write_with(tool: str, arrays, path: str, zstd: bool) -> None:
    if tool == "ztensor 2.1.2":
        import ztensor

        with ztensor.Writer(path, canonical=not zstd, align=4096 if zstd else None) as w:
            for name in sorted(arrays):
                arr = arrays[name]
                enc = "zt.zstd-seekable/1" if zstd else None
                w.add(name, arr.view("u1"), shape=list(arr.shape), dtype="f32", encoding=enc)
            w.finish()
        return
    from matrixctl.formats.ztensor2 import save_file

    if tool.endswith("(no fsync)"):
        os.fsync = lambda fd: None  # type: ignore[assignment]
    save_file(arrays, path, compress="zstd" if zstd else None)


def read_with(tool: str, path: str) -> int:
    total = 0
    if tool == "ztensor 2.1.2":
        import numpy as np
        import ztensor

        with ztensor.open(path) as src:
            for name in src.keys():  # noqa: SIM118
                total += touch(np.from_dlpack(src[name]))
        return total
    if tool == BARE:
        return bare_read(path)
    from matrixctl.converters.tensors import open_source

    with open_source(path) as src:
        for info in src.tensors():
            total += touch(src.array(info, verify=False))
    return total


BARE = "bare mapped read"


def bare_read(path: str) -> int:
    """The mechanics alone, the floor of any reader driven from Python: open, map, the footer,
    the manifest's XXH3-64 compared with the footer's, the CBOR manifest (matrixctl's decoder,
    in C), a numpy view per dense raw tensor. No sniff, no schema, no L1 rule: not a reader
    anyone should ship; the measured floor."""
    import mmap
    import struct

    import numpy as np
    import xxhash

    from matrixctl import cbor

    total = 0
    with (
        open(path, "rb", buffering=0) as fp,
        mmap.mmap(fp.fileno(), 0, access=mmap.ACCESS_READ) as m,
    ):
        size = len(m)
        moff, mlen, mhash, _, _, _ = struct.unpack("<QQQII8s", m[size - 40 : size])
        with memoryview(m) as view:
            raw = view[moff : moff + mlen]
            if xxhash.xxh3_64_intdigest(raw) != mhash:
                raise SystemExit("manifest hash")
            manifest = cbor.loads(raw)
            raw.release()
        for obj in manifest["objects"].values():
            offset, length = obj["parts"]["data"]["blob"]
            arr = np.frombuffer(m, np.float32, length // 4, offset)
            total += touch(arr)
            del arr
    return total


def verify_with(tool: str, path: str) -> None:
    if tool == "ztensor 2.1.2":
        import ztensor

        ztensor.verify(path, deep=True)
    elif tool == "bare XXH3-64":
        import mmap

        import xxhash

        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            xxhash.xxh3_64_intdigest(m)
    elif tool == "matrixctl (library)":
        from matrixctl.validate.engine import examine

        report, _ = examine(path, scan=True)
        if not report.ok():
            raise SystemExit("verify failed")
    else:
        from matrixctl.cli.app import main

        if main(["verify", "-q", path]) != 0:
            raise SystemExit("verify failed")


def run_one(tool: str, op: str, path: str, size: int) -> float:
    zstd = path.endswith("z.zt")
    if op == "write":
        arrays = data(size, many=path.endswith("many.zt"))
        best = float("inf")
        for _ in range(REPEATS):
            if os.path.exists(path):
                os.unlink(path)
            t = time.perf_counter()
            write_with(tool, arrays, path, zstd)
            best = min(best, time.perf_counter() - t)
        return best
    if op == "verify":
        verify_with(tool, path)  # warm imports and the page cache
        best = float("inf")
        for _ in range(REPEATS):
            t = time.perf_counter()
            verify_with(tool, path)
            best = min(best, time.perf_counter() - t)
        return best
    if tool == BOUND:
        checks_ahead(path)
    with tempfile.TemporaryDirectory() as tmp:  # warm the imports on a tiny file
        tiny = os.path.join(tmp, "tiny.zt")
        import numpy as np

        write_with(
            "ztensor 2.1.2" if tool == "ztensor 2.1.2" else "matrixctl",
            {"x": np.zeros(4, np.float32)},
            tiny,
            False,
        )
        read_with(tool, tiny)
    t = time.perf_counter()
    read_with(tool, path)
    return time.perf_counter() - t


def child(tool: str, op: str, path: str, size: int, runs: int | None = None) -> float:
    env = dict(os.environ)
    if tool == "ztensor 2.1.2":
        env["PYTHONPATH"] = str(REF)
    if runs is None:
        runs = REPEATS if op == "read" else 1
    best = float("inf")
    for _ in range(runs):
        out = subprocess.run(
            [sys.executable, __file__, "--one", tool, op, path, str(size)],
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
            check=True,
        )
        best = min(best, float(out.stdout.strip()))
    return best


def rounds_in_turn(label: str, path: str, size: int, mib: float) -> list[str]:
    """PAIRS rounds of ztensor 2.1.2, matrixctl, matrixctl with its checks done ahead (the
    bound) and the bare read of `path`, each in a fresh process: the rows of their median
    times and of the medians of the per-round ratios."""
    tools = ("matrixctl", BOUND, BARE)
    theirs: list[float] = []
    times: dict[str, list[float]] = {tool: [] for tool in tools}
    ratios: dict[str, list[float]] = {tool: [] for tool in tools}
    for _ in range(PAIRS):
        theirs.append(child("ztensor 2.1.2", "read", path, size, runs=1))
        for tool in tools:
            times[tool].append(child(tool, "read", path, size, runs=1))
            ratios[tool].append(theirs[-1] / times[tool][-1])
    rows = []
    for tool, mine, per_round in (
        ("ztensor 2.1.2", theirs, None),
        ("matrixctl", times["matrixctl"], ratios["matrixctl"]),
        (BOUND, times[BOUND], ratios[BOUND]),
        (f"{BARE} (no sniff, no checks: the floor)", times[BARE], ratios[BARE]),
    ):
        secs = statistics.median(mine)
        note = (
            f"{statistics.median(per_round):.2f}x ztensor 2.1.2 (median of the per-round ratios)"
            if per_round is not None
            else "median"
        )
        rows.append(
            f"| {label} | read, {PAIRS} rounds in turn | {tool} | {secs:.4f} | {mib / secs:,.0f} | {note} |"
        )
    return rows


def main(argv: list[str]) -> int:
    if argv[:1] == ["--one"]:
        print(run_one(argv[1], argv[2], argv[3], int(argv[4])))
        return 0
    if not (REF / "ztensor").is_dir():
        raise SystemExit("ztensor 2.1.2 is not in .venv/ztensor2 (make .venv/.installed)")
    size = (16 if "--quick" in argv else 256) * MiB
    mib = size / MiB
    rows = [
        "| encoding | operation | tool | time (s) | MiB/s | ratio |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    with tempfile.TemporaryDirectory(dir=ROOT / "bench") as tmp:
        for enc in ("raw", "zstd"):
            z = "z" if enc == "zstd" else ""
            ref_path, our_path = f"{tmp}/ref{z}.zt", f"{tmp}/ours{z}.zt"
            writes = {
                "ztensor 2.1.2": child("ztensor 2.1.2", "write", ref_path, size),
                "matrixctl": child("matrixctl", "write", our_path, size),
                "matrixctl (no fsync)": child(
                    "matrixctl (no fsync)", "write", f"{tmp}/nf{z}.zt", size
                ),
            }
            same = Path(ref_path).read_bytes() == Path(our_path).read_bytes()
            for tool, secs in writes.items():
                ratio = writes["ztensor 2.1.2"] / secs
                rows.append(
                    f"| {enc} | write | {tool} | {secs:.3f} | {mib / secs:,.0f} | {ratio:.2f}x ztensor 2.1.2 |"
                )
            reads = {
                tool: child(tool, "read", ref_path, size) for tool in ("ztensor 2.1.2", "matrixctl")
            }
            for tool, secs in reads.items():
                ratio = reads["ztensor 2.1.2"] / secs
                rows.append(
                    f"| {enc} | read | {tool} | {secs:.4f} | {mib / secs:,.0f} | {ratio:.2f}x ztensor 2.1.2 |"
                )
            if enc == "raw":
                rows += rounds_in_turn(enc, ref_path, size, mib)
            verifies = {
                tool: child(tool, "verify", ref_path, size)
                for tool in ("bare XXH3-64", "matrixctl (library)", "matrixctl", "ztensor 2.1.2")
            }
            for tool, secs in verifies.items():
                ratio = verifies["bare XXH3-64"] / secs
                rows.append(
                    f"| {enc} | verify | {tool} | {secs:.3f} | {mib / secs:,.0f} | {ratio:.2f}x bare XXH3-64 |"
                )
            rows.append(
                f"| {enc} | bytes | matrixctl vs ztensor 2.1.2 output | | | {'identical' if same else 'DIFFERENT'} |"
            )
        # Many tensors (a model's shape): each tensor's share of the open shows.
        many_path = f"{tmp}/many.zt"
        child("ztensor 2.1.2", "write", many_path, MANY * (MiB if size > 16 * MiB else MiB // 16))
        each = os.path.getsize(many_path) // MANY >> 10  # KiB, the manifest's share left out
        label = f"raw, {MANY} x {each // 1024} MiB" if each >= 1024 else f"raw, {MANY} x {each} KiB"
        rows += rounds_in_turn(label, many_path, 0, os.path.getsize(many_path) / MiB)
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
