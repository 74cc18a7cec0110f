"""Benchmark: `ingest docs` on the corpora people have (docs/inputs.md).

    python bench/bench_inputs.py [--size-mb 1024] [--rss-gb 4] [--repeat 3]

Corpus: bench/corpus.py --large (Debian documentation packages: Python, Rust, OpenJDK,
PostgreSQL, Ruby, Perl, Git, Django, the Debian handbook and reference; about 1 GB of pages as
stored). Every file's text, as stored (HTML pages as HTML, like a web crawl dump), becomes one
JSON Lines record (files over 1 MiB are cut at line ends into records of about 256 KiB), in
the corpus' sorted order, until --size-mb of JSON Lines are written: real text, no record
repeated. From it: the same file gzip'd (isal, level 3, its highest) and zstd'd (level 3), and a folder of
Parquet shards (128 MiB of text each, row groups of 64 MiB).

Measured, each in a fresh child process. Peak RSS: the largest resident set of any one process
(getrusage of a wrapper process), and the largest sum over the process tree (main process and
workers, sampled every 0.1 s from /proc):
- the tokenizer alone: the bundled map's `Tokenizer.encode` over every record's text, the same
  documents `ingest docs` tokenizes (the JSON is parsed before the clock starts);
- `ingest docs` on the JSONL with --jobs 1 and --jobs 2; on the .gz and the .zst with --jobs 1;
  on the Parquet folder with --jobs 1;
- peak RSS of `ingest docs --jobs 2` on --rss-gb GB of JSON Lines (the JSONL written again
  under four names, so the input is that large).

Prints markdown tables with the ratios the targets in docs/benchmarks.md name.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"
CORPUS = OUT / "corpus-large"
WORK = OUT / "inputs"
RECORD = 256 << 10

WRAP = r"""
import json, os, resource, subprocess, sys, time

def tree(pid):
    out = [pid]
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as fp:
                for child in fp.read().split():
                    out += tree(int(child))
    except OSError:
        pass
    return out

