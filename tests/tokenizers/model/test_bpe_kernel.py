"""The byte-level BPE kernel (matrixctl/_bpe_kernel.c) against the Python path of bpe.py, which
llama.cpp's vectors and Hugging Face `tokenizers` check (test_bpe.py): the same chunks and the
same ids for every pre-tokenizer the kernel covers, on adversarial Unicode."""

from __future__ import annotations

import copy
import json
import threading
from functools import cache
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as strategies_

from matrixctl import _bpe_kernel
from matrixctl.tokenizers.model import bpe, load, uclasses
from matrixctl.tokenizers.model.bpe import ByteLevelBPE, kernel_classes
from tests.helpers.gguf_kv import gguf_kv
from tests.helpers.llama_vocab import vectors, vocab_path

# tokenizer.ggml.pre -> the kernel's scanner
COVERED = {
    "gpt-2": _bpe_kernel.KIND_GPT2,
    "mpt": _bpe_kernel.KIND_GPT2,
    "llama-bpe": _bpe_kernel.KIND_LLAMA3,
    "qwen2": _bpe_kernel.KIND_QWEN2,
    "qwen35": _bpe_kernel.KIND_QWEN35,
    # llama.cpp's two steps: each number alone, GPT-2's expression between them (starcoder and
    # refact lack the byte 0xF1: the kernel's tables for missing bytes on a real vocabulary)
    "starcoder": _bpe_kernel.KIND_STARCODER,
    "refact": _bpe_kernel.KIND_STARCODER,
    "command-r": _bpe_kernel.KIND_STARCODER,
}
NOT_COVERED = ["deepseek-llm", "deepseek-coder", "falcon", "aquila", "gpt-neox"]
SLOW = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@cache
def kv_of(name: str) -> dict[str, Any]:
    return gguf_kv(vocab_path(name))


@cache
def tokenizer(name: str) -> ByteLevelBPE:
    return ByteLevelBPE.from_gguf_kv(kv_of(name))


@cache
def python_path(name: str) -> ByteLevelBPE:
    return tokenizer(name).without_kernel()


def chunk_ends(tok: ByteLevelBPE, text: str) -> list[int]:
    ends, pos = [], 0
    for piece in tok.pieces(text):
        pos += len(piece)
        ends.append(pos)
    return ends


# the class table ------------------------------------------------------------------------------


def test_class_table_is_the_llama_table_for_every_code_point() -> None:
    flags = np.frombuffer(kernel_classes(True), dtype=np.uint8)
    groups = np.frombuffer(uclasses._groups("llama"), dtype=np.uint8)
    assert flags.shape == groups.shape == (0x110000,)
    k = _bpe_kernel
    for group, flag in (("L", k.CLASS_L), ("N", k.CLASS_N), ("M", k.CLASS_M)):
        assert np.array_equal((flags & flag) != 0, groups == ord(group)), group
    white = np.zeros(0x110000, dtype=bool)
    white[[ord(c) for c in uclasses.WHITE_SPACE]] = True
    assert np.array_equal((flags & k.CLASS_W) != 0, white)
    # without marks, the same table minus the mark flags
    plain = np.frombuffer(kernel_classes(False), dtype=np.uint8)
    assert np.array_equal(plain, flags & ~np.uint8(k.CLASS_M))


def test_class_ranges_are_checked() -> None:
    with pytest.raises(ValueError):
        _bpe_kernel.classes([(0, 0x110000, 1)], " ")
    with pytest.raises(TypeError):
        _bpe_kernel.classes([[0, 1, 1]], " ")


# which pre-tokenizers the kernel covers --------------------------------------------------------


@pytest.mark.parametrize("name", sorted(COVERED))
def test_covered_pre_tokenizers_use_the_kernel(name: str) -> None:
    tok = tokenizer(name)
    assert tok._kernel_kind == COVERED[name]
    if COVERED[name] != _bpe_kernel.KIND_STARCODER:  # one expression: recognised by its text
        assert bpe.kernel_kind(tok._steps) == COVERED[name]
    assert tok.kernel is not None
    assert python_path(name).kernel is None


@pytest.mark.parametrize("name", NOT_COVERED)
def test_other_pre_tokenizers_use_the_python_path(name: str) -> None:
    assert tokenizer(name).kernel is None


@pytest.mark.parametrize("name", sorted(COVERED))
def test_llama_cpp_vectors_on_both_paths(name: str) -> None:
    kernel, python = tokenizer(name), python_path(name)
    for text, ids in vectors(name):
        assert kernel.encode(text) == ids, text
        assert python.encode(text) == ids, text


# adversarial Unicode: every class boundary ------------------------------------------------------

