"""SentencePiece unigram exactly as llama.cpp runs it for `tokenizer.ggml.model == "t5"`
vocabularies (T5, XLM-RoBERTa style models such as nomic-embed-text-v2-moe;
docs/tokenizers.md, "Unigram").

The text is first split at the user-defined tokens (`_ggml.partition`). Each fragment is
normalized: at each position a user-defined token is kept as it is; otherwise the longest
prefix the precompiled charsmap (`tokenizer.ggml.precompiled_charsmap`, SentencePiece's
XOR-compressed double array of replacement strings) knows is replaced; otherwise the code
point is kept. Spaces become U+2581, with one before the first non-space run when the
vocabulary adds a space prefix, or before every non-space run and none elsewhere when it
removes extra white space. Then Viterbi: the tokenization whose sum of scores (user-defined
tokens 0, normal, user-defined and unused tokens matchable) is highest, a code point no
single-code-point token covers being the unknown token at the lowest normal score minus 10;
ties keep the first candidate found (shorter tokens, earlier starts); consecutive unknown
tokens become one.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from typing import Any

from matrixctl.errors import FormatError
from matrixctl.tokenizers.model import _ggml
from matrixctl.tokenizers.model._ggml import (
    ATTR_BYTE,
    ATTR_CONTROL,
    ATTR_NORMAL,
    ATTR_UNKNOWN,
    ATTR_UNUSED,
    ATTR_USER_DEFINED,
    GgufVocab,
)
from matrixctl.tokenizers.model.base import (
    TOKENIZER_ID,
    TOKENIZER_UNSUPPORTED,
    TOKENIZER_VOCAB,
    ModelTokenizer,
)

K_CHARSMAP = "tokenizer.ggml.precompiled_charsmap"
_DEFAULTS = {"bos": None, "eos": 1, "unk": 2, "sep": None, "pad": 0, "mask": None}
_SPACE = "\u2581".encode()
_FLT_MAX = 3.4028234663852886e38
_LOWEST = -1.7976931348623157e308  # -DBL_MAX: every sum of scores beats it


def _f32(x: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


def _utf8_len(lead: int) -> int:
    return (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4)[lead >> 4]


class _CharsMap:
    """The precompiled charsmap: the double array and the replacement strings."""

    def __init__(self, blob: bytes) -> None:
        if len(blob) < 4:
            raise FormatError(
                TOKENIZER_VOCAB, f"{K_CHARSMAP} is shorter than its header", field=K_CHARSMAP
            )
        size = int.from_bytes(blob[:4], "little")
        if size + 4 >= len(blob):
            raise FormatError(
                TOKENIZER_VOCAB,
                f"{K_CHARSMAP} array size {size} exceeds the blob ({len(blob)} bytes)",
                field=K_CHARSMAP,
            )
        n = size // 4
        self.array = struct.unpack(f"<{n}I", blob[4 : 4 + 4 * n])
        self.strings = blob[4 + size :]

    def _node(self, i: int) -> int:
        if i >= len(self.array):
            raise FormatError(
                TOKENIZER_VOCAB, f"{K_CHARSMAP}: node {i} is outside the array", field=K_CHARSMAP
            )
        return self.array[i]

    def _base(self, i: int) -> int:
        v = self._node(i)
        return (v >> 10) << ((v & (1 << 9)) >> 6)

    def longest(self, data: bytes, start: int) -> tuple[int, bytes]:
        """(length matched, replacement) of the longest prefix of data[start:] with a
        replacement; (0, b"") when none."""
        best_len, best_off = 0, 0
        node = self._base(0)
        for p in range(start, len(data)):
            c = data[p]
            if c == 0:
                break
            node ^= c
            v = self._node(node)
            if v & ((1 << 31) | 0xFF) != c:
                break
            leaf = (v >> 8) & 1
            node ^= self._base(node)
            if leaf:
                best_len = p - start + 1
                best_off = self._node(node) & ((1 << 31) - 1)
        if not best_len:
            return 0, b""
        if best_off >= len(self.strings):
            raise FormatError(
                TOKENIZER_VOCAB,
                f"{K_CHARSMAP}: replacement {best_off} is outside the strings",
                field=K_CHARSMAP,
            )
        end = self.strings.find(b"\0", best_off)
        if end < 0:
            raise FormatError(
                TOKENIZER_VOCAB, f"{K_CHARSMAP}: unterminated replacement", field=K_CHARSMAP
            )
        return best_len, self.strings[best_off:end]


class Unigram(ModelTokenizer):
    """SentencePiece unigram (family "ugm") as llama.cpp tokenizes."""

    family = "ugm"
    source = "gguf"

    def __init__(self, vocab: GgufVocab, kv: Mapping[str, Any]) -> None:
        self._vocab = vocab
        self.pre = vocab.pre
        self.vocab_size = vocab.n
        self.bos_id = vocab.special["bos"]
        self.eos_id = vocab.special["eos"]
        self.unk_id = vocab.special["unk"]
        self.pad_id = vocab.special["pad"]
        self.add_bos = vocab.flag("tokenizer.ggml.add_bos_token", kv, False)
        self.add_eos = vocab.flag("tokenizer.ggml.add_eos_token", kv, True)
        self.add_space_prefix = vocab.flag("tokenizer.ggml.add_space_prefix", kv, False)
        self.remove_extra_ws = vocab.flag("tokenizer.ggml.remove_extra_whitespaces", kv, False)
        raw = kv.get(K_CHARSMAP)
        self._charsmap: _CharsMap | None = None
        if raw is not None:
            if isinstance(raw, (bytes, bytearray)):
                blob = bytes(raw)
            elif isinstance(raw, (list, tuple)) and all(
                isinstance(b, int) and not isinstance(b, bool) and -128 <= b < 256 for b in raw
            ):
                blob = bytes(b & 0xFF for b in raw)
            else:
                raise FormatError(TOKENIZER_VOCAB, f"{K_CHARSMAP} is not bytes", field=K_CHARSMAP)
            if blob:
                self._charsmap = _CharsMap(blob)
        attrs = vocab.attrs
        match = ATTR_NORMAL | ATTR_USER_DEFINED | ATTR_UNUSED
        self._tokens: dict[str, int] = {}
        self._token_scores: dict[str, float] = {}
        prefixes: set[str] = set()
        min_score = _FLT_MAX
        for i, text in enumerate(vocab.tokens):
            a = attrs[i]
            if a & ATTR_NORMAL:
                min_score = min(min_score, vocab.scores[i])
            if a & match:
                self._tokens[text] = i
                self._token_scores[text] = 0.0 if a & ATTR_USER_DEFINED else vocab.scores[i]
                for k in range(1, len(text) + 1):
                    prefixes.add(text[:k])
        self._prefixes = prefixes
        self._max_len = max((len(t) for t in self._tokens), default=0)
        self._unk_score = _f32(min_score - 10.0)
        self._user = {
            vocab.tokens[i].encode("utf-8", "surrogatepass")
            for i in range(vocab.n)
            if attrs[i] & ATTR_USER_DEFINED
        }
        self._user_lens = sorted({len(u) for u in self._user}, reverse=True)
        self._splitters = vocab.splitters
        self._pieces = [self._piece(i) for i in range(vocab.n)]

    @classmethod
    def from_gguf_kv(cls, kv: Mapping[str, Any]) -> Unigram:
        return cls(GgufVocab(kv, "t5", _DEFAULTS), kv)

    @classmethod
    def from_tokenizer_json(cls, obj: dict[str, Any]) -> Unigram:
        raise FormatError(
            TOKENIZER_UNSUPPORTED,
            "a unigram tokenizer.json is not implemented (use the model's GGUF vocabulary)",
            field="model",
        )

    # Normalization ---------------------------------------------------------------------------

    def _prefix(self, data: bytes, at: int) -> tuple[bytes, int]:
        for n in self._user_lens:
            if data[at : at + n] in self._user:
                return data[at : at + n], n
        if self._charsmap is not None:
            n, repl = self._charsmap.longest(data, at)
            if n:
                return repl, n
        n = min(_utf8_len(data[at]), len(data) - at)
        return data[at : at + n], n

    def normalize(self, text: str) -> str:
        """The text as the Viterbi search sees it."""
        data = text.encode("utf-8", "surrogatepass")
        out = bytearray()
        prepend = self.add_space_prefix
        merge = self.remove_extra_ws
        prepended = False
        in_word = False
        at = 0
        while at < len(data):
            repl, used = self._prefix(data, at)
            for c in repl:
                if c != 0x20:
                    if not in_word:
                        in_word = True
                        if (prepend and not prepended) or merge:
                            out += _SPACE
                            prepended = True
                    out.append(c)
                else:
                    in_word = False
                    if not merge:
                        out += _SPACE
            at += used
        return out.decode("utf-8", "surrogateescape")

    # Viterbi ---------------------------------------------------------------------------------

    def _viterbi(self, text: str, out: list[int]) -> None:
        norm = self.normalize(text)
        n = len(norm)
        if n == 0:
            return
        unk = self.unk_id
        best = [_LOWEST] * (n + 1)
        best[0] = 0.0
        back_id = [unk] * (n + 1)
        back_at = [0] * (n + 1)
        tokens, scores, prefixes = self._tokens, self._token_scores, self._prefixes
        unk_score = self._unk_score
        max_len = self._max_len
        for i in range(n):
            cur = best[i]
            single = False
            for k in range(i + 1, min(n, i + max_len) + 1):
                s = norm[i:k]
                if s not in prefixes:
                    break
                tid = tokens.get(s)
                if tid is not None:
                    if k == i + 1:
                        single = True
                    score = cur + scores[s]
                    if score > best[k]:
                        best[k] = score
                        back_id[k] = tid
                        back_at[k] = i
            if not single:
                score = cur + unk_score
                if score > best[i + 1]:
                    best[i + 1] = score
                    back_id[i + 1] = unk
                    back_at[i + 1] = i
        found: list[int] = []
        prev_unknown = False
        at = n
        while True:
            tid = back_id[at]
            is_unknown = tid == unk
            if not (prev_unknown and is_unknown):
                if tid is None:
                    raise FormatError(
                        TOKENIZER_VOCAB,
                        "the vocabulary has no unknown token",
                        field="tokenizer.ggml.unknown_token_id",
                    )
                found.append(tid)
            if back_at[at] == 0:
                break
            prev_unknown = is_unknown
            at = back_at[at]
        found.reverse()
        out.extend(found)

    def encode_ordinary(self, text: str) -> list[int]:
        out: list[int] = []
        frags = _ggml.partition(text, self._splitters) if self._splitters else [text]
        for frag in frags:
            if isinstance(frag, int):
                out.append(frag)
            elif frag:
                self._viterbi(frag, out)
        return out

    # Decoding --------------------------------------------------------------------------------

    def _piece(self, token_id: int) -> bytes:
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
        return b""

    def token_bytes(self, token_id: int) -> bytes:
        if not isinstance(token_id, int) or not 0 <= token_id < self.vocab_size:
            raise FormatError(
                TOKENIZER_ID, f"token id {token_id} is outside 0..{self.vocab_size - 1}"
            )
        return self._pieces[token_id]

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """U+2581 as spaces, the unknown and control tokens as nothing, the leading space
        the prefix added dropped. Lossy: the charsmap's normalization (NFKC-like), runs of
        white space when the vocabulary removes extra white space, unknown characters."""
        parts = [self.token_bytes(int(i)) for i in ids]
        if self.add_space_prefix and parts and parts[0].startswith(b" "):
            parts[0] = parts[0][1:]
        return b"".join(parts)
