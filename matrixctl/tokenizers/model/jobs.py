"""One large text encoded by several worker processes, with exactly the ids one process gives
(`tokenize model encode --jobs N`; docs/tokenizers.md, "Parallel encoding").

A model tokenizer's ids of a text equal the ids of its parts joined only where its
pre-tokenizer always ends a chunk whatever follows or precedes the cut, and nothing (a prefix
space, a normalizer spanning characters) is added at a part's start. `safe_cuts` knows such
places for the families where they can be shown:

- byte-level BPE with the `gpt2` and `llama3` expressions (`tokenizer.ggml.pre` gpt-2, mpt,
  llama-bpe), with no prefix space and no normalizer: after a line feed that follows a
  character which is not white space, before an ASCII letter. Both expressions end a chunk
  after such a line feed in any context (GPT-2's white-space run is that one line feed,
  followed or not by a letter; Llama 3's `\\s*[\\r\\n]+` and the punctuation rule's `[\\r\\n]*`
  stop at the letter or at the end alike), and a letter run starts afresh after it;
- WordPiece: the same places (BERT splits words at white space; its normalizer maps one
  character at a time).

Any other tokenizer is encoded whole in the calling process. `tests/tokenizers/model/
test_jobs.py` checks the rule against the whole-text ids on every vocabulary it covers.
"""

from __future__ import annotations

import itertools
import os
from array import array

from matrixctl.tokenizers.model.base import ModelTokenizer

UNIT = 1 << 20  # characters per part, about
CUT_BPE_PRE = frozenset({"gpt-2", "mpt", "llama-bpe"})

_WORKER_TOK: ModelTokenizer | None = None


def can_cut(tok: ModelTokenizer) -> bool:
    """Whether `safe_cuts` knows safe places for `tok` (see the module's docstring)."""
    if tok.family == "wpm":
        return True
    if tok.family != "bpe" or tok.source != "gguf" or tok.pre not in CUT_BPE_PRE:
        return False
    return not getattr(tok, "_prefix_space", True) and getattr(tok, "_normalize", 1) is None


def safe_cuts(text: str, unit: int = UNIT) -> list[int]:
    """Cut positions in `text` about `unit` characters apart: each just after a line feed that
    follows a character other than white space, and before an ASCII letter."""
    cuts: list[int] = []
    at = unit
    n = len(text)
    while at < n:
        i = text.find("\n", at)
        while i != -1 and i + 1 < n:
            nxt = text[i + 1]
            if i > 0 and not text[i - 1].isspace() and nxt.isascii() and nxt.isalpha():
                break
            i = text.find("\n", i + 1)
        if i == -1 or i + 1 >= n:
            break
        cuts.append(i + 1)
        at = i + 1 + unit
    return cuts


def _encode_part(part: str) -> bytes:
    assert _WORKER_TOK is not None
    return array("I", _WORKER_TOK.encode_ordinary(part)).tobytes()


def encode_parallel(tok: ModelTokenizer, text: str, jobs: int) -> list[int]:
    """`tok.encode_ordinary(text)`, the parts between safe cuts encoded by `jobs` forked
    processes (which inherit the built tokenizer); the whole text in this process when `tok`
    cannot be cut, `jobs` is 1, or the text is at most one part."""
    cuts = safe_cuts(text) if jobs > 1 and can_cut(tok) else []
    if not cuts:
        return tok.encode_ordinary(text)
    bounds = [0, *cuts, len(text)]
    parts = [text[a:b] for a, b in itertools.pairwise(bounds)]
    import multiprocessing

    global _WORKER_TOK
    _WORKER_TOK = tok
    try:
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(min(jobs, len(parts), os.cpu_count() or 1)) as pool:
            blobs = pool.map(_encode_part, parts, chunksize=1)
    finally:
        _WORKER_TOK = None
    ids: array[int] = array("I")
    for blob in blobs:
        ids.frombytes(blob)
    out: list[int] = ids.tolist()
    return out
