"""Byte-level BPE (matrixctl/tokenizers/model/bpe.py): llama.cpp's test vectors are the oracle
for GGUF vocabularies, Hugging Face `tokenizers` for tokenizer.json ones."""

from __future__ import annotations

import json
import unicodedata
from functools import cache
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as strategies_

from matrixctl.errors import FormatError
from matrixctl.tokenizers.model import load, uclasses
from matrixctl.tokenizers.model.base import TOKENIZER_UNSUPPORTED, TOKENIZER_VOCAB
from matrixctl.tokenizers.model.bpe import BYTE_TO_CHAR, ByteLevelBPE, merge_symbols
from tests.helpers.gguf_kv import gguf_kv
from tests.helpers.llama_vocab import vector_names, vectors, vocab_path

BPE_WITH_VECTORS = [
    "command-r", "deepseek-coder", "deepseek-llm", "falcon", "gpt-2", "llama-bpe", "mpt",
    "qwen2", "qwen35", "refact", "starcoder",
]  # fmt: skip
SLOW = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@cache
def kv_of(name: str) -> dict[str, Any]:
    return gguf_kv(vocab_path(name))


@cache
def tokenizer(name: str) -> ByteLevelBPE:
    return ByteLevelBPE.from_gguf_kv(kv_of(name))


def test_every_byte_level_vocabulary_with_vectors_is_covered() -> None:
    names = [n for n in vector_names() if kv_of(n)["tokenizer.ggml.model"] == "gpt2"]
    assert names == BPE_WITH_VECTORS


@pytest.mark.parametrize("name", BPE_WITH_VECTORS)
def test_llama_cpp_vectors(name: str) -> None:
    tok = tokenizer(name)
    failures = [(text, ids, tok.encode(text)) for text, ids in vectors(name)]
    failures = [f for f in failures if f[1] != f[2]]
    assert not failures, f"{len(failures)} vectors differ; first: {failures[0]!r}"


@pytest.mark.parametrize("name", ["aquila", "gpt-neox"])
def test_vocabularies_without_pre_use_llama_cpp_default(name: str) -> None:
    tok = load.from_gguf_kv(kv_of(name))
    assert isinstance(tok, ByteLevelBPE) and tok.pre is None
    # the default expression: punctuation runs, then GPT-2's, then digits, then triples
    assert tok.pieces("Hello,world!! 12345") == ["Hello", ",", "world", "!!", " ", "123", "45"]
    text = "The quick brown fox, 1234567 times\n\n  indented"
    assert tok.decode(tok.encode(text)) == text


def test_special_token_text_is_plain_text() -> None:
    tok = tokenizer("gpt-2")
    ids = tok.encode("<|endoftext|>")
    assert 50256 not in ids and len(ids) > 1
    assert tok.decode(ids) == "<|endoftext|>"
    assert tok.encode("hi", add_special=True) == tok.encode("hi")  # gpt-2 adds no BOS


def test_user_defined_tokens_are_cut_out_first() -> None:
    # mpt's runs of spaces are user-defined tokens: llama.cpp matches them before the
    # pre-tokenizer (the vectors cover it too); here the id is the vocabulary's own
    kv = kv_of("mpt")
    tok = tokenizer("mpt")
    four = kv["tokenizer.ggml.tokens"].index("    ")
    assert kv["tokenizer.ggml.token_type"][four] == 4
    ids = tok.encode("a    b")
    assert four in ids


def test_unknown_pre_is_unsupported() -> None:
    kv = dict(kv_of("gpt-2"))
    kv["tokenizer.ggml.pre"] = "no-such-pre"
    with pytest.raises(FormatError) as err:
        ByteLevelBPE.from_gguf_kv(kv)
    assert err.value.code == TOKENIZER_UNSUPPORTED
    assert "no-such-pre" in str(err.value)


def test_unknown_model_is_unsupported() -> None:
    with pytest.raises(FormatError) as err:
        load.from_gguf_kv({"tokenizer.ggml.model": "rwkv"})
    assert err.value.code == TOKENIZER_UNSUPPORTED and "rwkv" in str(err.value)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"tokenizer.ggml.tokens": "abc"}, "tokenizer.ggml.tokens"),
        ({"tokenizer.ggml.tokens": ["a", 3]}, "tokenizer.ggml.tokens"),
        ({"tokenizer.ggml.tokens": []}, "tokens"),
        ({"tokenizer.ggml.merges": None}, "tokenizer.ggml.merges"),
        ({"tokenizer.ggml.token_type": [1]}, "tokenizer.ggml.token_type"),
        ({"tokenizer.ggml.bos_token_id": "x"}, "tokenizer.ggml.bos_token_id"),
        ({"tokenizer.ggml.pre": 7}, "tokenizer.ggml.pre"),
    ],
)
def test_hostile_metadata_is_a_clear_error(change: dict[str, Any], field: str) -> None:
    kv = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.tokens": ["a", "b", "ab"],
        "tokenizer.ggml.merges": ["a b"],
    }
    kv.update(change)
    with pytest.raises(FormatError) as err:
        load.from_gguf_kv(kv)
    assert err.value.code == TOKENIZER_VOCAB
    assert err.value.field == field


