"""SCX-TOK-V1 encode / decode throughput and peak memory, against a bare numpy copy.

    python bench/bench_scx.py [--mib 256] [--modes SCXQ2,SCXQ4] [--repeat 3] [--workdir DIR]

Data: `text` is real text (the Python standard library's sources and docs found on this
machine, concatenated in sorted path order, repeated if short) and `binary` real binary files
(shared libraries, in sorted path order). The registry holds the 1,000 most frequent lanes of
the first 16 MiB of the text (so about 1,000 composites), signed with a throw-away key.

Each measurement runs in its own child process that reports its own time (after start-up) and
its peak RSS (VmHWM from /proc/self/status): `copy` is numpy copying the whole input in
memory (best of 3; the anchor), `encode` streams the file through the library encoder
(`encode_file`: 4 MiB reads into a reused buffer; tokens counted, then dropped), `decode`
streams the encoded token stream (MXTOKENS) through the library decoder (strict_invertibility
on) into a sink that drops the bytes, `encode -j2` is encode with 2 threads (each reads its
own 1 MiB ranges), and `cli encode` is `matrixctl tokenize scx encode FILE -o OUT` end to end.
Prints a markdown table with MB/s (10^6 bytes of input per second), the ratio to the copy,
the same from process CPU time (steadier on a shared machine; for `-j2` it sums both
threads) and the peak RSS. A second table compares `encode -j2` with `encode`: the wall
ratio, the CPU ratio (what the second thread costs), the main thread's share of the -j2 CPU
(handing out ranges, yielding: the part the pool does not share), the minor page faults of
each (fresh memory touched: read buffers and the kernel's output blocks in flight) and the
speed-up two busy cores would give from those CPU seconds (2 x CPU(-j1) / CPU(-j2)).
`--repeat N` runs every encode and decode child N times and keeps the fastest (the machine may
be shared; the copy is always best of 3).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np


def collect(roots: list[str], suffixes: tuple[str, ...], size: int) -> bytes:
    """Files under `roots` whose names end with one of `suffixes`, in sorted order, until
    `size` bytes (walked lazily: stops as soon as it has enough); repeated if short."""
    out = bytearray()
    for root in roots:
        for folder, dirs, names in os.walk(root):
            dirs.sort()
            for name in sorted(names):
                if len(out) >= size:
                    break
                path = os.path.join(folder, name)
                if not name.endswith(suffixes) or os.path.islink(path):
                    continue
                try:
                    with open(path, "rb") as fp:
                        out += fp.read(size - len(out))
                except OSError:
                    continue
            if len(out) >= size:
                break
        if len(out) >= size:
            break
    if not out:
        raise SystemExit(f"no input files found under {roots}")
    while len(out) < size:
        out += out[: size - len(out)]
    return bytes(out[:size])


def text_input(size: int) -> bytes:
    stdlib = sysconfig.get_paths()["stdlib"]
    return collect([stdlib, "/usr/share/doc"], (".py", ".txt", ".rst", ".html"), size)


def binary_input(size: int) -> bytes:
    return collect(
        ["/usr/lib/x86_64-linux-gnu", sys.prefix],
        (".so", *(f".so.{i}" for i in range(10))),
        size,
    )


def child(mode: str, path: str, registry: str, trust: str, extra: str) -> None:
    from matrixctl.tokenizers.scx import api
    from matrixctl.tokenizing import decode_token_stream

    t0 = time.perf_counter()
    done = 0
    if mode == "copy":
        data = np.fromfile(path, dtype=np.uint8)
        best = cpu = float("inf")
        for _ in range(3):
            t, c = time.perf_counter(), time.process_time()
            copy = data.copy()
            best = min(best, time.perf_counter() - t)
            cpu = min(cpu, time.process_time() - c)
            del copy
        print(json.dumps({"seconds": best, "cpu": cpu, "bytes": int(data.size), "rss": _rss()}))
        return
    tok, _ = api.load_config(registry, [trust])
    if mode.startswith("encode"):
        jobs = 2 if mode == "encode-j2" else 1
        tokens = 0

        def tick(n: int) -> None:
            nonlocal done
            done += n

        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0, c0, m0 = time.perf_counter(), time.process_time(), time.thread_time()
        with open(path, "rb") as fp:
            for arr in api.encode_file(tok, fp, jobs=jobs, tick=tick):
                tokens += arr.size
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        main = time.thread_time() - m0  # the main thread alone: hands out, yields
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
        print(json.dumps({"seconds": seconds, "cpu": cpu, "main": main, "faults": faults, "bytes": done, "tokens": tokens, "rss": _rss()}))  # fmt: skip
        return
    if mode == "decode":
        t0, c0 = time.perf_counter(), time.process_time()
        with open(path, "rb") as src:
            result = decode_token_stream(tok, src, _Discard())
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        print(json.dumps({"seconds": seconds, "cpu": cpu, "bytes": result["bytes"], "rss": _rss()}))  # fmt: skip
        return
    raise SystemExit(f"unknown mode {mode}")


class _Discard:
    """A sink that drops what is written: the decode row measures decoding, not a sink (on
    this shared machine /dev/null is a regular file, so writing there costs a copy)."""

    def write(self, data: memoryview) -> int:
        return len(data)


def _rss() -> int:
    """Peak RSS of this process (VmHWM: unlike ru_maxrss it does not include the memory of
    the parent this process was forked from before exec)."""
    with open("/proc/self/status") as fp:
        for line in fp:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_child(mode: str, path: Path, registry: Path, trust: Path, repeat: int = 1) -> dict:
    """The fastest of `repeat` runs (peak RSS: the largest)."""
    runs = []
    for _ in range(repeat):
        proc = subprocess.run(
            [sys.executable, __file__, "--child", mode, str(path), str(registry), str(trust), ""],
            capture_output=True,
            text=True,
            check=True,
        )
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    best = min(runs, key=lambda r: r["seconds"])
    leanest = min(runs, key=lambda r: r["cpu"])
    main = leanest.get("main", leanest["cpu"])
    faults = min(r.get("faults", 0) for r in runs)
    rss = max(r["rss"] for r in runs)
    return {**best, "cpu": leanest["cpu"], "main": main, "faults": faults, "rss": rss}


def run_cli(args: list[str]) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.run(
        ["/usr/bin/time", "-f", "%M", sys.executable, "-m", "matrixctl", *args],
        check=True,
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "cpu": None, "rss": int(proc.stderr.strip().splitlines()[-1]) * 1024}  # fmt: skip


def make_registry(text: bytes, mode: str, work: Path) -> tuple[Path, Path]:
    from matrixctl.tokenizers.scx import registry as scx_registry
    from matrixctl.tokenizers.scx import signing

    width = 2 if mode == "SCXQ2" else 4
    sample = np.frombuffer(text[: 16 << 20], dtype=np.uint8)
    sample = sample[: sample.size // width * width].reshape(-1, width)
    keys, counts = np.unique(sample.view(f"V{width}").ravel(), return_counts=True)
    top = keys[np.argsort(-counts, kind="stable")[:1000]]
    src = {"lane_mode": mode, "composites": [{"pattern": bytes(k).hex()} for k in top]}
    rf = scx_registry.from_source(src)
    key, _ = signing.generate()
    signed = rf.with_signature(scx_registry.Signature(key.public_key, key.sign(rf.h_tok)))
    reg = work / f"{mode}.scxr"
    reg.write_bytes(signed.to_bytes())
    trust = work / f"{mode}.pub"
    trust.write_text(signing.public_line(key.public_key))
    return reg, trust


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--modes", default="SCXQ2,SCXQ4")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--child", nargs=5, default=None)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return 0
    size = args.mib << 20
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        work = Path(tmp)
        text = text_input(size)
        data = {"text": text, "binary": binary_input(size)}
        paths = {}
        for name, blob in data.items():
            paths[name] = work / f"{name}.bin"
            paths[name].write_bytes(blob)
        del data
        rows = []
        cpu_rows: dict[tuple[str, str, str], dict] = {}
        threads: list[tuple[str, str, dict, dict]] = []
        copy = {name: run_child("copy", p, p, p) for name, p in paths.items()}
        for mode in args.modes.split(","):
            reg, trust = make_registry(text, mode, work)
            for name, path in paths.items():
                anchor = copy[name]["bytes"] / copy[name]["seconds"] / 1e6
                canchor = copy[name]["bytes"] / copy[name]["cpu"] / 1e6
                rows.append((mode, name, "numpy copy (anchor)", anchor, canchor, copy[name]["rss"]))
                for label, kind in (("encode", "encode"), ("encode -j2", "encode-j2")):
                    r = run_child(kind, path, reg, trust, args.repeat)
                    mbs, cmbs = r["bytes"] / r["seconds"] / 1e6, r["bytes"] / r["cpu"] / 1e6
                    rows.append((mode, name, label, mbs, cmbs, r["rss"]))
                    cpu_rows[(mode, name, kind)] = r
                one, two = cpu_rows[(mode, name, "encode")], cpu_rows[(mode, name, "encode-j2")]
                threads.append((mode, name, one, two))
                tokens = work / f"{mode}-{name}.mxt"
                cli = run_cli(["tokenize", "scx", "encode", str(path), "-o", str(tokens), "-r", str(reg), "--trust", str(trust)])  # fmt: skip
                mbs = size / cli["seconds"] / 1e6
                rows.append((mode, name, "cli encode (to a file)", mbs, None, cli["rss"]))
                r = run_child("decode", tokens, reg, trust, args.repeat)
                mbs, cmbs = r["bytes"] / r["seconds"] / 1e6, r["bytes"] / r["cpu"] / 1e6
                rows.append((mode, name, "decode", mbs, cmbs, r["rss"]))
                tokens.unlink()
        print(
            f"| lane mode | data ({args.mib} MiB) | operation | MB/s | x copy | 1/x "
            "| CPU MB/s | CPU 1/x | peak RSS MiB |"
        )
        print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for mode, name, label, mbs, cmbs, rss in rows:
            anchor = copy[name]["bytes"] / copy[name]["seconds"] / 1e6
            canchor = copy[name]["bytes"] / copy[name]["cpu"] / 1e6
            ratio = mbs / anchor
            cpu = f"{cmbs:,.0f} | {canchor / cmbs:.1f}" if cmbs else "- | -"
            print(
                f"| {mode} | {name} | {label} | {mbs:,.0f} | {ratio:.3f} | {1 / ratio:.1f} | "
                f"{cpu} | {rss / 2**20:,.0f} |"
            )
        print()
        print(
            "| lane mode | data | -j2 / -j1 wall | -j2 / -j1 CPU | main thread, share of -j2 CPU "
            "| page faults -j1 / -j2 | bound from CPU |"
        )
        print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
        for mode, name, one, two in threads:
            # With both threads busy, -j2 cannot beat 2 x the -j1 CPU / the -j2 CPU (two cores)
            bound = 2 * one["cpu"] / two["cpu"]
            print(
                f"| {mode} | {name} | {one['seconds'] / two['seconds']:.2f}x | "
                f"{two['cpu'] / one['cpu']:.2f} | {two['main'] / two['cpu']:.1%} | "
                f"{one['faults']:,} / {two['faults']:,} | {bound:.2f}x |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
