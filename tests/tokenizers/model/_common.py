"""Shared fixtures of the model tokenizer tests: vocabularies loaded once, adversarial text."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from hypothesis import strategies as strategies_

from tests.helpers.llama_vocab import vocab_path
from tests.tokenizers.model._kv import gguf_kv

# Characters that stress normalizers and splitters: white space of every kind, controls,
# combining marks, CJK, punctuation of old and new Unicode versions, case-mapping oddities,
# the SentencePiece space mark, replacement and NUL characters, bracketed special tokens.
ADVERSARIAL = (
    " \t\n\r\x0b\x0c\x85\xa0\u1680\u2000\u2028\u3000\x00\x01\x7f\ufffd\u200b\u200d\u2581"
    "aAzZ09_-.,;:!?'\"()[]{}<>/\\@#$%^&*+=|~`"
    "éÉèçñÅåøØßẞİıΣσςﬁ\u0301\u0308\u0327\u0345\u0f73\u1734"
    "中文日本語한국어ひらがなカタカナ\U00020000\u2b920\uf900"
    "ÀÁÂÃÄ\u0890\u08e2\u0d00\u166d\U000111c9\U00011b00\U00013439\u1c89\ua7cb"
    "😀👍🏽‍\U0001f9d1\u202e\ue000\U000f0000"
)
TOKENS = ("[CLS]", "[SEP]", "[UNK]", "[MASK]", "[PAD]", "<s>", "</s>", "<unk>", "<0x41>", "▁")


def texts() -> strategies_.SearchStrategy[str]:
    """Random Unicode text, and text built from the adversarial characters and tokens."""
    pieces = strategies_.one_of(
        strategies_.sampled_from(ADVERSARIAL),
        strategies_.sampled_from(TOKENS),
        strategies_.text(max_size=4),
    )
    return strategies_.one_of(
        strategies_.text(max_size=40),
        strategies_.lists(pieces, max_size=30).map("".join),
    )


@lru_cache(maxsize=8)
def kv(name: str) -> dict[str, Any]:
    return gguf_kv(vocab_path(name))
