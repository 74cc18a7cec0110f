"""Byte-level BPE from a Hugging Face `tokenizer.json`: the shapes matrixctl follows exactly,
and nothing else (docs/tokenizers.md, "Byte-level BPE").

Handled: model BPE over GPT-2's byte alphabet (no dropout, no subword prefix or suffix, no byte
fallback, every one of the 256 byte characters in the vocabulary); normalizer none or NFC;
pre-tokenizer ByteLevel (GPT-2's expression, with or without a prefix space), or a Sequence of
Split (a regular expression, "Isolated", not inverted) and Digits steps ending in a ByteLevel;
non-special added tokens without lstrip, rstrip or single_word. Special added tokens are not
parsed from text; no truncation and no padding. Anything else is TOKENIZER_UNSUPPORTED, named.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from matrixctl.errors import FormatError
from matrixctl.tokenizers.model.base import TOKENIZER_UNSUPPORTED, TOKENIZER_VOCAB
from matrixctl.tokenizers.model.bpe import (
    BYTE_TO_CHAR,
    Ranks,
    Step,
    alphabet_bytes,
    alphabet_text,
    nfc,
    token_utf8,
)
from matrixctl.tokenizers.model.uclasses import WS, char_class

if TYPE_CHECKING:
    from matrixctl.tokenizers.model.bpe import ByteLevelBPE

# GPT-2's expression, as the ByteLevel pre-tokenizer carries it
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


def _unsupported(what: str, field: str) -> FormatError:
    return FormatError(
        TOKENIZER_UNSUPPORTED, f"tokenizer.json: {what} is not handled exactly", field=field
    )


def _bad(what: str, field: str) -> FormatError:
    return FormatError(TOKENIZER_VOCAB, f"tokenizer.json: {what}", field=field)


_SIMPLE_ESCAPES = set("rntfv\\'\"-[](){}.|?*+^$/ #&~,:;<>=!@%`_")


def translate_regex(pattern: str, field: str) -> str:
    """An Oniguruma expression (as tokenizer.json holds them) in Python's `re` syntax, with
    \\p{X} as the category classes of `uclasses` and \\s as Unicode white space; a construct
    whose meaning could differ raises TOKENIZER_UNSUPPORTED."""
    out: list[str] = []
    i = 0
    n = len(pattern)
    in_class = False
    while i < n:
        c = pattern[i]
        if c == "\\":
            if i + 1 >= n:
                raise _unsupported("a trailing backslash in a pattern", field)
            d = pattern[i + 1]
            if d in "pP":
                m = re.match(r"\{(\^?)([A-Za-z]+)\}", pattern[i + 2 :])
                if not m or m.group(1) or m.group(2) not in tuple("LNPSMZC"):
                    raise _unsupported(f"the class {pattern[i : i + 8]!r} in a pattern", field)
                body = char_class(m.group(2))
                if d == "P":
                    if in_class:
                        raise _unsupported("\\P{..} inside [...] in a pattern", field)
                    out.append(f"[^{body}]")
                else:
                    out.append(body if in_class else f"[{body}]")
                i += 2 + m.end()
                continue
            if d == "s":
                out.append(WS if in_class else f"[{WS}]")
            elif d == "S":
                if in_class:
                    raise _unsupported("\\S inside [...] in a pattern", field)
                out.append(f"[^{WS}]")
            elif d in _SIMPLE_ESCAPES:
                out.append("\\" + d)
            else:
                raise _unsupported(f"the escape \\{d} in a pattern", field)
            i += 2
            continue
        if in_class:
            if c == "[":
                raise _unsupported("a nested character class in a pattern", field)
            if c == "&" and pattern.startswith("&&", i):
                raise _unsupported("a class intersection in a pattern", field)
            if c == "]":
                in_class = False
            out.append(c)
            i += 1
            continue
        if c == "[":
            in_class = True
            out.append(c)
            i += 1
            if i < n and pattern[i] == "^":
                out.append("^")
                i += 1
            if i < n and pattern[i] == "]":
                raise _unsupported("a class starting with ']' in a pattern", field)
            continue
        if c in "^$":
            raise _unsupported("a line anchor in a pattern", field)
        if c == "(" and pattern.startswith("(?", i):
            m = re.match(r"\(\?(?::|=|!|i:)", pattern[i:])
            if not m:
                raise _unsupported(f"the group {pattern[i : i + 4]!r} in a pattern", field)
            out.append(m.group(0))
            i += m.end()
            continue
        out.append(c)
        i += 1
    if in_class:
        raise _unsupported("an unclosed class in a pattern", field)
    return "".join(out)


def _steps(pre: Any) -> tuple[list[Step], bool]:
    """The pre-tokenizer's steps and whether it adds a prefix space."""
    if pre is None:
        raise _unsupported("a missing pre_tokenizer (not byte-level)", "pre_tokenizer")
    if not isinstance(pre, Mapping):
        raise _bad("pre_tokenizer is not an object", "pre_tokenizer")
    items = pre.get("pretokenizers") if pre.get("type") == "Sequence" else [pre]
    if not isinstance(items, list) or not items:
        raise _bad("pre_tokenizer Sequence has no steps", "pre_tokenizer")
    last = items[-1]
    if not isinstance(last, Mapping) or last.get("type") != "ByteLevel":
        raise _unsupported("a pre_tokenizer that does not end in ByteLevel", "pre_tokenizer")
    steps: list[Step] = []
    for k, item in enumerate(items[:-1]):
        field = f"pre_tokenizer.pretokenizers[{k}]"
        if not isinstance(item, Mapping):
            raise _bad(f"{field} is not an object", field)
        kind = item.get("type")
        if kind == "Split":
            pattern = item.get("pattern")
            if item.get("behavior") != "Isolated" or item.get("invert", False):
                raise _unsupported(
                    f"Split behavior {item.get('behavior')!r} invert {item.get('invert')!r}",
                    field,
                )
            if not isinstance(pattern, Mapping):
                raise _bad(f"{field}.pattern is not an object", field)
            if "Regex" in pattern and isinstance(pattern["Regex"], str):
                source = translate_regex(pattern["Regex"], field)
            elif "String" in pattern and isinstance(pattern["String"], str) and pattern["String"]:
                source = re.escape(pattern["String"])
            else:
                raise _unsupported(f"the Split pattern {dict(pattern)!r}", field)
            try:
                steps.append(Step(source))
            except (re.error, ValueError) as exc:
                raise _unsupported(f"the Split pattern ({exc})", field) from None
        elif kind == "Digits":
            nclass = f"[{char_class('N')}]"
            steps.append(Step(nclass if item.get("individual_digits") else nclass + "+"))
        else:
            raise _unsupported(f"the pre-tokenizer {kind!r}", field)
    if last.get("use_regex", True):
        steps.append(Step(translate_regex(GPT2_PATTERN, "pre_tokenizer")))
    prefix = last.get("add_prefix_space", False)
    if not isinstance(prefix, bool):
        raise _bad("ByteLevel add_prefix_space is not a boolean", "pre_tokenizer")
    return steps, prefix


