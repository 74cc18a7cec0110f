"""How far π agrees with a model's own tokenizer on the bundled sample, from a vocabulary plan.

A `VocabPlan` is the π symbol map built from a model's vocabulary (`ingest gguf` builds it
from a GGUF file, `verify` again from the folder it wrote) with every token's text and the
bytes each token matches (`keys_of`). Where a reference tokenizer covers the model's type
(`matrixctl.tokenizers.reference.tokenizer_type`), the bundled sample text
(`matrixctl/data/tokenizer_sample.txt`) is tokenized twice, by the reference and by π with
the plan's map, and the agreement is the share of tokens both give identically (same id over
the same span; docs/formats/gguf.md, "Which tokenizer the model uses").

π runs on a copy of the map holding only the symbols whose bytes occur in the sample: greedy
leftmost-longest matching can only ever choose a symbol that occurs in the text, so the tokens
are those of the whole map, and the matcher (trie) is built over a few thousand symbols instead of
up to hundreds of thousands.

Bytes and ids only, as every tokenizer module: the caller reads the merges or scores from its
file (`matrixctl.ingest.gguf_tokenizer.measure` from a GGUF, `verify` from the sidecar) and
hands them in, so the builder and the validator share this module from below both.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from itertools import compress, count
from typing import Any

from matrixctl.tokenizers import pi
from matrixctl.tokenizers import reference as ref

SAMPLE = "tokenizer_sample.txt"
SHORT_KEY = 16  # keys up to this many bytes are looked up in a set of the sample's substrings
BATCH = 8192  # tokens keyed per step (bounded temporary memory)
REFERENCES = {
    "bpe": "byte-level BPE by merge rank after the {pre} pre-tokenizer",
    "sentencepiece": "SentencePiece BPE by score with byte fallback",
    "wordpiece": "WordPiece, greedy longest-match-first per word",
}


@dataclass
class VocabPlan:
    """The symbol map built from a GGUF vocabulary, and what was decided on the way."""

    smap: pi.SymbolMap
    model: str | None
    pre: str | None
    tokens: int
    special_ids: dict[str, int]  # GGUF's own (bos, eos, unk, pad, sep, cls, mask, ...)
    not_utf8: dict[int, bytes] = field(default_factory=dict)
    reasons: dict[str, int] = field(default_factory=dict)  # why tokens are special: counts
    texts: list[str] = field(default_factory=list)  # every token's text, in GGUF order
    keys: list[bytes] = field(default_factory=list)  # the bytes each token matches


def keys_of(texts: list[str], marking: pi.SpaceMarking | None) -> list[bytes]:
    """The bytes each token matches under the marking (batch by batch over the joined text
    when the marking is a plain replacement and no token holds a NUL)."""
    key = marking.key if marking is not None else (lambda t: t.encode("utf-8"))
    if marking is not None and marking.marker is None:
        return [key(t) for t in texts]
    out: list[bytes] = []
    for first in range(0, len(texts), BATCH):
        batch = texts[first : first + BATCH]
        joined = "\x00".join(batch)
        if joined.count("\x00") != len(batch) - 1:
            out.extend(key(t) for t in batch)
            continue
        if marking is not None:
            joined = joined.replace(marking.marker or "", " ")
        out.extend(joined.encode("utf-8").split(b"\x00"))
    return out


@dataclass
class Measured:
    type: ref.TokenizerType
    agreement: ref.Agreement | None
    manifest: dict[str, Any] | None  # the manifest's tokenizer.agreement
    why_not: str | None = None  # why the agreement was not measured


def sample() -> bytes:
    """The bundled sample text (package data beside the default symbol map)."""
    from matrixctl.package import data_path

    with open(data_path(SAMPLE), "rb") as fp:
        return fp.read()


def _sample_bpe(plan: VocabPlan, merges: list[bytes], text: str) -> ref.ByteLevelBPE:
    """The byte-level BPE reference, holding only what can apply to `text`: the tokens whose
    bytes occur in it and the merges whose result does (a merge of two symbols of a piece
    yields bytes of that piece). On `text` it tokenizes as the whole vocabulary does, without
    hashing every token and merge of a large vocabulary."""
    whole = ref.ByteLevelBPE({}, {}, plan.pre or "")
    subs: set[bytes] = set()
    for piece in set(whole.pieces(text)):
        spelt = whole.spelt(piece).encode("utf-8")
        subs.update(spelt[i:j] for i in range(len(spelt)) for j in range(i + 1, len(spelt) + 1))
    data = text.encode("utf-8")
    ids = {plan.texts[i]: i for i in occurring(plan.keys, data)}
    joined = b"\x00".join(merges)
    if joined.count(b"\x00") == len(merges) - 1:  # no NUL inside a merge: one pass in C
        results = joined.replace(b" ", b"").split(b"\x00")
    else:
        results = [item.replace(b" ", b"") for item in merges]
    ranks: dict[str, int] = {}
    for rank in compress(count(), map(subs.__contains__, results)):
        ranks.setdefault(merges[rank].decode("utf-8", "replace"), rank)
    return ref.ByteLevelBPE(ids, ranks, whole.pre)


_LAST: list[tuple[list[bytes], bytes, list[int]]] = []  # the last answer (asked twice for BPE)


def occurring(keys: list[bytes], data: bytes) -> list[int]:
    """The indexes of the non-empty keys that occur in `data`, in order."""
    if _LAST and _LAST[0][0] is keys and _LAST[0][1] == data:
        return _LAST[0][2]
    n = len(data)
    subs = {data[i : i + k] for k in range(1, SHORT_KEY + 1) for i in range(n - k + 1)}
    # map/compress: the loops run in C (this is most of the measurement's time on a large
    # vocabulary).
    found = list(compress(count(), map(subs.__contains__, keys)))
    longer = compress(count(), map(SHORT_KEY.__lt__, map(len, keys)))
    found += [i for i in longer if keys[i] in data]
    found.sort()
    _LAST[:] = [(keys, data, found)]
    return found


def reference_for(
    plan: VocabPlan,
    kind: ref.TokenizerType,
    text: str,
    merges: list[bytes] | None,
    scores: list[float] | None,
) -> tuple[Any, str] | str:
    """(the reference tokenizer for `text`, what it is) or why there is none. `merges` and
    `scores` are the GGUF's (or the sidecar's, when `verify` measures again)."""
    marking = plan.smap.space_marking
    if kind.family == "bpe":
        if not merges:
            return "the file has no tokenizer.ggml.merges strings"
        assert plan.pre is not None
        what = REFERENCES["bpe"].format(pre=ref.PRE_TOKENIZERS[plan.pre])
        return _sample_bpe(plan, merges, text), what
    if kind.family == "sentencepiece":
        if scores is None or len(scores) != plan.tokens:
            return "the file has no tokenizer.ggml.scores for every token"
        prefix = marking is not None and marking.prefix_space
        tok = ref.SentencePieceBPE(plan.texts, scores, prefix_space=prefix, unk_id=plan.smap.unk_id)
        return tok, REFERENCES["sentencepiece"]
    if kind.family == "wordpiece":
        if marking is None or marking.scheme != "wordpiece" or marking.marker is None:
            return "the vocabulary is not in llama.cpp's form (U+2581 before a word's first piece)"
        unk = plan.special_ids.get("unk", plan.smap.unk_id)
        return ref.WordPiece(plan.texts, unk_id=unk, marker=marking.marker), REFERENCES["wordpiece"]
    return f"no reference tokenizer for {kind.name}"


def pi_spans(plan: VocabPlan, text: str) -> list[ref.Span]:
    """π's tokens of `text` under the map of `plan`, as spans in the reference's coordinates."""
    smap = plan.smap
    marking = smap.space_marking
    prepared = marking.prepare(text) if marking is not None else text
    prefix = b" " if marking is not None and marking.adds_prefix and prepared else b""
    data = prefix + prepared.encode("utf-8")
    found = occurring(plan.keys, data)
    base = smap.byte_base_id if smap.byte_fallback else None
    keep = tuple(
        (sid, plan.texts[sid])
        for sid in found
        if sid not in smap.specials and (base is None or not base <= sid < base + 256)
    )
    small = smap.replace(symbols=keep, specials=frozenset())
    matched, spans = pi.Tokenizer(small).spans(text)
    if marking is None or marking.scheme != "wordpiece":
        return spans
    # WordPiece: offsets counted in the bytes that are not spaces (π's prepared text has only
    # U+0020 as white space).
    content = [0] * (len(matched) + 1)
    seen = 0
    for i, b in enumerate(matched):
        content[i] = seen
        seen += b != 0x20
    content[len(matched)] = seen
    return [(sid, content[s], content[e]) for sid, s, e in spans]


def measure_with(
    plan: VocabPlan,
    kind: ref.TokenizerType,
    merges: list[bytes] | None,
    scores: list[float] | None,
) -> Measured:
    """The agreement on the bundled sample, from the plan and the merges or scores."""
    raw = sample()
    text = raw.decode("utf-8")
    try:
        made = reference_for(plan, kind, text, merges, scores)
        if isinstance(made, str):
            return Measured(kind, None, None, made)
        reference, what = made
        result = ref.agreement(reference.tokenize(text), pi_spans(plan, text))
    finally:
        _LAST.clear()
    manifest = {
        "sample": SAMPLE,
        "sample_sha256": sample_sha256(raw),
        "reference": what,
        "reference_tokens": result.reference_tokens,
        "pi_tokens": result.pi_tokens,
        "matched": result.matched,
        "share": result.rounded(),
    }
    return Measured(kind, result, manifest)


def sample_sha256(raw: bytes | None = None) -> str:
    return "sha256:" + hashlib.sha256(sample() if raw is None else raw).hexdigest()


def report_line(m: Measured) -> tuple[str, bool]:
    """(the line for the report, whether it is a warning)."""
    if m.agreement is None:
        return (
            f"tokenizer: {m.type.name}; agreement with π not measured ({m.why_not})",
            False,
        )
    a = m.agreement
    if a.exact:
        return (
            f"tokenizer: {m.type.name}; π tokenizes the bundled sample exactly as it does "
            f"({a.reference_tokens:,} tokens)",
            False,
        )
    return (
        f"tokenizer: {m.type.name}; π's longest-match tokenization agrees with it on "
        f"{a.percent()} % of the bundled sample's tokens ({a.matched:,} identical of "
        f"{max(a.reference_tokens, a.pi_tokens):,}): π gives the model's ids for whole "
        "vocabulary entries but may cut text differently; to feed the model, tokenize with "
        "its own tokenizer",
        True,
    )
