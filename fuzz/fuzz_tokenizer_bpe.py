"""Fuzz harness: byte-level BPE (see fuzz/common.py).

The bytes, decoded as UTF-8 (invalid bytes as U+FFFD, lone surrogates kept), are encoded by the
GPT-2, Llama 3 and DeepSeek LLM tokenizers of llama.cpp's test vocabularies (MATRIXCTL_LLAMA_VOCAB
or .venv/llama-vocab, fetched by `make test`). Oracle: encode raises nothing, every id is in
the vocabulary, and decoding the ids gives the text's UTF-8 back (lone surrogates as the bytes
"surrogatepass" gives them).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import common


def _text(data: bytes) -> str:
    # surrogatepass first: UTF-8-encoded surrogates become lone surrogates, the rest decodes
    try:
        return data.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return data.decode("utf-8", "replace")


def bpe_target() -> Callable[[bytes], None]:
    from matrixctl.tokenizers.model.bpe import ByteLevelBPE, utf8
    from tests.helpers.gguf_kv import gguf_kv
    from tests.helpers.llama_vocab import vocab_path

    try:
        toks = [
            ByteLevelBPE.from_gguf_kv(gguf_kv(vocab_path(name)))
            for name in ("gpt-2", "llama-bpe", "deepseek-llm")
        ]
    except FileNotFoundError as err:
        sys.exit(f"fuzz_tokenizer_bpe: {err}")

    def target(data: bytes) -> None:
        text = _text(data)
        for tok in toks:
            ids = tok.encode(text)
            if any(not 0 <= i < tok.vocab_size for i in ids):
                raise AssertionError(f"{tok.pre}: an id outside the vocabulary")
            back = tok.decode_bytes(ids)
            if back != utf8(text):
                raise AssertionError(f"{tok.pre}: {text!r} decodes to {back!r}")

    return target


if __name__ == "__main__":
    common.main("tokenizer_bpe", bpe_target())