BOUNDARIES = [
    # contractions in both cases, and their look-alikes (long s, Kelvin sign)
    *["'", "'s", "'S", "'t", "'T", "'re", "'RE", "'Re", "'ve", "'m", "'M", "'ll", "'LL"],
    *["'d", "'D", "'x", "\u017f", "'\u017f", "\u212a", "'\u212a", "''", "'\n"],
    # digits: ASCII, Arabic-Indic, full-width, Roman numerals (Nl), fractions (No), CJK numerals
    # (letters), Unicode 15 digits (Kawi); runs of them
    *"0123456789", *["\u0663", "\uff11", "\u216b", "\u00bd", "\u4e00", "\U00011f50"],
    *["12", "1234567", " 1", " 12 ", "1\n", "3.14"],
    # code points whose UTF-8 starts with 0xF1 (no token in starcoder and refact)
    *["\U00040000", "\U0005ffff"],
    # white space: ASCII, CR/LF mixes, llama.cpp's non-ASCII white space, and what is not (U+001C)
    *[" ", "  ", "\t", "\n", "\r", "\r\n", "\n\r", "\n\n", " \n", "\n ", "\x0b", "\x0c"],
    *["\x85", "\xa0", "\u1680", "\u2000", "\u200a", "\u2028", "\u2029", "\u202f", "\u205f"],
    *["\u3000", "\x1c", "\x1f", "\u200b", "\ufeff"],
    # letters of every width, marks (combining, spacing), Unicode 15 letters and marks
    *["a", "Z", "\u00e9", "\u00df", "\u03a3", "\u0416", "\u05d0", "\u0627", "\u4e2d", "\uac00"],
    *["\u0301", "\u093f", "\u0f73", "\U00011f04", "\U00011f34", "\U0001e4d0", "\u1c89"],
    # punctuation and symbols, emoji, private use, unassigned, noncharacters, lone surrogates
    *["!", ".", "...", "$", "+", "<", "=", "`", "|", "~", "\u00a9", "\u2014", "\u20ac"],
    *["\U0001f600", "\U0001f44d\U0001f3fd", "\u200d", "\ue000", "\U000f0000", "\u0378"],
    *["\U000e0080", "\ufffe", "\U0010ffff", "\ud800", "\udfff", "\udbff\udc00", "\x00", "\x7f"],
    "<|endoftext|>", "    ", "\u00f8", "\u00b5",
]  # fmt: skip

TEXTS = strategies_.one_of(
    strategies_.text(max_size=60),
    strategies_.lists(strategies_.sampled_from(BOUNDARIES), max_size=40).map("".join),
    strategies_.lists(
        strategies_.one_of(
            strategies_.sampled_from(BOUNDARIES),
            strategies_.integers(0, 0x10FFFF).map(chr),
        ),
        max_size=40,
    ).map("".join),
)
# chunks longer than the kernel's scan limit (256 bytes) merge through its heap
LONG = strategies_.tuples(
    strategies_.sampled_from(["a", "ab", "e\u0301", "\u00e9", "1", " ", "\n ", "!?", "\u4e2d"]),
    strategies_.integers(100, 400),
    strategies_.sampled_from(["", " x", "\n", "'s"]),
).map(lambda t: t[0] * t[1] + t[2])


@pytest.mark.parametrize("name", sorted(COVERED))
@SLOW
@given(text=TEXTS)
def test_kernel_chunks_and_ids_equal_the_python_path(name: str, text: str) -> None:
    kernel = tokenizer(name).kernel
    ends = list(np.frombuffer(kernel.bounds(text), dtype=np.int64))
    assert ends == chunk_ends(tokenizer(name), text)
    assert tokenizer(name).encode(text) == python_path(name).encode(text)