def _normalizer(norm: Any) -> Callable[[str], str] | None:
    if norm is None:
        return None
    if not isinstance(norm, Mapping):
        raise _bad("normalizer is not an object", "normalizer")
    kind = norm.get("type")
    if kind == "NFC":
        return nfc
    if kind == "Sequence":
        inner = norm.get("normalizers")
        if isinstance(inner, list):
            funcs = [_normalizer(x) for x in inner]
            chosen = [f for f in funcs if f is not None]
            if not chosen:
                return None
            if len(chosen) == 1:
                return chosen[0]
    raise _unsupported(f"the normalizer {kind!r}", "normalizer")


def _merge_pair(entry: Any, k: int) -> tuple[str, str]:
    if isinstance(entry, str):
        pos = entry.find(" ", 1)
        if pos < 0:
            raise _bad(f"model.merges[{k}] has no space", "model.merges")
        return entry[:pos], entry[pos + 1 :]
    if isinstance(entry, list) and len(entry) == 2 and all(isinstance(x, str) for x in entry):
        return entry[0], entry[1]
    raise _bad(f"model.merges[{k}] is neither 'a b' nor [a, b]", "model.merges")


def build(cls: type[ByteLevelBPE], obj: Mapping[str, Any]) -> ByteLevelBPE:
    model = obj.get("model")
    if not isinstance(model, Mapping) or model.get("type") != "BPE":
        raise _unsupported("a model that is not BPE", "model.type")
    for key in ("dropout", "continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key) not in (None, ""):
            raise _unsupported(f"model.{key} = {model.get(key)!r}", f"model.{key}")
    if model.get("byte_fallback"):
        raise _unsupported("model.byte_fallback", "model.byte_fallback")
    for key in ("truncation", "padding"):
        if obj.get(key) is not None:
            raise _unsupported(f"{key} set", key)
    vocab = model.get("vocab")
    if not isinstance(vocab, Mapping) or not vocab:
        raise _bad("model.vocab is not a non-empty object", "model.vocab")
    for text, tid in vocab.items():
        if not isinstance(text, str) or not isinstance(tid, int) or isinstance(tid, bool):
            raise _bad(f"model.vocab entry {text!r}: {tid!r}", "model.vocab")
        if tid < 0:
            raise _bad(f"model.vocab id {tid} is negative", "model.vocab")
    missing = [b for b in range(256) if BYTE_TO_CHAR[b] not in vocab]
    if missing:
        raise _unsupported(
            f"a vocabulary without the byte characters of {len(missing)} bytes (not byte-level)",
            "model.vocab",
        )
    merges = model.get("merges")
    if not isinstance(merges, list):
        raise _bad("model.merges is not a list", "model.merges")
    ignore_merges = model.get("ignore_merges", False)
    if not isinstance(ignore_merges, bool):
        raise _bad("model.ignore_merges is not a boolean", "model.ignore_merges")

    byte_vocab: dict[bytes, int] = {}
    for text, tid in vocab.items():
        b = alphabet_bytes(text)
        if b is not None:
            byte_vocab[b] = tid
    ranks: Ranks = {}
    for k, entry in enumerate(merges):
        a_text, b_text = _merge_pair(entry, k)
        if a_text not in vocab or b_text not in vocab or a_text + b_text not in vocab:
            raise _bad(f"model.merges[{k}] {a_text!r} {b_text!r} is not in the vocabulary", "")
        a, b = alphabet_bytes(a_text), alphabet_bytes(b_text)
        if a is None or b is None:
            continue  # no chunk's symbols can spell it
        ranks[(a, b)] = k  # Hugging Face keeps the last of a repeated merge

    # added tokens
    added = obj.get("added_tokens") or []
    if not isinstance(added, list):
        raise _bad("added_tokens is not a list", "added_tokens")
    id_text: dict[int, str] = {tid: text for text, tid in vocab.items()}
    plain: list[tuple[str, int]] = []
    for k, tok in enumerate(added):
        field = f"added_tokens[{k}]"
        if not isinstance(tok, Mapping):
            raise _bad(f"{field} is not an object", field)
        tid, content = tok.get("id"), tok.get("content")
        if not isinstance(tid, int) or isinstance(tid, bool) or tid < 0:
            raise _bad(f"{field}.id is not a token id", field)
        if not isinstance(content, str) or not content:
            raise _bad(f"{field}.content is not a non-empty string", field)
        id_text[tid] = content
        if tok.get("special", False):
            continue
        for opt in ("single_word", "lstrip", "rstrip"):
            if tok.get(opt, False):
                raise _unsupported(f"the added token {content!r} with {opt}", field)
        plain.append((content, tid))
    size = max(id_text) + 1
    token_bytes = [b""] * size
    tokens = [""] * size
    for tid, text in id_text.items():
        tokens[tid] = text
        b = alphabet_bytes(text) if tid in vocab.values() and vocab.get(text) == tid else None
        token_bytes[tid] = b if b is not None else token_utf8(text)
    for text, tid in vocab.items():
        b = alphabet_bytes(text)
        if b is not None:
            token_bytes[tid] = b

    normalize = _normalizer(obj.get("normalizer"))
    if normalize is not None and any(
        tok.get("normalized", True) and not tok.get("special", False)
        for tok in added
        if isinstance(tok, Mapping)
    ):
        raise _unsupported("normalized added tokens with a normalizer", "added_tokens")
    steps, prefix = _steps(obj.get("pre_tokenizer"))

    splitter: Callable[[str], list[str | int]] | None = None
    if plain:
        ordered = sorted(plain, key=lambda p: -len(p[0]))
        by_text = dict(plain)
        rx = re.compile("|".join(re.escape(t) for t, _ in ordered))

        def split(text: str) -> list[str | int]:
            out: list[str | int] = []
            pos = 0
            for m in rx.finditer(text):
                if m.start() > pos:
                    out.append(text[pos : m.start()])
                out.append(by_text[m.group()])
                pos = m.end()
            if pos < len(text):
                out.append(text[pos:])
            return out

        splitter = split

    def no_missing(symbol: bytes) -> list[int]:  # every symbol is a token (checked above)
        raise AssertionError(alphabet_text(symbol))

    self = cls(
        tokens=tokens,
        token_bytes=token_bytes,
        byte_vocab=byte_vocab,
        ranks=ranks,
        steps=steps,
        pre=_pre_name(obj.get("pre_tokenizer")),
        source="tokenizer.json",
        ignore_merges=ignore_merges,
        missing=no_missing,
        splitter=splitter,
        normalize=normalize,
        prefix_space=prefix,
    )
    return self


def _pre_name(pre: Any) -> str:
    if isinstance(pre, Mapping) and pre.get("type") == "Sequence":
        items: Sequence[Any] = pre.get("pretokenizers") or []
        return "+".join(str(p.get("type")) for p in items if isinstance(p, Mapping))
    return str(pre.get("type")) if isinstance(pre, Mapping) else "none"
