"""Write a deterministic synthetic token stream (Zipf-distributed ids, documents of varied length).

    python tools/gen_tokens.py OUT --tokens N [--vocab V] [--seed S] [--dtype uint16|uint32]

Used by `make demo` and the benchmarks; `-` writes to stdout.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from matrixctl.formats.token_stream import TokenStreamWriter


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--tokens", type=int, required=True)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dtype", default="uint16")
    ap.add_argument("--doc-tokens", type=int, default=700, help="mean document length")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    fp = sys.stdout.buffer if args.out == "-" else open(args.out, "wb")  # noqa: SIM115
    with fp:
        writer = TokenStreamWriter(fp, dtype=args.dtype, vocab_size=args.vocab)
        left = args.tokens
        doc = 0
        while left:
            n = min(left, max(1, int(rng.exponential(args.doc_tokens))))
            ids = (rng.zipf(1.2, n) - 1) % args.vocab
            writer.write(ids.astype(np.int64))
            writer.end_document(f"doc-{doc:06d}")
            doc += 1
            left -= n
        writer.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