def test_missing_merges_key_is_a_vocab_error() -> None:
    kv = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a"]}
    with pytest.raises(FormatError) as err:
        load.from_gguf_kv(kv)
    assert err.value.code == TOKENIZER_VOCAB


def test_decode_of_an_id_outside_the_vocabulary() -> None:
    tok = tokenizer("gpt-2")
    with pytest.raises(FormatError):
        tok.decode([tok.vocab_size])
    with pytest.raises(FormatError):
        tok.token_bytes(-1)


def test_llama_table_is_unicode_14_plus_the_15_1_additions() -> None:
    assert sum(b - a + 1 for a, b, _ in uclasses.UNICODE_15_1_ADDED) == (
        uclasses.UNICODE_15_1_ADDED_COUNT
    )
    for first, last, group in uclasses.UNICODE_15_1_ADDED:
        for cp in (first, last):
            assert unicodedata.category(chr(cp)) == "Cn"
            assert uclasses.group_of(cp) == group
            assert uclasses.group_of(cp, "unicodedata") == "C"
    assert uclasses.group_of(ord("a")) == "L" and uclasses.group_of(0x0663) == "N"


# decode(encode(t)) == t ------------------------------------------------------------------------

ADVERSARIAL = strategies_.sampled_from(
    [
        *" \t\n\r\x0b\x0c\x1c\x85\xa0\u1680\u2000\u2028\u3000'sStTdDmMlLrReEvV0123456789",
        *["\u0301", "\u093f", "\U0001f600", "\u4e00", "\uac00", "\U00011f04", "\u1c89", "\u00b5"],
        *["<|endoftext|>", "    ", "\u00f8", "'s", "'LL", "\r\n", "...", "!!", "$+<=>^`|~"],
    ]
)
TEXTS = strategies_.one_of(strategies_.text(), strategies_.lists(ADVERSARIAL).map("".join))


@pytest.mark.parametrize(
    "name", ["gpt-2", "llama-bpe", "deepseek-llm", "mpt", "falcon", "qwen35", "starcoder"]
)
@SLOW
@given(text=TEXTS)
def test_decode_encode_round_trips(name: str, text: str) -> None:
    tok = tokenizer(name)
    data = text.encode("utf-8")
    if tok.missing_bytes.intersection(data):
        # a byte no token stands for is dropped, as llama.cpp drops it
        kept = bytes(b for b in data if b not in tok.missing_bytes)
        assert tok.decode_bytes(tok.encode(text)) == kept
    else:
        assert tok.decode(tok.encode(text)) == text


def test_bytes_without_a_token_are_dropped_as_llama_cpp_does() -> None:
    assert tokenizer("gpt-2").missing_bytes == frozenset()
    falcon = tokenizer("falcon")
    assert 0x19 in falcon.missing_bytes
    assert falcon.encode("a\x19b") == falcon.encode("a") + falcon.encode("b")


@settings(max_examples=300, deadline=None)
@given(
    strategies_.lists(
        strategies_.sampled_from([b"a", b"b", b"c", b"ab"]), min_size=49, max_size=200
    )
)
def test_long_chunks_merge_as_short_ones(symbols: list[bytes]) -> None:
    # the heap path (long chunks) against the pairwise scan (short ones), split in windows
    ranks = {(b"a", b"b"): 0, (b"b", b"c"): 1, (b"ab", b"c"): 2, (b"c", b"a"): 3, (b"a", b"a"): 4}
    ranks[(b"abc", b"abc")] = 5
    heap = merge_symbols(list(symbols), ranks)
    # the scan over the same list, forced by calling it on <= 48 symbols at a time is not the
    # same problem, so run the scan's definition directly
    ref = list(symbols)
    while True:
        pairs = [(ranks.get((ref[i], ref[i + 1])), i) for i in range(len(ref) - 1)]
        pairs = [(r, i) for r, i in pairs if r is not None]
        if not pairs:
            break
        _, i = min(pairs)
        ref[i : i + 2] = [ref[i] + ref[i + 1]]
    assert heap == ref


# Hugging Face tokenizers as the oracle ------------------------------------------------------

tokenizers = pytest.importorskip("tokenizers")


def _assigned(cp: int) -> bool:
    # code points whose category Unicode 14.0 (Python), 15.1 (llama.cpp) and the Unicode of
    # Hugging Face's Oniguruma agree on: the ones assigned in 14.0
    return unicodedata.category(chr(cp)) not in ("Cn", "Cs")


HF_CHARS = strategies_.characters(codec="utf-8").filter(lambda c: _assigned(ord(c)))
HF_ADVERSARIAL = ADVERSARIAL.filter(lambda s: all(_assigned(ord(c)) for c in s))
HF_TEXTS = strategies_.one_of(
    strategies_.text(HF_CHARS), strategies_.lists(HF_ADVERSARIAL).map("".join)
)


