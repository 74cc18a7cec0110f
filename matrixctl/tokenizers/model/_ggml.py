"""What the SentencePiece, WordPiece and unigram families share when built from a GGUF
vocabulary the way llama.cpp loads one (docs/tokenizers.md):

- the checked token table (`GgufVocab`): texts, scores, GGUF token types turned into token
  attributes, the text -> id map, the special ids with each family's defaults;
- the attribute adjustments llama.cpp makes by token text and model name when it loads a
  vocabulary (control-looking tokens, "unused" tokens, the Phi-3 and mask-token strip flags);
- the partition of a text at the user-defined tokens (`partition`), which runs before every
  family's own tokenizer: with special tokens not parsed, control and unknown tokens are text,
  user-defined ones are still split out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from matrixctl.errors import FormatError
from matrixctl.tokenizers.model.base import (
    TOKENIZER_UNSUPPORTED,
    TOKENIZER_VOCAB,
    TYPE_BYTE,
    TYPE_CONTROL,
    TYPE_NORMAL,
    TYPE_UNKNOWN,
    TYPE_UNUSED,
    TYPE_USER_DEFINED,
    kv_get,
    kv_list,
)

SPACE_MARK = "\u2581"

# Token attributes (bit flags, as llama.cpp keeps them per token).
ATTR_UNKNOWN = 1 << 0
ATTR_UNUSED = 1 << 1
ATTR_NORMAL = 1 << 2
ATTR_CONTROL = 1 << 3
ATTR_USER_DEFINED = 1 << 4
ATTR_BYTE = 1 << 5
ATTR_LSTRIP = 1 << 7
ATTR_RSTRIP = 1 << 8

_TYPE_ATTR = {
    TYPE_NORMAL: ATTR_NORMAL,
    TYPE_UNKNOWN: ATTR_UNKNOWN,
    TYPE_CONTROL: ATTR_CONTROL,
    TYPE_USER_DEFINED: ATTR_USER_DEFINED,
    TYPE_UNUSED: ATTR_UNUSED,
    TYPE_BYTE: ATTR_BYTE,
}  # any other type (0, undefined, or out of range): no attribute

K_MODEL = "tokenizer.ggml.model"
K_PRE = "tokenizer.ggml.pre"
K_TOKENS = "tokenizer.ggml.tokens"
K_SCORES = "tokenizer.ggml.scores"
K_TYPES = "tokenizer.ggml.token_type"

# The special ids llama.cpp reads (key suffix -> role); a value out of range keeps the default.
_ID_KEYS = {
    "bos": "tokenizer.ggml.bos_token_id",
    "eos": "tokenizer.ggml.eos_token_id",
    "eot": "tokenizer.ggml.eot_token_id",
    "eom": "tokenizer.ggml.eom_token_id",
    "unk": "tokenizer.ggml.unknown_token_id",
    "sep": "tokenizer.ggml.seperator_token_id",
    "pad": "tokenizer.ggml.padding_token_id",
    "mask": "tokenizer.ggml.mask_token_id",
    "fim_pre": "tokenizer.ggml.fim_pre_token_id",
    "fim_suf": "tokenizer.ggml.fim_suf_token_id",
    "fim_mid": "tokenizer.ggml.fim_mid_token_id",
    "fim_pad": "tokenizer.ggml.fim_pad_token_id",
    "fim_rep": "tokenizer.ggml.fim_rep_token_id",
    "fim_sep": "tokenizer.ggml.fim_sep_token_id",
}
_ID_KEYS_OLD = {  # older names of three of them, read after the new ones
    "fim_pre": "tokenizer.ggml.prefix_token_id",
    "fim_suf": "tokenizer.ggml.suffix_token_id",
    "fim_mid": "tokenizer.ggml.middle_token_id",
}

# Token texts llama.cpp treats as control tokens whatever their GGUF type says: for each role
# with no id in the metadata, the token found with one of these texts takes it and becomes a
# control token (so it is no longer split out of text as a user-defined token).
_ROLE_TEXTS = {
    "eot": (
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "<|end_of_text|>",
        "<EOT>",
        "_<EOT>",
        "[EOT]",
        "<｜end▁of▁sentence｜>",
        "<end_of_utterance>",
    ),
    "eom": ("<|eom_id|>",),
    "fim_pre": (
        "<|fim_prefix|>",
        "<fim-prefix>",
        "<fim_prefix>",
        "<｜fim▁begin｜>",
        "<PRE>",
        "▁<PRE>",
        "<|code_prefix|>",
        "<|prefix|>",
    ),
    "fim_suf": (
        "<|fim_suffix|>",
        "<fim-suffix>",
        "<fim_suffix>",
        "<｜fim▁hole｜>",
        "<SUF>",
        "▁<SUF>",
        "<|code_suffix|>",
        "<|suffix|>",
    ),
    "fim_mid": (
        "<|fim_middle|>",
        "<fim-middle>",
        "<fim_middle>",
        "<｜fim▁end｜>",
        "<MID>",
        "▁<MID>",
        "<|code_middle|>",
        "<|middle|>",
    ),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
# Texts of end-of-generation tokens: every token with one of them becomes a control token.
_EOG_TEXTS = frozenset(
    (
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<|return|>",
        "<|call|>",
        "<|flush|>",
        "<|calls|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "</s>",
        "<|eom_id|>",
        "<EOT>",
        "_<EOT>",
        "[EOT]",
        "[EOS]",
        "<|end_of_text|>",
        "<end_of_utterance>",
        "<eos>",
        "<turn|>",
        "<|tool_response>",
        "<｜end▁of▁sentence｜>",
        "[e~[",
    )
)
# Texts always made plain user-defined tokens (rendered and split out of text).
_FORCED_USER_DEFINED = frozenset(("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"))


def _fmt_ws(s: str) -> bool:
    """C's isspace() in the "C" locale, on one character."""
    return s in " \t\n\v\f\r"


