"""Unigram (ugm.py) on nomic-bert-moe's GGUF vocabulary (llama.cpp ships no vectors for it).

Oracles: Hugging Face `tokenizers` built from the GGUF's own tokens, scores and charsmap
(`Precompiled` normalizer, ASCII spaces collapsed and stripped, `Metaspace` with the prefix and no
split: what llama.cpp's removal of extra white space amounts to), and a bare HF `Unigram`
model with no normalizer on text the charsmap leaves unchanged."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as strategies_

from matrixctl.errors import FormatError
from matrixctl.tokenizers.model.base import TOKENIZER_UNSUPPORTED, TOKENIZER_VOCAB
from matrixctl.tokenizers.model.ugm import Unigram
from tests.helpers.llama_vocab import vector_names, vectors
from tests.tokenizers.model._common import ADVERSARIAL, kv, texts

tokenizers = pytest.importorskip("tokenizers")
NAME = "nomic-bert-moe"


@lru_cache(maxsize=1)
def tok() -> Unigram:
    return Unigram.from_gguf_kv(kv(NAME))


def _blob() -> bytes:
    return bytes(b & 0xFF for b in kv(NAME)["tokenizer.ggml.precompiled_charsmap"])


def _pieces() -> list[tuple[str, float]]:
    """The vocabulary for HF: control and unknown tokens are not matchable in llama.cpp's
    unigram (they are text), so their pieces are spelt as strings no test text holds."""
    m = kv(NAME)
    out = []
    for i, (text, score, kind) in enumerate(
        zip(
            m["tokenizer.ggml.tokens"],
            m["tokenizer.ggml.scores"],
            m["tokenizer.ggml.token_type"],
            strict=True,
        )
    ):
        out.append((f"\U0010fffe{i}\U0010fffe" if kind in (2, 3) else text, score))
    return out


@lru_cache(maxsize=1)
def hf_full() -> Any:
    m = kv(NAME)
    t = tokenizers.Tokenizer(
        tokenizers.models.Unigram(
            _pieces(),
            unk_id=m["tokenizer.ggml.unknown_token_id"],
        )
    )
    n = tokenizers.normalizers
    t.normalizer = n.Sequence(
        [
            n.Precompiled(_blob()),
            n.Replace(tokenizers.Regex(" +"), " "),
            n.Replace(tokenizers.Regex("^ | $"), ""),  # ASCII spaces only (Strip takes all)
        ]
    )
    t.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace(
        replacement="\u2581", prepend_scheme="always", split=False
    )
    return t


@lru_cache(maxsize=1)
def hf_bare() -> Any:
    m = kv(NAME)
    return tokenizers.Tokenizer(
        tokenizers.models.Unigram(
            _pieces(),
            unk_id=m["tokenizer.ggml.unknown_token_id"],
        )
    )


def test_loads() -> None:
    t = tok()
    assert t.family == "ugm" and t.vocab_size == 250048
    assert t.unk_id == 3 and t.add_space_prefix and t.remove_extra_ws


def test_vector_texts_agree_with_hf() -> None:
    t, hf = tok(), hf_full()
    for name in vector_names():
        for text, _ in vectors(name):
            assert t.encode(text) == hf.encode(text, add_special_tokens=False).ids, repr(text)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=texts())
@example(text=ADVERSARIAL)
@example(text="  leading and trailing  \t")
def test_hf_differential(text: str) -> None:
    # The Precompiled normalizer works on valid UTF-8 only: no lone surrogates.
    assume(not any(0xD800 <= ord(c) < 0xE000 for c in text))
    t = tok()
    ids = t.encode(text)
    assert all(0 <= i < t.vocab_size for i in ids)
    assert ids == hf_full().encode(text, add_special_tokens=False).ids


WORDS = strategies_.lists(
    strategies_.text(
        alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", min_size=1
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=200, deadline=None)
@given(words=WORDS)
def test_bare_unigram_agrees_where_charsmap_is_identity(words: list[str]) -> None:
    """Text of ASCII letters and digits the charsmap keeps: the normalized text is known
    without the code under test (U+2581 before each word), so a bare HF Unigram on it must
    give the same ids."""
    text = " ".join(words)
    assert tokenizers.normalizers.Precompiled(_blob()).normalize_str(text) == text
    spelled = "".join("\u2581" + w for w in words)
    assert tok().encode(text) == hf_bare().encode(spelled, add_special_tokens=False).ids


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(words=WORDS)
def test_round_trip_plain_words(words: list[str]) -> None:
    text = " ".join(words)
    t = tok()
    assert t.decode(t.encode(text)) == text


def small(**extra: Any) -> dict[str, Any]:
    m = {
        "tokenizer.ggml.model": "t5",
        "tokenizer.ggml.tokens": ["<pad>", "</s>", "<unk>", "▁", "a", "b", "▁ab", "<x>"],
        "tokenizer.ggml.scores": [0.0, 0.0, 0.0, -1.0, -2.0, -2.0, -1.5, 0.0],
        "tokenizer.ggml.token_type": [3, 3, 2, 1, 1, 1, 1, 4],
        "tokenizer.ggml.add_space_prefix": True,
    }
    m.update(extra)
    return m


def test_small_vocab_unknowns_merge_and_user_defined() -> None:
    t = Unigram.from_gguf_kv(small())
    assert t.encode("ab") == [6]
    assert t.encode("zzz") == [3, 2]  # "▁", then one unknown for the three unknown characters
    assert t.encode("a<x>b") == [3, 4, 7, 3, 5]


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"tokenizer.ggml.model": "llama"}, TOKENIZER_UNSUPPORTED),
        ({"tokenizer.ggml.scores": [0.0] * 3}, TOKENIZER_VOCAB),
        ({"tokenizer.ggml.token_type": "x"}, TOKENIZER_VOCAB),
        ({"tokenizer.ggml.precompiled_charsmap": [1, 2]}, TOKENIZER_VOCAB),
        ({"tokenizer.ggml.precompiled_charsmap": [255, 255, 0, 0, 1]}, TOKENIZER_VOCAB),
        ({"tokenizer.ggml.precompiled_charsmap": "abc"}, TOKENIZER_VOCAB),
        ({"tokenizer.ggml.remove_extra_whitespaces": "yes"}, TOKENIZER_VOCAB),
    ],
)
def test_hostile_kv(change: dict[str, Any], code: str) -> None:
    with pytest.raises(FormatError) as err:
        Unigram.from_gguf_kv(small(**change))
    assert err.value.code == code


@settings(max_examples=200, deadline=None)
@given(blob=strategies_.binary(min_size=5, max_size=64), text=texts())
def test_garbage_charsmap_is_a_typed_error(blob: bytes, text: str) -> None:
    blob = (len(blob) - 5).to_bytes(4, "little") + blob[4:]
    try:
        t = Unigram.from_gguf_kv(small(**{"tokenizer.ggml.precompiled_charsmap": blob}))
        ids = t.encode(text)
    except FormatError:
        return
    assert all(0 <= i < t.vocab_size for i in ids)


def test_tokenizer_json_is_unsupported() -> None:
    with pytest.raises(FormatError) as err:
        Unigram.from_tokenizer_json({"model": {"type": "Unigram"}})
    assert err.value.code == TOKENIZER_UNSUPPORTED
