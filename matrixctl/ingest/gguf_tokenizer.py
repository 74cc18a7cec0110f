"""`ingest gguf`: which tokenizer the model uses, and how far π agrees with it on a sample.

The tokenizer type comes from `tokenizer.ggml.model` and `tokenizer.ggml.pre`
(`matrixctl.tokenizers.reference.tokenizer_type`). Where a reference tokenizer covers it, the
bundled sample text (`matrixctl/data/tokenizer_sample.txt`) is tokenized twice, by the
reference and by π with the map just built, and the agreement is the share of tokens both give
identically (same id over the same span; docs/formats/gguf.md, "Which tokenizer the model
uses").

π runs on a copy of the map holding only the symbols whose bytes occur in the sample: greedy
leftmost-longest matching can only ever choose a symbol that occurs in the text, so the tokens
are those of the whole map, and the automaton is built over a few thousand symbols instead of
up to hundreds of thousands.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from matrixctl.formats import gguf as gg
from matrixctl.tokenizers import pi
from matrixctl.tokenizers import reference as ref

if TYPE_CHECKING:
    from matrixctl.ingest.gguf import VocabPlan

SAMPLE = "tokenizer_sample.txt"
SHORT_KEY = 32  # keys up to this many bytes are looked up in a set of the sample's substrings
REFERENCES = {
    "bpe": "byte-level BPE by merge rank after the {pre} pre-tokenizer",
    "sentencepiece": "SentencePiece BPE by score with byte fallback",
    "wordpiece": "WordPiece, greedy longest-match-first per word",
}


@dataclass
class Measured:
    type: ref.TokenizerType
    agreement: ref.Agreement | None
    manifest: dict[str, Any] | None  # the manifest's tokenizer.agreement
    why_not: str | None = None  # why the agreement was not measured


def sample() -> bytes:
    from importlib import resources

    return (resources.files("matrixctl") / "data" / SAMPLE).read_bytes()


def _strings(gf: gg.GgufFile, buf: Any, key: str) -> list[str] | None:
    kv = gf.kvs.get(key)
    if kv is None or not isinstance(kv.value, gg.GgufArray) or kv.value.item_type != gg.STRING:
        return None
    return [b.decode("utf-8", "replace") for b in kv.value.strings(buf)]


def _floats(gf: gg.GgufFile, buf: Any, key: str, n: int) -> list[float] | None:
    kv = gf.kvs.get(key)
    if kv is None or not isinstance(kv.value, gg.GgufArray) or kv.value.count != n:
        return None
    if kv.value.item_type not in (gg.FLOAT32, gg.FLOAT64):
        return None
    values: list[float] = kv.value.numpy(buf).astype("float64").tolist()
    return values


def reference_for(
    gf: gg.GgufFile, buf: Any, plan: VocabPlan, kind: ref.TokenizerType
) -> tuple[Any, str] | str:
    """(the reference tokenizer, what it is) or why there is none."""
    marking = plan.smap.space_marking
    if kind.family == "bpe":
        merges = _strings(gf, buf, "tokenizer.ggml.merges")
        if not merges:
            return "the file has no tokenizer.ggml.merges"
        assert plan.pre is not None
        what = REFERENCES["bpe"].format(pre=ref.PRE_TOKENIZERS[plan.pre])
        return ref.ByteLevelBPE(plan.texts, merges, plan.pre), what
    if kind.family == "sentencepiece":
        scores = _floats(gf, buf, "tokenizer.ggml.scores", plan.tokens)
        if scores is None:
            return "the file has no tokenizer.ggml.scores for every token"
        prefix = marking is not None and marking.prefix_space
        tok = ref.SentencePieceBPE(
            plan.texts, scores, prefix_space=prefix, unk_id=plan.smap.unk_id
        )
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
    subs = {data[i : i + n] for n in range(1, SHORT_KEY + 1) for i in range(len(data) - n + 1)}
    keys = plan.keys
    keep = tuple(
        (sid, t)
        for sid, t in smap.symbols
        if sid not in smap.specials
        and (keys[sid] in subs if len(keys[sid]) <= SHORT_KEY else keys[sid] in data)
    )
    small = dataclasses.replace(smap, symbols=keep, specials=frozenset())
    matched, spans = pi.Tokenizer(small).spans(text)
    if marking is None or marking.scheme != "wordpiece":
        return spans
    # WordPiece: offsets counted in the bytes that are not spaces (π's prepared text has only
    # U+0020 as white space).
    content = [0] * (len(matched) + 1)
    count = 0
    for i, b in enumerate(matched):
        content[i] = count
        count += b != 0x20
    content[len(matched)] = count
    return [(sid, content[s], content[e]) for sid, s, e in spans]


def measure(gf: gg.GgufFile, buf: Any, plan: VocabPlan) -> Measured:
    kind = ref.tokenizer_type(plan.model, plan.pre)
    if not kind.measurable:
        return Measured(kind, None, None, f"no reference tokenizer for {kind.name}")
    made = reference_for(gf, buf, plan, kind)
    if isinstance(made, str):
        return Measured(kind, None, None, made)
    reference, what = made
    raw = sample()
    text = raw.decode("utf-8")
    result = ref.agreement(reference.tokenize(text), pi_spans(plan, text))
    manifest = {
        "sample": SAMPLE,
        "sample_sha256": "sha256:" + hashlib.sha256(raw).hexdigest(),
        "reference": what,
        "reference_tokens": result.reference_tokens,
        "pi_tokens": result.pi_tokens,
        "matched": result.matched,
        "share": result.rounded(),
    }
    return Measured(kind, result, manifest)


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
        f"{max(a.reference_tokens, a.pi_tokens):,}): π gives this model's ids for whole "
        "vocabulary entries, not its segmentation; to feed the model, tokenize with its own "
        "tokenizer",
        True,
    )