class GgufVocab:
    """A GGUF token table checked and adjusted as llama.cpp loads it.

    `defaults` are the family's default special ids (role -> id or None)."""

    def __init__(self, kv: Mapping[str, Any], model: str, defaults: Mapping[str, int | None]):
        if not isinstance(kv, Mapping):
            raise FormatError(TOKENIZER_VOCAB, "the GGUF metadata is not a mapping")
        found = kv_get(kv, K_MODEL, str)
        if found != model:
            raise FormatError(
                TOKENIZER_UNSUPPORTED,
                f"{K_MODEL} is {found!r}, not {model!r}",
                field=K_MODEL,
            )
        pre = kv_get(kv, K_PRE, str, None)
        self.pre: str | None = pre
        tokens = list(kv_list(kv, K_TOKENS, str))
        n = len(tokens)
        if n == 0:
            raise FormatError(TOKENIZER_VOCAB, f"{K_TOKENS} is empty", field=K_TOKENS)
        if K_SCORES in kv:
            scores = [float(s) for s in kv_list(kv, K_SCORES, (int, float), n)]
            if any(math.isnan(s) for s in scores):
                raise FormatError(TOKENIZER_VOCAB, f"{K_SCORES} holds NaN", field=K_SCORES)
        else:
            scores = [0.0] * n
        if K_TYPES in kv:
            types = list(kv_list(kv, K_TYPES, int, n))
            attrs = [_TYPE_ATTR.get(t, 0) for t in types]
        else:
            attrs = [ATTR_NORMAL] * n
        for i, t in enumerate(tokens):
            if t == "":
                tokens[i] = f"[EMPTY_{i}]"
        ids: dict[str, int] = {}
        for i, t in enumerate(tokens):
            if t in ids:
                raise FormatError(
                    TOKENIZER_VOCAB,
                    f"{K_TOKENS}[{i}] repeats token {ids[t]} ({t!r})",
                    field=K_TOKENS,
                )
            ids[t] = i
        self.tokens = tokens
        self.scores = scores
        self.attrs = attrs
        self.ids = ids
        self.n = n

        special: dict[str, int | None] = {}
        for role, key in _ID_KEYS.items():
            default = defaults.get(role)
            if default is not None and not 0 <= default < n:
                default = None
            special[role] = default
            for k in (key, _ID_KEYS_OLD.get(role)):
                if k is None or k not in kv:
                    continue
                value = kv_get(kv, k, int)
                if isinstance(value, bool):
                    raise FormatError(TOKENIZER_VOCAB, f"{k} is bool", field=k)
                if 0 <= value < n:
                    special[role] = value
        self.special = special
        self._adjust_attrs(kv)

    def flag(self, key: str, kv: Mapping[str, Any], default: bool) -> bool:
        value = kv_get(kv, key, bool, default)
        return bool(value)

    def _adjust_attrs(self, kv: Mapping[str, Any]) -> None:
        """llama.cpp's adjustments by token text, in its order."""
        ids, attrs, special = self.ids, self.attrs, self.special
        for role, texts in _ROLE_TEXTS.items():
            if special.get(role) is not None:
                continue
            # The first match in a hash map's order takes the role; with several candidates
            # in one vocabulary that order is unspecified: the lowest id is taken here.
            found = sorted(ids[t] for t in texts if t in ids)
            if found:
                special[role] = found[0]
                attrs[found[0]] |= ATTR_CONTROL
        for i, text in enumerate(self.tokens):
            if attrs[i] & ATTR_CONTROL and "unused" in text:
                attrs[i] |= ATTR_UNUSED
        eog: set[int] = set()
        for role in ("fim_pad", "fim_rep", "fim_sep"):
            if special.get(role) is not None:
                eog.add(special[role])  # type: ignore[arg-type]
        for text in _EOG_TEXTS:
            i = ids.get(text, -1)
            if i >= 0:
                eog.add(i)
                attrs[i] |= ATTR_CONTROL
        for text in _FORCED_USER_DEFINED:
            i = ids.get(text, -1)
            if i >= 0:
                attrs[i] = ATTR_USER_DEFINED
        for role in ("eos", "eot", "eom"):
            if special.get(role) is not None:
                eog.add(special[role])  # type: ignore[arg-type]
        eog_texts = {self.tokens[i] for i in eog}
        has_call = "<|call|>" in eog_texts or "<|calls|>" in eog_texts
        if "<|end|>" in eog_texts and (
            ("<|return|>" in eog_texts and has_call) or (has_call and "<|flush|>" in eog_texts)
        ):
            attrs[ids["<|end|>"]] = ATTR_USER_DEFINED
        if "</s>" in eog_texts and (
            "<|tool_response>" in eog_texts or "<|plamo:eos|>" in eog_texts
        ):
            attrs[ids["</s>"]] = ATTR_NORMAL

        cached = [
            i for i in range(self.n) if attrs[i] & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)
        ]
        # Longest text first (in UTF-8 bytes); equal lengths by id (llama.cpp's sort is not
        # stable: its order of equal lengths is unspecified).
        cached.sort(key=lambda i: (-len(self.tokens[i].encode("utf-8", "surrogatepass")), i))

        pre = self.pre or ""
        arch = kv.get("general.architecture")
        arch = arch if isinstance(arch, str) else ""
        name = kv.get("general.name")
        name = name.lower() if isinstance(name, str) else ""
        if any(s in pre for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or any(
            s in arch for s in ("nomic-bert-moe", "jina-bert-v3")
        ):
            if "<mask>" in ids:
                attrs[ids["<mask>"]] |= ATTR_LSTRIP
        elif "phi-3" in name or "phi3" in name:
            for i in cached:
                attrs[i] |= ATTR_RSTRIP
            if "</s>" in ids:
                attrs[ids["</s>"]] |= ATTR_RSTRIP
            for text in ("<unk>", "<s>", "<|endoftext|>"):
                if text in ids:
                    attrs[ids[text]] &= ~ATTR_RSTRIP
        elif "modern-bert" in name and "[MASK]" in ids:
            attrs[ids["[MASK]"]] |= ATTR_LSTRIP

        # With special tokens not parsed, only user-defined tokens are split out of text.
        self.splitters: list[tuple[str, int, int]] = [
            (self.tokens[i], i, attrs[i])
            for i in cached
            if not attrs[i] & (ATTR_CONTROL | ATTR_UNKNOWN)
        ]

    def is_attr(self, token_id: int, attr: int) -> bool:
        return bool(self.attrs[token_id] & attr)


Fragment = str | int  # raw text, or the id of a user-defined token split out of it


def partition(text: str, splitters: Sequence[tuple[str, int, int]]) -> list[Fragment]:
    """`text` split at the user-defined tokens, longest first, each fragment left to right;
    a token with the left-strip flag drops the C white space just before it, one with the
    right-strip flag the white space just after it."""
    if not text:
        return []
    frags: list[Fragment] = [text]
    for token, tid, attr in splitters:
        if not any(isinstance(f, str) and token in f for f in frags):
            continue
        out: list[Fragment] = []
        for f in frags:
            if isinstance(f, int) or token not in f:
                out.append(f)
                continue
            pos, end = 0, len(f)
            while True:
                m = f.find(token, pos, end)
                if m < 0:
                    if pos < end:
                        out.append(f[pos:end])
                    break
                left_end = m
                if attr & ATTR_LSTRIP:
                    while left_end > pos and _fmt_ws(f[left_end - 1]):
                        left_end -= 1
                if left_end > pos:
                    out.append(f[pos:left_end])
                out.append(tid)
                pos = m + len(token)
                if attr & ATTR_RSTRIP:
                    while pos < end and _fmt_ws(f[pos]):
                        pos += 1
        frags = out
    return frags


def spm_piece_text(text: str) -> bytes:
    """A normal token's text as decoded bytes: U+2581 back to spaces."""
    return text.replace(SPACE_MARK, " ").encode("utf-8", "surrogatepass")


def byte_value(text: str) -> int | None:
    """The byte of a `<0xNN>` token text (llama.cpp reads the two hex digits)."""
    if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
        try:
            return int(text[3:5], 16)
        except ValueError:
            return None
    return None
