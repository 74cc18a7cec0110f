"""`matrixctl convert` between every lossless container pair against `cp` of the same bytes.

    .venv/bin/python bench/bench_convert.py              # full run (~5 min), markdown on stdout
    .venv/bin/python bench/bench_convert.py --quick      # 16 MiB workloads, a smoke test
    .venv/bin/python bench/bench_convert.py --only safetensors:ztensor   # one pair
    .venv/bin/python bench/bench_convert.py --editable   # time the development install instead
    .venv/bin/python bench/bench_convert.py --workload 300 --floor   # one workload, with its floor

Workloads (float32, random values): "4 x 64 MiB" (a 256 MiB model of a few big tensors),
"300 x 256 KiB" (75 MiB in hundreds of small tensors), and "1 x 256 MiB" for the pairs with
.npy, which holds one tensor. The inputs are written once per workload (safetensors by the
safetensors package, the others by `matrixctl convert` from it); the page cache is warm and
nothing is dropped from it.

What is timed is an installed copy, as a user has it: a wheel of this tree, built and
installed (bytecode compiled, as pip does) into a scratch virtual environment whose
site-packages reaches the running environment's for the dependencies (a path line). The
development install (`pip install -e`, `--editable`) adds the import hook setuptools installs
for an editable project: about 50 M instructions of start-up (pathlib, urllib and the
finder's own work) that no installed copy pays.

Each row times whole processes, start-up included: `matrixctl convert IN OUT`, by the
console script pip installs beside the interpreter, as a user runs it (it writes a temporary
file, fsyncs it and renames it: the output is on disk when it returns) against two anchors copying the input file: `cp IN X && sync X` (the same durability:
coreutils' `sync FILE` fsyncs the copy) and a bare `cp IN X` (no fsync: the page cache only).
The three commands run in turn, REPEATS rounds; every figure is the median over the rounds, and
each ratio is the median of the per-round ratios (anchor time / convert time: 0.5x means
convert takes twice as long as the anchor). Wall time and CPU time (user + system of the
process and its children, from os.wait4) are both given: on a machine other jobs share, the
CPU ratio is the steadier one.

`--floor` adds a third command to each round: the least a Python process can do for the
same result, `python -c` importing every module the convert imported (listed by a probe run of
the same convert) and then copying the input into a temporary file inside the kernel
(copy_file_range), fsyncing it, renaming it over an output and fsyncing the folder, as the
convert's atomic output does; no parsing, no checks, no per-tensor work.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"  # gitignored: the inputs and outputs are big
REPEATS = 5
MiB = 1 << 20
EXT = {
    "safetensors": ".safetensors",
    "ztensor": ".zt",
    "npz": ".npz",
    "stb": ".stb",
    "embd": ".weights",
    "npy": ".npy",
}
MANY = ("safetensors", "ztensor", "npz", "stb", "embd")
# EMBD needs the model's description; any values do for a copy of tensors.
EMBD_META = [
    f"--meta={k}={v}"
    for k, v in (
        ("model_name", "bench"),
        ("embedding_dim", 1),
        ("vocab_size", 1),
        ("num_layers", 1),
        ("num_attention_heads", 1),
        ("hidden_size", 1),
        ("intermediate_size", 1),
        ("max_position_emb", 1),
    )
]


def workloads(quick: bool) -> dict[str, tuple[list[tuple[str, int]], tuple[str, ...]]]:
    """label -> ([(tensor name, float32 count)], formats)."""
    scale = 16 if quick else 1
    big = 64 * MiB // 4 // scale
    small = 256 * 1024 // 4 // scale
    return {
        f"4 x {64 // scale} MiB": ([(f"w{i}", big) for i in range(4)], MANY),
        f"300 x {256 // scale} KiB": ([(f"layer.{i}.weight", small) for i in range(300)], MANY),
        f"1 x {256 // scale} MiB": ([("w", 4 * big)], (*MANY, "npy")),
    }


def run(args: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process and its children) of one command."""
    t = time.perf_counter()
    # Not from the source tree: `python -m` puts the working folder first on the path.
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=OUT)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    if status != 0:
        raise SystemExit(f"failed: {' '.join(args)}\n{err.decode(errors='replace')}")
    return wall, usage.ru_utime + usage.ru_stime


