"""The targets of the model tokenizer harnesses (fuzz_tokenizer_spm/wpm/ugm.py).

Each loads one llama.cpp test vocabulary (MATRIXCTL_LLAMA_VOCAB, fetched by `make`) and feeds
it the input bytes as text (UTF-8 with replacement, and Latin-1 so every byte value is a code
point). The oracle: no exception at all (a text has no invalid form), every id in the
vocabulary, decoding never raises, and for SentencePiece decode(encode(text)) == text where
docs/tokenizers.md says it round-trips (no U+2581 and no control token's text in it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from common import ROOT  # noqa: F401  (puts the repository on sys.path)


def _load(family: str, name: str) -> Any:
    from matrixctl.tokenizers.model import spm, ugm, wpm
    from tests.helpers.llama_vocab import vocab_path
    from tests.tokenizers.model._kv import gguf_kv

    cls = {"spm": spm.SentencePiece, "wpm": wpm.WordPiece, "ugm": ugm.Unigram}[family]
    return cls.from_gguf_kv(gguf_kv(vocab_path(name)))


def target(family: str, name: str) -> Callable[[bytes], None]:
    tok = _load(family, name)
    controls: list[str] = []
    if family == "spm":
        v = tok._vocab
        controls = [v.tokens[i] for i in range(v.n) if v.attrs[i] & 0b1001]

    def run(data: bytes) -> None:
        for text in (data.decode("utf-8", "replace"), data.decode("latin-1")):
            ids = tok.encode(text)
            if not all(0 <= i < tok.vocab_size for i in ids):
                raise AssertionError(f"id out of range for {text!r}")
            out = tok.decode_bytes(ids)
            if (
                family == "spm"
                and "\u2581" not in text
                and not any(c in text for c in controls)
                and out != text.encode("utf-8")
            ):
                raise AssertionError(f"no round trip: {text!r} -> {out!r}")

    return run
