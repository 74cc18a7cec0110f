"""Gemma 4's tokenizer (`tokenizer.ggml.model` "gemma4"): BPE over raw UTF-8 characters, not
GPT-2's byte alphabet, exactly as llama.cpp runs it (docs/tokenizers.md, "Byte-level BPE").

- User-defined tokens are cut out of the text first (`llama_special.py`).
- Each space becomes U+2581; the text is split into runs of newlines and runs of anything else
  (no other pre-tokenization). A run of newlines that is a token is that token.
- Each run starts as one symbol per character and is merged by merge rank (lowest first, the
  leftmost of equal ones first). A final symbol that is not a token becomes its UTF-8 bytes as
  `<0xXX>` byte tokens.

Decoding gives U+2581 back as a space, so a text that holds U+2581 itself does not come back
unchanged (every other text does).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from matrixctl.errors import FormatError
from matrixctl.tokenizers.model import llama_special as special
from matrixctl.tokenizers.model.base import (
    TOKENIZER_ID,
    TOKENIZER_UNSUPPORTED,
    TOKENIZER_VOCAB,
    ModelTokenizer,
    kv_get,
    kv_list,
)
from matrixctl.tokenizers.model.bpe import (
    Ranks,
    _split_merge,
    byte_token_value,
    merge_symbols,
    special_id,
    token_utf8,
    utf8,
)

SPACE_MARK = "\u2581"


class Gemma4(ModelTokenizer):
    family = "gemma4"

    def __init__(self) -> None:
        self.pre = "gemma4"
        self.source = "gguf"
        self.vocab_size = 0
        self._text_to_id: dict[str, int] = {}
        self._ranks: Ranks = {}
        self._token_bytes: list[bytes] = []
        self._byte_ids: list[int | None] = [None] * 256
        self._splitter: special.SpecialSplitter | None = None
        self._cache: dict[str, tuple[int, ...]] = {}
        self.notes: list[str] = []

    @classmethod
    def from_gguf_kv(cls, kv: Mapping[str, Any]) -> Gemma4:
        model = kv_get(kv, "tokenizer.ggml.model", str)
        if model != "gemma4":
            raise FormatError(
                TOKENIZER_UNSUPPORTED,
                f"tokenizer.ggml.model {model!r} is not gemma4",
                field="tokenizer.ggml.model",
            )
        tokens = list(kv_list(kv, "tokenizer.ggml.tokens", str))
        if not tokens:
            raise FormatError(TOKENIZER_VOCAB, "tokenizer.ggml.tokens is empty", field="tokens")
        n = len(tokens)
        tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        types: list[int] | None = None
        if "tokenizer.ggml.token_type" in kv:
            types = list(kv_list(kv, "tokenizer.ggml.token_type", int))
            if len(types) < n:
                raise FormatError(
                    TOKENIZER_VOCAB,
                    f"tokenizer.ggml.token_type has {len(types)} items for {n} tokens",
                    field="tokenizer.ggml.token_type",
                )
        merges = kv_list(kv, "tokenizer.ggml.merges", str)
        attrs, notes = special.token_attrs(kv, tokens, types, default_eos=None)
        self = cls()
        self.notes = notes
        self.vocab_size = n
        for i, t in enumerate(tokens):
            self._text_to_id[t] = i
        for r, entry in enumerate(merges):
            pair = _split_merge(entry)
            if pair is not None:
                self._ranks.setdefault(pair, r)
        for b in range(256):
            self._byte_ids[b] = self._text_to_id.get(f"<0x{b:02X}>")
        self._token_bytes = [_token_bytes(t, a) for t, a in zip(tokens, attrs, strict=False)]
        splitter = special.SpecialSplitter(tokens, attrs)
        self._splitter = splitter if splitter else None
        self.bos_id = special_id(kv, "tokenizer.ggml.bos_token_id", n)
        self.eos_id = special_id(kv, "tokenizer.ggml.eos_token_id", n)
        self.unk_id = special_id(kv, "tokenizer.ggml.unknown_token_id", n)
        self.pad_id = special_id(kv, "tokenizer.ggml.padding_token_id", n)
        # llama.cpp always adds BOS for Gemma 4, whatever the metadata says
        kv_get(kv, "tokenizer.ggml.add_bos_token", bool, True)
        self.add_bos = True
        self.add_eos = bool(kv_get(kv, "tokenizer.ggml.add_eos_token", bool, False))
        return self

    def _run_ids(self, run: str) -> tuple[int, ...]:
        if run[0] == "\n" and not run.strip("\n"):
            tid = self._text_to_id.get(run)
            if tid is not None:
                return (tid,)
        out: list[int] = []
        for s in merge_symbols(list(run), self._ranks):
            tid = self._text_to_id.get(s)
            if tid is not None:
                out.append(tid)
                continue
            for byte in utf8(s):
                bid = self._byte_ids[byte]
                if bid is not None:
                    out.append(bid)
        return tuple(out)

    def _encode_text(self, text: str, out: list[int]) -> None:
        text = text.replace(" ", SPACE_MARK)
        cache = self._cache
        if len(cache) > 200_000:
            cache.clear()
        # runs of newlines and runs of anything else
        for line in _runs(text):
            ids = cache.get(line)
            if ids is None:
                ids = cache[line] = self._run_ids(line)
            out.extend(ids)

    def encode_ordinary(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"text must be str, not {type(text).__name__}")
        out: list[int] = []
        if not text:
            return out
        parts: list[str | int] = self._splitter.split(text) if self._splitter else [text]
        for part in parts:
            if isinstance(part, int):
                out.append(part)
            else:
                self._encode_text(part, out)
        return out

    def token_bytes(self, token_id: int) -> bytes:
        if not 0 <= token_id < len(self._token_bytes):
            raise FormatError(
                TOKENIZER_ID,
                f"token id {token_id} is outside the vocabulary (0..{len(self._token_bytes) - 1})",
            )
        return self._token_bytes[token_id]


def _runs(text: str) -> list[str]:
    out: list[str] = []
    n = len(text)
    pos = 0
    while pos < n:
        nl = text[pos] == "\n"
        end = pos + 1
        while end < n and (text[end] == "\n") == nl:
            end += 1
        out.append(text[pos:end])
        pos = end
    return out


def _token_bytes(text: str, attr: int) -> bytes:
    if attr & (special.ATTR_CONTROL | special.ATTR_UNKNOWN | special.ATTR_USER_DEFINED):
        return token_utf8(text)
    if attr & special.ATTR_BYTE:
        byte = byte_token_value(text)
        return bytes([byte]) if byte is not None else b""
    if attr & special.ATTR_NORMAL:
        return token_utf8(text.replace(SPACE_MARK, " "))
    return b""