def rss(pid):
    try:
        with open(f"/proc/{pid}/statm") as fp:
            return int(fp.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0

t = time.perf_counter()
proc = subprocess.Popen(json.loads(sys.argv[1]), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
peak_sum = 0
import threading
outs = {}
def drain(name, stream):
    outs[name] = stream.read()
threads = [threading.Thread(target=drain, args=(n, s)) for n, s in (("out", proc.stdout), ("err", proc.stderr))]
for th in threads:
    th.start()
while proc.poll() is None:
    peak_sum = max(peak_sum, sum(rss(p) for p in tree(proc.pid)))
    time.sleep(0.1)
for th in threads:
    th.join()
wall = time.perf_counter() - t
print(json.dumps({"wall": wall, "code": proc.returncode, "out": outs["out"].decode()[-4000:],
                  "err": outs["err"].decode()[-2000:], "rss_sum": peak_sum,
                  "rss": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024,
                  "cpu": resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
                  + resource.getrusage(resource.RUSAGE_CHILDREN).ru_stime}))
"""

TOKENIZE = r"""
import json, sys, time
from matrixctl.tokenizers import pi
tok = pi.Tokenizer(pi.load_symbol_map(pi.default_map_path())[0])
texts = []
with open(sys.argv[1], "rb") as fp:
    for line in fp:
        texts.append(json.loads(line)["text"].replace("\r\n", "\n"))
t = time.perf_counter()
c = time.process_time()
n = sum(tok.encode(s).size for s in texts)
print(json.dumps({"seconds": time.perf_counter() - t, "cpu": time.process_time() - c, "tokens": n}))
"""


def measure(cmd: list[str]) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", WRAP, json.dumps(cmd)], capture_output=True, text=True, check=True
    )
    doc: dict = json.loads(proc.stdout)
    if doc["code"] != 0:
        raise SystemExit(f"{cmd} failed: {doc['err']}")
    return doc


def build_jsonl(path: Path, size: int) -> int:
    files = sorted(p for p in CORPUS.rglob("*") if p.is_file() and not p.is_symlink())
    written = 0
    with open(path, "w", encoding="utf-8") as out:
        for f in files:
            text = f.read_bytes().decode("utf-8", "replace")
            if "\0" in text or not text.strip():
                continue
            parts = [text]
            if len(text) > 4 * RECORD:
                parts, pos = [], 0
                while pos < len(text):
                    cut = text.find("\n", pos + RECORD)
                    cut = len(text) if cut < 0 else cut + 1
                    parts.append(text[pos:cut])
                    pos = cut
            for part in parts:
                line = json.dumps({"text": part, "source": str(f.relative_to(CORPUS))})
                out.write(line + "\n")
                written += len(line.encode("utf-8")) + 1
                if written >= size:
                    return written
    return written


def build(size_mb: int) -> dict[str, Path]:
    WORK.mkdir(parents=True, exist_ok=True)
    jsonl = WORK / "corpus.jsonl"
    stamp = WORK / f"built-{size_mb}"
    if not CORPUS.exists() and not stamp.exists():
        subprocess.run([sys.executable, str(HERE / "corpus.py"), "--large"], check=True)
    paths = {
        "jsonl": jsonl,
        "gz": WORK / "corpus.jsonl.gz",
        "zst": WORK / "corpus.jsonl.zst",
        "parquet": WORK / "parquet",
    }
    if stamp.exists():
        return paths
    for old in WORK.glob("built-*"):
        old.unlink()
    shutil.rmtree(WORK / "rss", ignore_errors=True)  # copies of an older corpus.jsonl
    build_jsonl(jsonl, size_mb << 20)
    from isal import igzip

    with open(jsonl, "rb") as src, igzip.open(paths["gz"], "wb", compresslevel=3) as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    import zstandard

    with open(jsonl, "rb") as src, open(paths["zst"], "wb") as dst:
        zstandard.ZstdCompressor(level=3).copy_stream(src, dst)
    import pyarrow
    from pyarrow import parquet

    shutil.rmtree(paths["parquet"], ignore_errors=True)
    paths["parquet"].mkdir()
    shard: list[str] = []
    size = n = 0

    def flush() -> None:
        nonlocal shard, size, n
        if shard:
            name = paths["parquet"] / f"train-{n:05}.parquet"
            parquet.write_table(
                pyarrow.table({"text": shard}), name, row_group_size=max(1, len(shard) // 2)
            )
            n += 1
            shard, size = [], 0

    with open(jsonl, "rb") as fp:
        for line in fp:
            text = json.loads(line)["text"]
            shard.append(text)
            size += len(text)
            if size >= 128 << 20:
                flush()
    flush()
    stamp.write_text("")
    return paths


def ingest(src: Path, jobs: int, tag: str) -> dict:
    out = WORK / f"pack-{tag}"
    cmd = ["matrixctl", "ingest", "docs", str(src), "-o", str(out), "-j", str(jobs), "--json"]
    doc = measure(cmd)
    summary = json.loads(doc["out"])
    shutil.rmtree(out, ignore_errors=True)
    doc["tokens"] = summary["tokens"]
    doc["documents"] = summary["documents"]
    return doc


def median_run(docs: list[dict]) -> dict:
    """The run of median wall time (its CPU and memory figures come with it)."""
    return sorted(docs, key=lambda d: d["wall"])[len(docs) // 2]


def paired(rounds: list[dict[str, dict]], base: str, name: str) -> float:
    """Median over the rounds of base's time / name's time (a speed ratio, as "vs")."""
    return statistics.median(r[base]["wall"] / r[name]["wall"] for r in rounds)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument(
        "--repeat", type=int, default=3, help="rounds of every command (medians reported)"
    )
    ap.add_argument("--rss-gb", type=float, default=4.0)
    ap.add_argument("--only-rss", action="store_true", help="only the peak RSS measurement")
    args = ap.parse_args()
    paths = build(args.size_mb)
    if args.only_rss:
        print("| target | measured | met |")
        print("| --- | ---: | --- |")
        measure_rss(paths["jsonl"], args.rss_gb)
        return 0
    mb = paths["jsonl"].stat().st_size / 1e6
    commands = {
        "jsonl --jobs 1": (paths["jsonl"], 1, "j1"),
        "jsonl --jobs 2": (paths["jsonl"], 2, "j2"),
        "jsonl.gz --jobs 1": (paths["gz"], 1, "gz"),
        "jsonl.zst --jobs 1": (paths["zst"], 1, "zst"),
        "parquet folder --jobs 1": (paths["parquet"], 1, "pq"),
    }
    # Rounds: every command once per round, in the same order, so a slow stretch of the
    # machine hits every command of that round alike; the ratios are taken within each round
    # and their median reported (a ratio of medians would pair runs of different rounds).
    rounds: list[dict[str, dict]] = []
    for _ in range(args.repeat):
        tok = json.loads(
            subprocess.run(
                [sys.executable, "-c", TOKENIZE, str(paths["jsonl"])],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        one = {"tokenizer alone": {"wall": tok["seconds"], "cpu": tok["cpu"]}}
        for name, (src, jobs, tag) in commands.items():
            one[name] = ingest(src, jobs, tag)
        rounds.append(one)
    runs = {name: median_run([r[name] for r in rounds]) for name in rounds[0]}
    first = rounds[0]["jsonl --jobs 1"]
    print(f"Corpus: {mb:,.0f} MB of JSON Lines ({first['documents']:,} records, ")
    print(f"{first['tokens']:,} tokens), {os.cpu_count()} cores, {args.repeat} rounds ")
    print("(medians; ratios are medians of the ratios within each round).\n")
    print(
        "| run | seconds (min-max) | MB/s | vs jsonl --jobs 1 | CPU s (all processes) "
        "| peak RSS MB (process / tree) |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, doc in runs.items():
        walls = [r[name]["wall"] for r in rounds]
        rss = f"{doc['rss'] / 1e6:.0f} / {doc['rss_sum'] / 1e6:.0f}" if "rss" in doc else ""
        vs = paired(rounds, "jsonl --jobs 1", name)
        print(
            f"| {name} | {doc['wall']:.2f} ({min(walls):.2f}-{max(walls):.2f}) | "
            f"{mb / doc['wall']:.1f} | {vs:.2f}x | {doc['cpu']:.1f} | {rss} |"
        )
    print()
    print("| target | measured (median of rounds; range) | met |")
    print("| --- | ---: | --- |")
    checks = [
        ("jsonl --jobs 2 speed-up >= 1.8x", "jsonl --jobs 1", "jsonl --jobs 2", 1.8, True),
        (
            "jsonl --jobs 1 / tokenizer alone >= 0.8x",
            "tokenizer alone",
            "jsonl --jobs 1",
            0.8,
            True,
        ),
        ("gz time / jsonl time <= 1.15x", "jsonl.gz --jobs 1", "jsonl --jobs 1", 1.15, False),
        ("zst time / jsonl time <= 1.15x", "jsonl.zst --jobs 1", "jsonl --jobs 1", 1.15, False),
        (
            "parquet time / jsonl time <= 1.0x",
            "parquet folder --jobs 1",
            "jsonl --jobs 1",
            1.0,
            False,
        ),
    ]
    for name, num, den, bound, above in checks:
        values = [r[num]["wall"] / r[den]["wall"] for r in rounds]
        value = statistics.median(values)
        ok = value >= bound if above else value <= bound
        print(
            f"| {name} | {value:.2f}x ({min(values):.2f}-{max(values):.2f}) | "
            f"{'yes' if ok else 'no'} |"
        )
    if args.rss_gb > 0:
        measure_rss(paths["jsonl"], args.rss_gb)
    return 0


def measure_rss(jsonl: Path, gb: float) -> None:
    if gb > 0:
        big = WORK / "rss"
        big.mkdir(exist_ok=True)
        copies = max(1, round(gb * 1e9 / jsonl.stat().st_size))
        for old in big.glob("part-*.jsonl"):
            if int(old.stem.split("-")[1]) >= copies:
                old.unlink()
        for i in range(copies):
            target = big / f"part-{i}.jsonl"
            if not target.exists():
                shutil.copyfile(jsonl, target)
        total = sum(p.stat().st_size for p in big.iterdir()) / 1e9
        t = time.perf_counter()
        doc = ingest(big, 2, "rss")
        print(
            f"| peak RSS, {total:.1f} GB of JSON Lines, --jobs 2 (< 500 MB) | "
            f"{doc['rss'] / 1e6:.0f} MB per process, {doc['rss_sum'] / 1e6:.0f} MB all "
            f"processes, {time.perf_counter() - t:.0f} s | "
            f"{'yes' if doc['rss_sum'] < 500e6 else 'no'} |"
        )


if __name__ == "__main__":
    raise SystemExit(main())