@pytest.mark.parametrize("name", ["gpt-2", "llama-bpe"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=LONG)
def test_long_chunks_equal_the_python_path(name: str, text: str) -> None:
    assert tokenizer(name).encode(text) == python_path(name).encode(text)


@pytest.mark.parametrize("name", sorted(COVERED))
def test_text_widths_give_the_same_ids(name: str) -> None:
    # the kernel reads Latin-1 strings as they are and wider ones as UCS-4: a text that is
    # ASCII, Latin-1, BMP and astral in turn
    tok, python = tokenizer(name), python_path(name)
    for text in [
        "Hello, world! It's 2024.\n",
        "Caf\u00e9 na\u00efve \xa0\x85 \u00bd",
        "\u041f\u0440\u0438\u0432\u0435\u0442 \u4e16\u754c \u3000 \u2028",
        "emoji \U0001f600\U0001f600 and \ud800 lone",
    ]:
        assert tok.encode(text) == python.encode(text), text


# the other tables: missing bytes, ignore_merges, the cache's limit -------------------------------


@cache
def gpt2_without_z() -> ByteLevelBPE:
    """gpt-2 with the tokens of "z" and "é"'s first byte renamed: two bytes with no token, which
    llama.cpp drops (bpe.py's `_missing`)."""
    kv = dict(kv_of("gpt-2"))
    tokens = list(kv["tokenizer.ggml.tokens"])
    for text in ("z", bpe.BYTE_TO_CHAR[0xC3]):
        tokens[tokens.index(text)] = f"[gone {ord(text)}]"
    kv["tokenizer.ggml.tokens"] = tokens
    tok = ByteLevelBPE.from_gguf_kv(kv)
    assert {ord("z"), 0xC3} <= tok.missing_bytes
    return tok


@SLOW
@given(
    text=strategies_.lists(
        strategies_.sampled_from(["z", "zz", "a", " z", "\u00e9", "\u00c3", "puzzle", "1", " "])
    ).map("".join)
)
def test_bytes_without_a_token_are_dropped_as_the_python_path_does(text: str) -> None:
    tok = gpt2_without_z()
    assert tok.kernel is not None
    assert tok.encode(text) == tok.without_kernel().encode(text)


def test_ignore_merges_takes_whole_tokens() -> None:
    # llama-bpe: a chunk that is a token is that token, whatever its merges would give
    tok = tokenizer("llama-bpe")
    assert tok._ignore_merges and tok.kernel is not None
    words = [t for t in kv_of("llama-bpe")["tokenizer.ggml.tokens"][:128000:97] if t[:1] == "Ġ"]
    for word in words[:300]:
        text = " " + word[1:]
        if bpe.alphabet_bytes(word) is not None and len(tok.pieces(text)) == 1:
            assert tok.encode(text) == python_path("llama-bpe").encode(text), word


def test_a_full_cache_starts_again_with_the_same_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bpe, "KERNEL_CACHE_LIMIT", 3)
    tok = copy.copy(tokenizer("gpt-2"))
    tok._kernel, tok._kernel_state = None, 0
    text = "the cat sat on the mat, the end of the cat; 12 34 56 the"
    assert tok.encode(text) == python_path("gpt-2").encode(text)
    assert tok.kernel.cache_size() <= 3


def test_model_arguments_are_checked() -> None:
    k = _bpe_kernel
    classes = kernel_classes(False)
    ok: dict[str, Any] = {
        "kind": k.KIND_GPT2,
        "classes": classes,
        "byte_sym": bytes(np.arange(256, dtype=np.int32)),
        "sym_token": bytes(np.arange(256, dtype=np.int32)),
        "missing_off": bytes(np.zeros(257, dtype=np.int32)),
        "missing_ids": b"",
        "merges": bytes(np.array([97, 98, 0, 300], dtype=np.int32)),  # 300: no such symbol
        "vocab_blob": b"",
        "vocab_off": bytes(4),
        "vocab_ids": b"",
        "ignore_merges": False,
        "cache_limit": 16,
    }
    with pytest.raises(ValueError, match="merge 0"):
        k.Model(**ok)
    ok["merges"] = b""
    model = k.Model(**ok)
    assert np.frombuffer(model.encode("ab c"), dtype=np.int32).tolist() == [97, 98, 32, 99]
    with pytest.raises(TypeError):
        model.encode(b"ab")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        model.__init__(**ok)  # type: ignore[misc]
    for key, value in [
        ("kind", 99),
        ("classes", b"x"),
        ("byte_sym", bytes(8)),
        ("missing_off", bytes(8)),
        ("sym_token", b"abc"),
    ]:
        with pytest.raises(ValueError):
            k.Model(**{**ok, key: value})


# tokenizer.json sources, threads ------------------------------------------------------------


@cache
def json_tokenizer() -> ByteLevelBPE:
    """GPT-2's vocabulary as a tokenizer.json with an NFC normalizer and a prefix space (both
    applied before the kernel)."""
    kv = kv_of("gpt-2")
    obj = {
        "model": {
            "type": "BPE",
            "vocab": {t: i for i, t in enumerate(kv["tokenizer.ggml.tokens"])},
            "merges": list(kv["tokenizer.ggml.merges"]),
        },
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True},
    }
    tok = load.from_tokenizer_json(json.loads(json.dumps(obj)))
    assert isinstance(tok, ByteLevelBPE)
    return tok


@SLOW
@given(text=TEXTS)
def test_tokenizer_json_source_equals_the_python_path(text: str) -> None:
    tok = json_tokenizer()
    assert tok.kernel is not None
    assert tok.encode(text) == tok.without_kernel().encode(text)


def test_threads_share_one_kernel() -> None:
    tok = tokenizer("llama-bpe")
    texts = [
        f"thread {i}: " + "The quick brown fox jumps over 1234567 dogs.\n" * 50 for i in range(8)
    ]
    expected = [python_path("llama-bpe").encode(t) for t in texts]
    results: list[list[int]] = [[] for _ in texts]

    def work(i: int) -> None:
        for _ in range(5):
            results[i] = tok.encode(texts[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(texts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == expected
