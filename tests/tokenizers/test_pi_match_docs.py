"""`Trie.match_docs` (matrixctl/_pi_kernel.c): many documents in one kernel call, checked
against `Trie.match` document by document."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies

from matrixctl.tokenizers import pi

TOK = pi.Tokenizer(pi.load_symbol_map(pi.default_map_path())[0])

# Ids 0-2 are unk, pad and eos; "ab" and "abc" are symbols; no byte fallback, so a character
# the map lacks is one unk (its first byte) and its continuation bytes give no id at all.
SMALL = pi.Tokenizer(
    pi.check_map_bytes(
        b'{"version": 1, "vocab_size": 70000, "unk_id": 0, "pad_id": 1, "eos_id": 2,'
        b' "byte_fallback": false, "normalization": "none", "symbols": ['
        b'{"id": 0, "text": "<unk>", "special": true}, {"id": 1, "text": "<pad>", "special": true},'
        b' {"id": 2, "text": "</s>", "special": true},'
        b' {"id": 3, "text": "ab"}, {"id": 69999, "text": "abc"}, {"id": 5, "text": " "}]}',
        "small.json",
    )
)


def one_by_one(
    tok: pi.Tokenizer, docs: list[bytes], itemsize: int, eos: int
) -> tuple[bytes, list[int]]:
    """The reference: `match` on each document, eos after each one that gave an id."""
    out, counts = [], []
    dtype = {2: "<u2", 4: "<u4", 8: "<i8"}[itemsize]
    for doc in docs:
        ids = np.frombuffer(tok.trie.match(doc, len(doc), 8)[0], dtype=np.int64)
        counts.append(ids.size)
        out.append(ids.astype(dtype).tobytes())
        if ids.size and eos >= 0:
            out.append(np.array([eos], dtype=dtype).tobytes())
    return b"".join(out), counts


DOCS = [
    b"The quick brown fox jumps over the lazy dog.\n\n",
    b"",
    "caf\u00e9 na\u00efve \u4e2d\u6587 \U0001f980".encode(),
    b"x" * 70_000,  # more ids than the first estimate of the output holds
    b" ",
]


@pytest.mark.parametrize("itemsize", [2, 4, 8])
@pytest.mark.parametrize("eos", [1, -1])
def test_the_same_ids_as_match_document_by_document(itemsize: int, eos: int) -> None:
    ids, counts = TOK.trie.match_docs(DOCS, itemsize, eos)
    want, want_counts = one_by_one(TOK, DOCS, itemsize, eos)
    assert ids == want
    assert np.frombuffer(counts, dtype=np.int64).tolist() == want_counts
    assert want_counts[1] == 0 and all(want_counts[i] for i in (0, 2, 3, 4))


def test_documents_without_ids_get_no_eos_and_wide_ids_keep_their_width() -> None:
    """A document whose matches all give no id (continuation bytes of an uncovered character
    here) counts 0 and gets no eos, like an empty one; id 69,999 needs four bytes."""
    docs = ["\u00e9".encode()[1:], b"abc ab", "\u00e9".encode(), b""]
    ids, counts = SMALL.trie.match_docs(docs, 4, 2)
    assert np.frombuffer(counts, dtype=np.int64).tolist() == [0, 3, 1, 0]
    assert np.frombuffer(ids, dtype="<u4").tolist() == [69999, 5, 3, 2, 0, 2]
    assert ids == one_by_one(SMALL, docs, 4, 2)[0]


@settings(max_examples=80, deadline=None)
@given(
    docs=strategies.lists(
        strategies.text(strategies.sampled_from("ab c\n\u00e9\u4e2dxy"), max_size=30).map(
            str.encode
        ),
        max_size=8,
    ),
    eos=strategies.sampled_from([-1, 0, 2, 65535]),
)
def test_any_documents_match_as_one_by_one(docs: list[bytes], eos: int) -> None:
    for tok in (TOK, SMALL):
        for itemsize in (4, 8) if tok is SMALL else (2, 4, 8):
            ids, counts = tok.trie.match_docs(docs, itemsize, eos)
            want, want_counts = one_by_one(tok, docs, itemsize, eos)
            assert ids == want
            assert np.frombuffer(counts, dtype=np.int64).tolist() == want_counts


def test_buffers_of_any_kind_and_bad_arguments() -> None:
    data = bytearray(b"hello world")
    ids, _ = TOK.trie.match_docs((memoryview(data)[:5], data), 2, -1)
    assert ids == one_by_one(TOK, [b"hello", b"hello world"], 2, -1)[0]
    assert TOK.trie.match_docs([], 2, 1) == (b"", b"")
    with pytest.raises(ValueError, match="itemsize"):
        TOK.trie.match_docs([b"a"], 3, -1)
    with pytest.raises(ValueError, match="eos"):
        TOK.trie.match_docs([b"a"], 2, 65536)
    with pytest.raises(TypeError):
        TOK.trie.match_docs([b"a", "text"], 2, -1)
    with pytest.raises(TypeError):
        TOK.trie.match_docs(5, 2, -1)  # type: ignore[arg-type]
