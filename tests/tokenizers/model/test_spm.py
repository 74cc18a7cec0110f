"""SentencePiece BPE (spm.py) against llama.cpp's own test vectors, and its contract."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as strategies_

from matrixctl.errors import FormatError
from matrixctl.tokenizers.model.base import TOKENIZER_ID, TOKENIZER_UNSUPPORTED, TOKENIZER_VOCAB
from matrixctl.tokenizers.model.spm import SentencePiece
from tests.helpers.llama_vocab import vectors
from tests.tokenizers.model._common import kv, texts

NAMES = ["llama-spm", "phi-3"]


@lru_cache(maxsize=4)
def tok(name: str) -> SentencePiece:
    return SentencePiece.from_gguf_kv(kv(name))


@pytest.mark.parametrize("name", NAMES)
def test_every_vector(name: str) -> None:
    t = tok(name)
    for text, ids in vectors(name):
        assert t.encode(text) == ids, repr(text)


def test_baichuan_loads() -> None:
    t = SentencePiece.from_gguf_kv(kv("baichuan"))
    assert t.family == "spm" and t.vocab_size == 64000
    ids = t.encode("Hello 世界 \U0001f600")
    assert all(0 <= i < t.vocab_size for i in ids)
    assert t.decode(ids) == "Hello 世界 \U0001f600"


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=texts())
def test_round_trip(name: str, text: str) -> None:
    """decode(encode(t)) == t for text without U+2581 (it decodes as a space), with no
    NUL-free caveat: byte fallback covers every character."""
    t = tok(name)
    ids = t.encode(text)
    assert all(0 <= i < t.vocab_size for i in ids)
    if "\u2581" not in text and not _has_control_text(t, text):
        assert t.decode_bytes(ids) == text.encode("utf-8", "surrogatepass")


def _has_control_text(t: SentencePiece, text: str) -> bool:
    # A text spelling a control or unknown token ("<s>", "</s>", "<unk>", phi-3's "<|end|>")
    # can merge into that token, which decodes as nothing (llama.cpp renders none of them).
    v = t._vocab
    return any(v.tokens[i] in text for i in range(v.n) if v.attrs[i] & 0b1001)


def test_add_special() -> None:
    t = tok("llama-spm")
    assert t.encode("Hi", add_special=True) == [1, *t.encode("Hi")]


def test_decode_drops_prefix_space_and_reads_bytes() -> None:
    t = tok("llama-spm")
    assert t.decode(t.encode(" two  spaces\n")) == " two  spaces\n"
    assert t.token_bytes(t._vocab.ids["<0x0A>"]) == b"\n"
    with pytest.raises(FormatError) as err:
        t.token_bytes(t.vocab_size)
    assert err.value.code == TOKENIZER_ID


def small(**extra: Any) -> dict[str, Any]:
    tokens = ["<unk>", "<s>", "</s>", "▁", "a", "b", "▁a", "ab", "<|x|>"]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3, 1, 1, 1, 1, 1, 4] + [6] * 256
    scores = [0.0, 0.0, 0.0, -1.0, -2.0, -2.0, -0.5, -0.25, 0.0] + [0.0] * 256
    kv = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
    }
    kv.update(extra)
    return kv


def test_user_defined_tokens_split_and_prefix_space() -> None:
    t = SentencePiece.from_gguf_kv(small())
    ids = t.encode("ab<|x|>ab")
    # "▁ab": "ab" scores above "▁a", so ▁ + ab; after the split-out token the next fragment
    # gets the space prefix again (llama.cpp's rule).
    assert ids == [3, 7, 8, 3, 7]
    # control tokens are text: "<s>" is spelt in bytes here (no token "<s" to merge through)
    assert t.encode("<s>")[0] == 3
    assert t.decode(t.encode("ab<|x|>")) == "ab<|x|>"


def test_phi3_user_defined_rstrip() -> None:
    t = SentencePiece.from_gguf_kv(small(**{"general.name": "Phi3"}))
    assert t.encode("<|x|>   ab") == t.encode("<|x|>ab")


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"tokenizer.ggml.model": "gpt2"}, TOKENIZER_UNSUPPORTED),
        ({"tokenizer.ggml.tokens": "abc"}, TOKENIZER_VOCAB),
        ({"tokenizer.ggml.tokens": []}, TOKENIZER_VOCAB),
        ({"tokenizer.ggml.tokens": [1, 2]}, TOKENIZER_VOCAB),
        ({"tokenizer.ggml.scores": [0.0]}, TOKENIZER_VOCAB),
        ({"tokenizer.ggml.scores": ["x"] * 265}, TOKENIZER_VOCAB),
        ({"tokenizer.ggml.token_type": [1] * 3}, TOKENIZER_VOCAB),
        ({"tokenizer.ggml.bos_token_id": "1"}, TOKENIZER_VOCAB),
        ({"tokenizer.ggml.add_space_prefix": 1}, TOKENIZER_VOCAB),
        ({"tokenizer.ggml.model": None}, TOKENIZER_VOCAB),
    ],
)
def test_hostile_kv(change: dict[str, Any], code: str) -> None:
    with pytest.raises(FormatError) as err:
        SentencePiece.from_gguf_kv(small(**change))
    assert err.value.code == code


def test_duplicate_tokens_and_missing_model() -> None:
    kv = small()
    kv["tokenizer.ggml.tokens"] = list(kv["tokenizer.ggml.tokens"])
    kv["tokenizer.ggml.tokens"][5] = "a"
    with pytest.raises(FormatError) as err:
        SentencePiece.from_gguf_kv(kv)
    assert err.value.code == TOKENIZER_VOCAB
    kv = small()
    del kv["tokenizer.ggml.model"]
    with pytest.raises(FormatError):
        SentencePiece.from_gguf_kv(kv)


VALUES = strategies_.one_of(
    strategies_.none(),
    strategies_.booleans(),
    strategies_.integers(-(2**40), 2**40),
    strategies_.floats(allow_nan=True),
    strategies_.text(max_size=5),
    strategies_.binary(max_size=5),
    strategies_.lists(
        strategies_.one_of(
            strategies_.integers(-5, 300), strategies_.text(max_size=3), strategies_.floats()
        ),
        max_size=270,
    ),
)
KEYS = strategies_.sampled_from(
    [
        "tokenizer.ggml.model",
        "tokenizer.ggml.pre",
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.scores",
        "tokenizer.ggml.token_type",
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.unknown_token_id",
        "tokenizer.ggml.add_space_prefix",
        "tokenizer.ggml.add_bos_token",
        "tokenizer.ggml.precompiled_charsmap",
        "tokenizer.ggml.normalizer.lowercase",
        "general.name",
        "general.architecture",
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    changes=strategies_.dictionaries(KEYS, VALUES, max_size=3), text=strategies_.text(max_size=12)
)
def test_any_kv_gives_a_tokenizer_or_a_typed_error(changes: dict[str, Any], text: str) -> None:
    """Whatever the metadata holds, each family answers with a tokenizer or a FormatError."""
    from matrixctl.tokenizers.model.ugm import Unigram
    from matrixctl.tokenizers.model.wpm import WordPiece

    for cls, model in ((SentencePiece, "llama"), (WordPiece, "bert"), (Unigram, "t5")):
        kv = small(**{"tokenizer.ggml.model": model})
        kv.update(changes)
        try:
            t = cls.from_gguf_kv(kv)
            ids = t.encode(text)
            t.decode_bytes(ids)
        except FormatError as err:
            assert err.code in (TOKENIZER_VOCAB, TOKENIZER_UNSUPPORTED)
            continue
        assert all(0 <= i < t.vocab_size for i in ids)
