"""llama.cpp's tokenizer test vocabularies and their test vectors.

The `.gguf` files are fetched by `make` (tools/fetch_llama_vocab.py) into `.venv/llama-vocab/`
(or MATRIXCTL_LLAMA_VOCAB); the `.inp`/`.out` vectors are in `fixtures/llama-vocab/`. A vector
file holds the test texts separated by lines `__ggml_vocab_test__`; the `.out` file holds, for
each text in order, one line of the token ids llama.cpp gives (`llama_tokenize(vocab, text,
add_special=false, parse_special=false)`), separated by spaces.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT / "fixtures" / "llama-vocab"
SEPARATOR = "\n__ggml_vocab_test__\n"


def vocab_dir() -> Path:
    return Path(os.environ.get("MATRIXCTL_LLAMA_VOCAB", ROOT / ".venv" / "llama-vocab"))


def vocab_path(name: str) -> Path:
    """`name` as in `ggml-vocab-NAME.gguf` (e.g. "gpt-2")."""
    path = vocab_dir() / f"ggml-vocab-{name}.gguf"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: run `make test` (tools/fetch_llama_vocab.py)")
    return path


def vector_names() -> list[str]:
    """The vocabularies that have test vectors."""
    return sorted(p.name[len("ggml-vocab-") : -len(".gguf.inp")] for p in VECTORS.glob("*.inp"))


def vectors(name: str) -> list[tuple[str, list[int]]]:
    """(text, ids) pairs of one vocabulary's test vectors."""
    inp = (VECTORS / f"ggml-vocab-{name}.gguf.inp").read_text(encoding="utf-8")
    out = (VECTORS / f"ggml-vocab-{name}.gguf.out").read_text(encoding="utf-8")
    texts = inp.split(SEPARATOR)
    if inp.endswith(SEPARATOR):  # llama.cpp's reader stops at the end: no empty last text
        texts.pop()
    lines = out.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    ids = [[int(x) for x in line.split()] for line in lines]
    if len(texts) != len(ids):
        raise ValueError(f"{name}: {len(texts)} texts but {len(ids)} id lines")
    return list(zip(texts, ids, strict=True))