PYTHON = sys.executable  # the interpreter that runs matrixctl (installed_python replaces it)


def installed_python(where: Path) -> str:
    """The interpreter of a scratch virtual environment under `where` holding matrixctl
    installed from a wheel of this tree (built with pip, C kernels included); the running
    environment's site-packages is on its path for the dependencies. Its `.pth` files are not
    read from there, so the editable install's import hook stays out."""
    import sysconfig
    import venv

    wheels = where / "wheel"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--quiet",
            "-w",
            str(wheels),
            str(ROOT),
        ],
        check=True,
    )
    env = where / "venv"
    venv.create(env, with_pip=False, clear=True)
    python = str(env / "bin" / "python")
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(purelib, "_matrixctl_bench_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    (wheel,) = wheels.glob("matrixctl-*.whl")
    install = ["install", "--no-deps", "--quiet", "--force-reinstall", str(wheel)]
    subprocess.run([sys.executable, "-m", "pip", "--python", python, *install], check=True)
    found = subprocess.run(
        [python, "-c", "import matrixctl; print(matrixctl.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd=OUT,
    ).stdout
    assert found.startswith(str(env)), found
    return python


def convert_args(src: str, dst: str, dst_fmt: str) -> list[str]:
    return ["convert", src, dst, *(EMBD_META if dst_fmt == "embd" else [])]


def console(python: str) -> list[str]:
    """The `matrixctl` command beside the interpreter `python`, as a user runs it (the console
    script pip writes: no `runpy`, about 5 ms less than `python -m matrixctl`); `python -m
    matrixctl` where there is none."""
    script = Path(python).with_name("matrixctl")
    return [str(script)] if script.is_file() else [python, "-m", "matrixctl"]


def convert_cmd(src: str, dst: str, dst_fmt: str) -> list[str]:
    """`matrixctl convert ...` by the console script beside PYTHON."""
    return [*console(PYTHON), *convert_args(src, dst, dst_fmt)]


def prepare(tmp: Path, spec: list[tuple[str, int]], formats: tuple[str, ...]) -> dict[str, str]:
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    st = tmp / "in.safetensors"
    save_file({name: rng.standard_normal(n, dtype=np.float32) for name, n in spec}, str(st))
    inputs = {"safetensors": str(st)}
    for fmt in formats:
        if fmt != "safetensors":
            path = str(tmp / f"in{EXT[fmt]}")
            run(convert_cmd(str(st), path, fmt))
            inputs[fmt] = path
    return inputs


PROBE = "import sys\nfrom matrixctl.cli.entry import main\nmain(sys.argv[1:])\nprint(*sys.modules)"
FLOOR = """
import os, sys
src, dst, names = sys.argv[1], sys.argv[2], sys.argv[3:]
for name in names:
    __import__(name)
tmp = dst + ".tmp"
fin = os.open(src, os.O_RDONLY)
out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
size, done = os.fstat(fin).st_size, 0
while done < size:
    done += os.copy_file_range(fin, out, size - done, done)
os.fsync(out)
os.close(out)
os.replace(tmp, dst)
folder = os.open(os.path.dirname(dst), os.O_RDONLY)
os.fsync(folder)
os._exit(0)
"""


def floor_cmd(args: list[str], src: str, tmp: Path) -> list[str]:
    """The floor of `matrixctl ARGS` (see --floor): its interpreter importing what it imports,
    then a kernel copy of `src` with the atomic output's fsyncs."""
    probe = subprocess.run(
        [PYTHON, "-c", PROBE, *args], capture_output=True, text=True, check=True, cwd=OUT
    )
    names = [n for n in probe.stdout.split() if n != "__main__"]
    return [PYTHON, "-c", FLOOR, src, str(tmp / "floor.out"), *names]


def measure(src: str, dst: str, dst_fmt: str, tmp: Path, floor: bool = False) -> dict[str, float]:
    copy = str(tmp / "copy.bin")
    conv = convert_cmd(src, dst, dst_fmt)
    args = convert_args(src, dst, dst_fmt)
    synced = ["sh", "-c", 'cp "$1" "$2" && sync "$2"', "sh", src, copy]
    bare = ["cp", src, copy]
    commands = [conv, synced, bare]
    if floor:
        commands.append(floor_cmd(args, src, tmp))
    rounds: list[list[tuple[float, float]]] = []
    run(conv)  # warm-up: imports cached, output folder primed
    for _ in range(REPEATS):
        rounds.append([run(cmd) for cmd in commands])
    med = statistics.median
    got = {
        "wall": med(r[0][0] for r in rounds),
        "cpu": med(r[0][1] for r in rounds),
        "sync_wall": med(r[1][0] for r in rounds),
        "cp_wall": med(r[2][0] for r in rounds),
        "sync_ratio": med(r[1][0] / r[0][0] for r in rounds),
        "cp_ratio": med(r[2][0] / r[0][0] for r in rounds),
        "sync_cpu_ratio": med(r[1][1] / r[0][1] for r in rounds),
        "cp_cpu_ratio": med(r[2][1] / r[0][1] for r in rounds),
    }
    if floor:
        got["floor_wall"] = med(r[3][0] for r in rounds)
        got["floor_ratio"] = med(r[1][0] / r[3][0] for r in rounds)
    return got


def main(argv: list[str]) -> int:
    global PYTHON
    quick = "--quick" in argv
    only = argv[argv.index("--only") + 1] if "--only" in argv else None
    workload = argv[argv.index("--workload") + 1] if "--workload" in argv else ""
    floor = "--floor" in argv
    rows = [
        "| workload | convert | convert wall (s) | cp + sync wall (s) | cp wall (s) | "
        "vs cp + sync: wall, CPU | vs cp: wall, CPU |"
        + (" floor wall (s) | floor vs cp + sync: wall |" if floor else ""),
        "| --- | --- | --- | --- | --- | --- | --- |" + (" --- | --- |" if floor else ""),
    ]
    out = OUT
    out.mkdir(exist_ok=True)
    if "--editable" in argv:
        sys.stderr.write(f"timing the development install ({sys.executable})\n")
    else:
        PYTHON = installed_python(out / "installed")
        sys.stderr.write(f"timing an installed wheel ({PYTHON})\n")
    with tempfile.TemporaryDirectory(dir=out) as name:
        tmp = Path(name)
        for label, (spec, formats) in workloads(quick).items():
            if not label.startswith(workload):
                continue
            inputs = prepare(tmp, spec, formats)
            # The inputs just written are still being written out (about 1.3 GB for the first
            # workload): the first pairs' fsyncs queued behind that (0.41-0.46x for
            # safetensors -> zTensor and -> STB, the first rows, 0.7-0.9x later). Settled
            # first, outside the clock, for every command alike.
            os.sync()
            for s in formats:
                for d in formats:
                    if s == d or (only and only != f"{s}:{d}"):
                        continue
                    if "npy" in formats and "npy" not in (s, d):
                        continue  # the one-tensor workload is for the .npy pairs
                    m = measure(inputs[s], str(tmp / f"out{EXT[d]}"), d, tmp, floor)
                    rows.append(
                        f"| {label} | {s} -> {d} | {m['wall']:.3f} | {m['sync_wall']:.3f} | "
                        f"{m['cp_wall']:.3f} | {m['sync_ratio']:.2f}x, "
                        f"{m['sync_cpu_ratio']:.2f}x | {m['cp_ratio']:.2f}x, "
                        f"{m['cp_cpu_ratio']:.2f}x |"
                        + (f" {m['floor_wall']:.3f} | {m['floor_ratio']:.2f}x |" if floor else "")
                    )
                    sys.stderr.write(rows[-1] + "\n")
            for path in tmp.iterdir():
                path.unlink()
    what = "the development install" if "--editable" in argv else "an installed wheel"
    print(f"convert timed from {what}\n")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
