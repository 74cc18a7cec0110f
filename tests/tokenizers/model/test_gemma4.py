"""Gemma 4's tokenizer (matrixctl/tokenizers/model/gemma4.py) against llama.cpp's vectors."""

from __future__ import annotations

from functools import cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as strategies_

from matrixctl.errors import FormatError
from matrixctl.tokenizers.model import load
from matrixctl.tokenizers.model.base import TOKENIZER_UNSUPPORTED
from matrixctl.tokenizers.model.gemma4 import SPACE_MARK, Gemma4
from tests.helpers.gguf_kv import gguf_kv
from tests.helpers.llama_vocab import vectors, vocab_path


@cache
def tokenizer() -> Gemma4:
    tok = load.from_gguf_kv(gguf_kv(vocab_path("gemma-4")))
    assert isinstance(tok, Gemma4)
    return tok


def test_llama_cpp_vectors() -> None:
    tok = tokenizer()
    failures = [(t, ids, tok.encode(t)) for t, ids in vectors("gemma-4")]
    failures = [f for f in failures if f[1] != f[2]]
    assert not failures, f"{len(failures)} vectors differ; first: {failures[0]!r}"


def test_bos_is_always_added() -> None:
    tok = tokenizer()
    assert tok.add_bos and tok.bos_id is not None
    assert tok.encode("hi", add_special=True) == [tok.bos_id, *tok.encode("hi")]


def test_marker_tokens_in_text_are_text() -> None:
    tok = tokenizer()
    # <|tool_response> is user-defined in the GGUF but ends generation, so llama.cpp makes it
    # control: not cut out of text
    ids = tok.encode("<|tool_response>")
    assert len(ids) > 1 and tok.decode(ids) == "<|tool_response>"


def test_other_model_is_refused() -> None:
    with pytest.raises(FormatError) as err:
        Gemma4.from_gguf_kv({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a"]})
    assert err.value.code == TOKENIZER_UNSUPPORTED


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(strategies_.text(strategies_.characters(codec="utf-8", exclude_characters=SPACE_MARK)))
def test_decode_encode_round_trips(text: str) -> None:
    tok = tokenizer()
    assert tok.decode(tok.encode(text)) == text