@cache
def hf_gpt2() -> Any:
    kv = kv_of("gpt-2")
    vocab = {t: i for i, t in enumerate(kv["tokenizer.ggml.tokens"])}
    merges = [tuple(m.split(" ", 1)) for m in kv["tokenizer.ggml.merges"]]
    hf = tokenizers.Tokenizer(tokenizers.models.BPE(vocab, merges))
    hf.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = tokenizers.decoders.ByteLevel()
    return hf


LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@cache
def hf_llama3() -> Any:
    kv = kv_of("llama-bpe")
    vocab = {t: i for i, t in enumerate(kv["tokenizer.ggml.tokens"][:128000])}
    merges = [tuple(m.split(" ", 1)) for m in kv["tokenizer.ggml.merges"]]
    hf = tokenizers.Tokenizer(tokenizers.models.BPE(vocab, merges, ignore_merges=True))
    hf.pre_tokenizer = tokenizers.pre_tokenizers.Sequence(
        [
            tokenizers.pre_tokenizers.Split(
                tokenizers.Regex(LLAMA3_SPLIT), behavior="isolated", invert=False
            ),
            tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    hf.decoder = tokenizers.decoders.ByteLevel()
    return hf


@cache
def from_json(which: str) -> ByteLevelBPE:
    hf = hf_gpt2() if which == "gpt2" else hf_llama3()
    tok = load.from_tokenizer_json(json.loads(hf.to_str()))
    assert isinstance(tok, ByteLevelBPE) and tok.source == "tokenizer.json"
    return tok


def hf_ids(hf: Any, text: str) -> list[int]:
    return list(hf.encode(text, add_special_tokens=False).ids)


@SLOW
@given(text=HF_TEXTS)
def test_gpt2_ids_equal_hugging_face(text: str) -> None:
    expected = hf_ids(hf_gpt2(), text)
    assert tokenizer("gpt-2").encode(text) == expected
    assert from_json("gpt2").encode(text) == expected


@SLOW
@given(text=HF_TEXTS)
def test_gpt2_pieces_equal_hugging_face(text: str) -> None:
    # the pre-tokenizer alone: a stricter check than the ids (most rare characters merge with
    # nothing, so a misplaced boundary rarely changes an id)
    pre = hf_gpt2().pre_tokenizer
    expected = [p for p, _ in pre.pre_tokenize_str(text)]
    got = [
        "".join(BYTE_TO_CHAR[b] for b in piece.encode("utf-8"))
        for piece in tokenizer("gpt-2").pieces(text)
    ]
    assert got == expected


@SLOW
@given(text=HF_TEXTS)
def test_llama3_tokenizer_json_equals_hugging_face(text: str) -> None:
    expected = hf_ids(hf_llama3(), text)
    assert from_json("llama3").encode(text) == expected
    assert tokenizer("llama-bpe").encode(text) == expected


@pytest.mark.parametrize("which", ["gpt2", "llama3"])
def test_tokenizer_json_vectors(which: str) -> None:
    name = "gpt-2" if which == "gpt2" else "llama-bpe"
    tok = from_json(which)
    for text, ids in vectors(name):
        assert tok.encode(text) == ids, text


def test_tokenizer_json_added_tokens() -> None:
    hf = tokenizers.Tokenizer.from_str(hf_gpt2().to_str())
    hf.add_special_tokens(["<|endoftext|>"])
    hf.add_tokens([tokenizers.AddedToken("<tool>", normalized=False, special=False)])
    hf.encode_special_tokens = True  # special tokens in text are text, as here
    tok = load.from_tokenizer_json(json.loads(hf.to_str()))
    for text in ["a<tool>b <|endoftext|>", "<tool><tool>", "x <tool"]:
        assert tok.encode(text) == hf_ids(hf, text), text
        assert tok.decode(tok.encode(text)) == text


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("pre_tokenizer",), {"type": "Whitespace"}),
        (("pre_tokenizer",), None),
        (("normalizer",), {"type": "Lowercase"}),
        (("model", "dropout"), 0.1),
        (("model", "byte_fallback"), True),
        (("truncation",), {"max_length": 5}),
        (
            ("pre_tokenizer",),
            {
                "type": "Sequence",
                "pretokenizers": [
                    {"type": "Split", "pattern": {"Regex": "\\d+$"}, "behavior": "Isolated"},
                    {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False},
                ],
            },
        ),
    ],
)
def test_tokenizer_json_shapes_not_handled_are_unsupported(
    path: tuple[str, ...], value: Any
) -> None:
    obj = json.loads(hf_gpt2().to_str())
    node = obj
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(FormatError) as err:
        load.from_tokenizer_json(obj)
    assert err.value.code == TOKENIZER_UNSUPPORTED
