"""SentencePiece BPE as llama.cpp runs it for `tokenizer.ggml.model == "llama"` vocabularies
(LLaMA 1/2, Phi-3, Baichuan, Mistral v0.1, ...; docs/tokenizers.md, "SentencePiece").

The text is first split at the user-defined tokens (`_ggml.partition`). Each remaining text
fragment gets a leading space when the vocabulary adds a space prefix and the fragment starts
the text or follows a split-out token; its spaces become U+2581. The fragment starts as one
symbol per character; the adjacent pair whose concatenation is a token with the highest score
merges first (equal scores: the leftmost pair), until no adjacent pair forms a token. A final
symbol that is a token is that token; any other is its UTF-8 bytes as `<0xNN>` tokens.

Merged symbols are tokens, so a symbol never spans a boundary no token spans: when no token
has a U+2581 after another character (true of every SentencePiece vocabulary seen), the
fragment is cut before each run of U+2581 that follows another character and each piece is
merged alone, its ids kept in a cache (words repeat). The result is the same token for token.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Iterable, Mapping
from typing import Any

from matrixctl.errors import FormatError
from matrixctl.tokenizers.model import _ggml
from matrixctl.tokenizers.model._ggml import (
    ATTR_BYTE,
    ATTR_CONTROL,
    ATTR_NORMAL,
    ATTR_UNKNOWN,
    ATTR_USER_DEFINED,
    SPACE_MARK,
    GgufVocab,
)
from matrixctl.tokenizers.model.base import TOKENIZER_ID, TOKENIZER_VOCAB, ModelTokenizer

K_ADD_PREFIX = "tokenizer.ggml.add_space_prefix"
_CHUNK = re.compile(f"{SPACE_MARK}*[^{SPACE_MARK}]+|{SPACE_MARK}+")
_CACHE_LIMIT = 1 << 18  # entries
_CACHE_KEY_LIMIT = 256  # characters: longer pieces (no spaces for long) are not kept

_DEFAULTS = {"bos": 1, "eos": 2, "unk": 0, "sep": None, "pad": None, "mask": None}


class SentencePiece(ModelTokenizer):
    """SentencePiece BPE with byte fallback, exactly as llama.cpp tokenizes (family "spm")."""

    family = "spm"
    source = "gguf"

    def __init__(
        self, vocab: GgufVocab, *, add_space_prefix: bool, add_bos: bool, add_eos: bool
    ) -> None:
        self._vocab = vocab
        self.pre = vocab.pre
        self.vocab_size = vocab.n
        self.bos_id = vocab.special["bos"]
        self.eos_id = vocab.special["eos"]
        self.unk_id = vocab.special["unk"]
        self.pad_id = vocab.special["pad"]
        self.add_bos = add_bos
        self.add_eos = add_eos
        self.add_space_prefix = add_space_prefix
        self._ids = vocab.ids
        self._scores = vocab.scores
        self._splitters = vocab.splitters
        bytes_ids: list[int | None] = []
        for b in range(256):
            tid = vocab.ids.get(f"<0x{b:02X}>")
            if tid is None and b < 0x80:
                tid = vocab.ids.get(chr(b))
            bytes_ids.append(tid)
        self._byte_ids = bytes_ids
        # Cutting at U+2581 runs is exact when no token has U+2581 after another character.
        self._cut = all(SPACE_MARK not in t.lstrip(SPACE_MARK) for t in vocab.tokens)
        self._cache: dict[str, list[int]] = {}
        self._pieces = [self._piece_bytes(i) for i in range(vocab.n)]

    @classmethod
    def from_gguf_kv(cls, kv: Mapping[str, Any]) -> SentencePiece:
        vocab = GgufVocab(kv, "llama", _DEFAULTS)
        return cls(
            vocab,
            add_space_prefix=vocab.flag(K_ADD_PREFIX, kv, True),
            add_bos=vocab.flag("tokenizer.ggml.add_bos_token", kv, True),
            add_eos=vocab.flag("tokenizer.ggml.add_eos_token", kv, False),
        )

    # Encoding --------------------------------------------------------------------------------

    def encode_ordinary(self, text: str) -> list[int]:
        out: list[int] = []
        prev_special = True
        if self._splitters:
            frags = _ggml.partition(text, self._splitters)
        else:
            frags = [text] if text else []
        for frag in frags:
            if isinstance(frag, int):
                out.append(frag)
                prev_special = True
                continue
            piece = " " + frag if self.add_space_prefix and prev_special else frag
            self._encode_fragment(piece.replace(" ", SPACE_MARK), out)
            prev_special = False
        return out

    def _encode_fragment(self, text: str, out: list[int]) -> None:
        if not self._cut:
            out.extend(self._merge(text))
            return
        cache = self._cache
        for chunk in _CHUNK.findall(text):
            ids = cache.get(chunk)
            if ids is None:
                ids = self._merge(chunk)
                if len(chunk) <= _CACHE_KEY_LIMIT:
                    if len(cache) >= _CACHE_LIMIT:
                        cache.clear()
                    cache[chunk] = ids
            out.extend(ids)

    def _merge(self, text: str) -> list[int]:
        """One piece merged by score (the SentencePiece BPE session)."""
        ids = self._ids
        n = len(text)
        if n == 1:
            tid = ids.get(text)
            return [tid] if tid is not None else self._bytes_of(text)
        scores = self._scores
        sym = list(text)
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        heap: list[tuple[float, int, int, int]] = []
        for i in range(n - 1):
            tid = ids.get(sym[i] + sym[i + 1])
            if tid is not None:
                heap.append((-scores[tid], i, i + 1, 2))
        heapq.heapify(heap)
        pop, push = heapq.heappop, heapq.heappush
        while heap:
            _, left, right, size = pop(heap)
            ls, rs = sym[left], sym[right]
            if not ls or not rs or len(ls) + len(rs) != size:
                continue
            merged = ls + rs
            sym[left] = merged
            sym[right] = ""
            after = nxt[right]
            nxt[left] = after
            if after >= 0:
                prv[after] = left
            before = prv[left]
            if before >= 0:
                s = sym[before] + merged
                tid = ids.get(s)
                if tid is not None:
                    push(heap, (-scores[tid], before, left, len(s)))
            if after >= 0:
                s = merged + sym[after]
                tid = ids.get(s)
                if tid is not None:
                    push(heap, (-scores[tid], left, after, len(s)))
        out: list[int] = []
        i = 0
        while i != -1:
            s = sym[i]
            tid = ids.get(s)
            if tid is not None:
                out.append(tid)
            else:
                out.extend(self._bytes_of(s))
            i = nxt[i]
        return out

    def _bytes_of(self, s: str) -> list[int]:
        out = []
        for b in s.encode("utf-8", "surrogatepass"):
            tid = self._byte_ids[b]
            if tid is None:
                raise FormatError(
                    TOKENIZER_VOCAB,
                    f"the vocabulary has no byte token <0x{b:02X}> for {s!r}",
                    field=_ggml.K_TOKENS,
                )
            out.append(tid)
        return out

    # Decoding --------------------------------------------------------------------------------

    def _piece_bytes(self, token_id: int) -> bytes:
        attr = self._vocab.attrs[token_id]
        text = self._vocab.tokens[token_id]
        if attr & (ATTR_CONTROL | ATTR_UNKNOWN):
            return b""
        if attr & ATTR_USER_DEFINED:
            return text.encode("utf-8", "surrogatepass")
        if attr & ATTR_NORMAL:
            return _ggml.spm_piece_text(text)
        if attr & ATTR_BYTE:
            value = _ggml.byte_value(text)
            return bytes([value]) if value is not None else b""
        return b""  # unused and undefined tokens render as nothing

    def token_bytes(self, token_id: int) -> bytes:
        if not isinstance(token_id, int) or not 0 <= token_id < self.vocab_size:
            raise FormatError(
                TOKENIZER_ID, f"token id {token_id} is outside 0..{self.vocab_size - 1}"
            )
        return self._pieces[token_id]

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """The tokens' bytes: U+2581 as a space, `<0xNN>` as its byte, control and unknown
        tokens as nothing; the space the prefix added before the first token is dropped."""
        parts = [self.token_bytes(int(i)) for i in ids]
        if self.add_space_prefix and parts and parts[0].startswith(b" "):
            parts[0] = parts[0][1:]
        return b"".join(parts)
