"""Where `ingest docs` spends its time, on the benchmark corpus (bench/corpus.py).

    python bench/profile_ingest.py [--jobs N]

`--jobs 1` (default): wall time of each phase, measured by wrapping the library functions in
this one process (the wrappers cost a little). `--jobs N` > 1: wall time, and CPU seconds of
this process (map load, listing, writing, hashing, projection) against its workers'.
"""

from __future__ import annotations

import argparse
import collections
import resource
import shutil
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from matrixctl.ingest import docs, pack, writer  # noqa: E402
from matrixctl.ingest.kinds import html  # noqa: E402
from matrixctl.tokenizers import pi  # noqa: E402

CORPUS = HERE / "out" / "corpus"
PACK = HERE / "out" / "profile-pack"
SPENT: collections.Counter[str] = collections.Counter()


def wrap(owner: Any, name: str, label: str) -> None:
    fn = getattr(owner, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            SPENT[label] += time.perf_counter() - start

    setattr(owner, name, timed)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=1)
    args = ap.parse_args()
    if args.jobs == 1:
        wrap(pi, "load_symbol_map", "symbol map load (serial)")
        wrap(pi.Tokenizer, "__init__", "matcher build")
        wrap(writer, "enumerate_sources", "listing the inputs (serial)")
        wrap(html, "read_whole", "reading + SHA-256 of HTML")
        wrap(html, "decode_whole", "UTF-8 decoding of HTML")
        wrap(html, "html_text", "HTML to text")
        wrap(pi.Tokenizer, "encode", "tokenizer (whole documents)")
        wrap(pi.StreamEncoder, "feed", "tokenizer (streamed pieces)")
        wrap(writer, "_append", "writing atoms and index")
        wrap(pack.PackBuilder, "finish", "finish: projection, hashes, manifest (serial)")
    shutil.rmtree(PACK, ignore_errors=True)
    start = time.perf_counter()
    docs.ingest_docs(
        [str(CORPUS)],
        str(PACK),
        docs.IngestOptions(jobs=args.jobs, encoding_errors="replace", svgt="16x16"),
    )
    wall = time.perf_counter() - start
    shutil.rmtree(PACK, ignore_errors=True)
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"### ingest docs --jobs {args.jobs}: {wall:.2f} s wall\n")
    if args.jobs == 1:
        print("| phase | seconds | share |")
        print("| --- | --- | --- |")
        for label, secs in SPENT.most_common():
            print(f"| {label} | {secs:.2f} | {secs / wall:.0%} |")
    else:
        print("| process | CPU seconds |")
        print("| --- | --- |")
        print(f"| parent (map, listing, writer, finish) | {me.ru_utime + me.ru_stime:.2f} |")
        print(f"| {args.jobs} workers together | {kids.ru_utime + kids.ru_stime:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
