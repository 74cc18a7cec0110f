"""Which tokens of a GGUF vocabulary llama.cpp cuts out of the text before tokenizing, when
special tokens are not parsed (`parse_special=false`), and how it treats them.

llama.cpp keeps one attribute set per token, starting from `tokenizer.ggml.token_type`, then
adjusted by token text when the vocabulary is loaded (docs/tokenizers.md lists the rules):

- a token whose text looks like an end of turn, end of text, fill-in-the-middle or
  end-of-generation marker (`<|im_end|>`, `<|endoftext|>`, `<|fim_prefix|>`, ...) becomes a
  control token, whatever its type said;
- `<|channel|>`, `<|message|>`, `<|start|>`, `<|constrain|>` become user-defined;
- `<|end|>` becomes user-defined when `<|return|>` and `<|call|>` (or `<|calls|>` and `<|flush|>`)
  also end generation; `</s>` becomes normal when `<|tool_response>` or `<|plamo:eos|>` does.

With special tokens not parsed, every user-defined token that is not also control or unknown
is still matched in the raw text first: longest text first, each occurrence left to right, and
the text around it is tokenized on its own. Some model names strip white space around them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# llama.cpp's token attribute bits (llama_token_attr).
ATTR_UNKNOWN = 1 << 0
ATTR_UNUSED = 1 << 1
ATTR_NORMAL = 1 << 2
ATTR_CONTROL = 1 << 3
ATTR_USER_DEFINED = 1 << 4
ATTR_BYTE = 1 << 5
ATTR_LSTRIP = 1 << 7
ATTR_RSTRIP = 1 << 8

_TYPE_TO_ATTR = {
    0: 0,  # undefined
    1: ATTR_NORMAL,
    2: ATTR_UNKNOWN,
    3: ATTR_CONTROL,
    4: ATTR_USER_DEFINED,
    5: ATTR_UNUSED,
    6: ATTR_BYTE,
}

# (GGUF key of the id, texts that make a token that id when the key is absent). The first token
# found of a group becomes control.
_FIRST_FOUND: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
    (
        ("tokenizer.ggml.eot_token_id",),
        (
            "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
            "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]",
            "<\uff5cend\u2581of\u2581sentence\uff5c>",
            "<end_of_utterance>",
        ),
    ),
    (("tokenizer.ggml.eom_token_id",), ("<|eom_id|>",)),
    (
        ("tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id"),
        (
            "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\uff5cfim\u2581begin\uff5c>",
            "<PRE>", "\u2581<PRE>", "<|code_prefix|>", "<|prefix|>",
        ),
    ),
    (
        ("tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id"),
        (
            "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\uff5cfim\u2581hole\uff5c>",
            "<SUF>", "\u2581<SUF>", "<|code_suffix|>", "<|suffix|>",
        ),
    ),
    (
        ("tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id"),
        (
            "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\uff5cfim\u2581end\uff5c>",
            "<MID>", "\u2581<MID>", "<|code_middle|>", "<|middle|>",
        ),
    ),
    (
        ("tokenizer.ggml.fim_pad_token_id",),
        ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    ),
    (
        ("tokenizer.ggml.fim_rep_token_id",),
        ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    ),
    (("tokenizer.ggml.fim_sep_token_id",), ("<|file_sep|>",)),
)  # fmt: skip

# Texts that end generation: always control.
_EOG_TEXTS = frozenset(
    {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
        "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>",
        "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>",
        "<|tool_response>", "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[",
    }
)  # fmt: skip
_ALWAYS_USER_DEFINED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")

# C's isspace in the "C" locale: what llama.cpp strips beside an lstrip/rstrip token.
C_SPACE = " \t\n\x0b\x0c\r"


def _id(kv: Mapping[str, Any], key: str, n: int) -> int | None:
    value = kv.get(key)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < n:
        return value
    return None


def token_attrs(
    kv: Mapping[str, Any],
    tokens: Sequence[str],
    types: Sequence[int] | None,
    *,
    default_eos: int | None,
) -> tuple[list[int], list[str]]:
    """llama.cpp's attribute of every token, and notes on choices llama.cpp leaves to hash
    order (empty when there is none)."""
    n = len(tokens)
    attrs = [ATTR_NORMAL] * n if types is None else [_TYPE_TO_ATTR.get(t, 0) for t in types[:n]]
    # token_to_id: the last token of a text wins
    text_to_id: dict[str, int] = {}
    for i, t in enumerate(tokens):
        text_to_id[t] = i
    notes: list[str] = []
    eog: set[int] = set()
    for keys, texts in _FIRST_FOUND:
        given = next((v for v in (_id(kv, k, n) for k in keys) if v is not None), None)
        if given is not None:
            found: int | None = given
        else:
            hits = [text_to_id[t] for t in texts if t in text_to_id]
            found = hits[0] if hits else None
            if len(hits) > 1 and any(not attrs[h] & ATTR_CONTROL for h in hits):
                notes.append(f"several tokens may be {keys[0]}: llama.cpp takes one by hash order")
            for h in hits[:1]:
                attrs[h] |= ATTR_CONTROL
        if found is not None and keys[0].endswith(("pad_token_id", "rep_token_id", "sep_token_id")):
            eog.add(found)
    for text, i in text_to_id.items():
        if text in _EOG_TEXTS:
            eog.add(i)
            attrs[i] |= ATTR_CONTROL
    for text in _ALWAYS_USER_DEFINED:
        if text in text_to_id:
            attrs[text_to_id[text]] = ATTR_USER_DEFINED
    eos = _id(kv, "tokenizer.ggml.eos_token_id", n)
    if eos is None and default_eos is not None and 0 <= default_eos < n:
        eos = default_eos
    for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        v = _id(kv, key, n)
        if v is not None:
            eog.add(v)
    if eos is not None:
        eog.add(eos)
    eog_texts = {tokens[i]: i for i in eog}
    if "<|end|>" in eog_texts and (
        ("<|return|>" in eog_texts and ("<|call|>" in eog_texts or "<|calls|>" in eog_texts))
        or (("<|call|>" in eog_texts or "<|calls|>" in eog_texts) and "<|flush|>" in eog_texts)
    ):
        attrs[eog_texts["<|end|>"]] = ATTR_USER_DEFINED
    if "</s>" in eog_texts and ("<|tool_response>" in eog_texts or "<|plamo:eos|>" in eog_texts):
        attrs[eog_texts["</s>"]] = ATTR_NORMAL
    # white space stripping set by model, architecture or pre-tokenizer name
    pre = kv.get("tokenizer.ggml.pre")
    pre = pre if isinstance(pre, str) else ""
    arch = kv.get("general.architecture")
    arch = arch if isinstance(arch, str) else ""
    name = kv.get("general.name")
    name = name.lower() if isinstance(name, str) else ""
    special = {
        i for i, a in enumerate(attrs) if a & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)
    }
    if any(p in pre for p in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or any(
        a in arch for a in ("nomic-bert-moe", "jina-bert-v3")
    ):
        if "<mask>" in text_to_id:
            attrs[text_to_id["<mask>"]] |= ATTR_LSTRIP
    elif "phi-3" in name or "phi3" in name:
        for i in special:
            attrs[i] |= ATTR_RSTRIP
        if "</s>" in text_to_id:
            attrs[text_to_id["</s>"]] |= ATTR_RSTRIP
        for t in ("<unk>", "<s>", "<|endoftext|>"):
            if t in text_to_id:
                attrs[text_to_id[t]] &= ~ATTR_RSTRIP
    elif "modern-bert" in name and "[MASK]" in text_to_id:
        attrs[text_to_id["[MASK]"]] |= ATTR_LSTRIP
    return attrs, notes


class SpecialSplitter:
    """Cuts the user-defined tokens out of a text the way llama.cpp does with special tokens not
    parsed: `split(text)` gives text pieces (str) and token ids (int) in order."""

    def __init__(self, tokens: Sequence[str], attrs: Sequence[int]) -> None:
        chosen = [
            i
            for i, a in enumerate(attrs)
            if a & ATTR_USER_DEFINED and not a & (ATTR_CONTROL | ATTR_UNKNOWN) and tokens[i]
        ]
        # longest text first; equal lengths by id (llama.cpp's sort leaves their order open)
        chosen.sort(key=lambda i: -len(tokens[i].encode("utf-8", "surrogatepass")))
        self.entries = [
            (tokens[i], i, bool(attrs[i] & ATTR_LSTRIP), bool(attrs[i] & ATTR_RSTRIP))
            for i in chosen
        ]
        self.first_chars = {t[0] for t, _, _, _ in self.entries}

    def __bool__(self) -> bool:
        return bool(self.entries)

    def split(self, text: str) -> list[str | int]:
        if not self.entries or not self.first_chars.intersection(text):
            return [text] if text else []
        frags: list[str | int] = [text]
        for tok, tid, lstrip, rstrip in self.entries:
            if tok not in text:
                continue
            out: list[str | int] = []
            for f in frags:
                if isinstance(f, int) or tok not in f:
                    out.append(f)
                    continue
                pos = 0
                end = len(f)
                while True:
                    m = f.find(tok, pos)
                    if m < 0:
                        break
                    left = f[pos:m]
                    if lstrip:
                        left = left.rstrip(C_SPACE)
                    if left:
                        out.append(left)
                    out.append(tid)
                    pos = m + len(tok)
                    if rstrip:
                        while pos < end and f[pos] in C_SPACE:
                            pos += 1
                if pos < end:
                    out.append(f[pos:])
            frags = out
        return frags
