"""`tokenize model encode --jobs`: a text cut where `jobs.safe_cuts` says gives, part by part,
exactly the ids of the whole text (tokenizers/model/jobs.py). Checked on every vocabulary the
rule covers, on llama.cpp's own test texts joined with line feeds (every one of them starts a
part somewhere), and on adversarial text around the cuts (hypothesis)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings, strategies

from matrixctl.tokenizer_files import load_model_tokenizer
from matrixctl.tokenizers.model import jobs
from tests.helpers.llama_vocab import vectors, vocab_path

COVERED = ["gpt-2", "mpt", "llama-bpe", "bert-bge"]
NOT_COVERED = ["qwen2", "llama-spm", "falcon", "starcoder"]


@pytest.fixture(scope="module", params=COVERED)
def tok(request):
    return load_model_tokenizer(vocab_path(request.param))[0]


def _parts_ids(tok, text: str, unit: int) -> list[int]:
    cuts = jobs.safe_cuts(text, unit)
    bounds = [0, *cuts, len(text)]
    out: list[int] = []
    for a, b in itertools.pairwise(bounds):
        out += tok.encode_ordinary(text[a:b])
    return out


def test_rule_covers_exactly_the_documented_tokenizers() -> None:
    for name in COVERED:
        assert jobs.can_cut(load_model_tokenizer(vocab_path(name))[0]), name
    for name in NOT_COVERED:
        assert not jobs.can_cut(load_model_tokenizer(vocab_path(name))[0]), name


def test_cut_parts_give_the_whole_texts_ids(tok) -> None:
    texts = [t for name in ("gpt-2", "llama-bpe", "bert-bge") for t, _ in vectors(name)]
    text = "x\nY".join(f"{t}\n{t}" for t in texts)
    cuts = jobs.safe_cuts(text, 8)
    assert len(cuts) > 50
    assert _parts_ids(tok, text, 8) == tok.encode_ordinary(text)


ALPHABET = strategies.sampled_from(
    [*"aZ \n\n\r\t1234567890'’!?.-_", "\u00a0", "\u2029", "\u3000", "é", "日", "🦙", "\x1c"]
)


@settings(max_examples=300, deadline=None)
@given(strategies.lists(strategies.text(ALPHABET, max_size=12), min_size=2, max_size=30))
def test_any_text_around_the_cuts(tok, pieces: list[str]) -> None:
    text = "A\nb".join(pieces)  # a cut place between every two pieces
    assert _parts_ids(tok, text, 1) == tok.encode_ordinary(text)


def test_parallel_encode_equals_serial() -> None:
    tok = load_model_tokenizer(vocab_path("llama-bpe"))[0]
    text = "".join(f"Line {i} of the text, with words.\nAnd more {i * 7}\n" for i in range(40000))
    assert len(jobs.safe_cuts(text)) >= 1
    assert jobs.encode_parallel(tok, text, 2) == tok.encode_ordinary(text)
