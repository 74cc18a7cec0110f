"""WordPiece (BERT) exactly as llama.cpp runs it for `tokenizer.ggml.model == "bert"`
vocabularies, or as Hugging Face `tokenizers` runs a BERT `tokenizer.json`
(docs/tokenizers.md, "WordPiece"). The two differ; `source` says which one a tokenizer follows.

llama.cpp (GGUF): every code point is replaced by the first code point of its canonical
decomposition (when accents are stripped), then white space ends a word; NUL, U+FFFD,
control (C*) and, when accents are stripped, mark (M*) characters are dropped; the rest is
lower-cased code point by code point (first code point of the lower-case mapping);
punctuation (P*), ASCII symbols and CJK ideographs are one-character words. Each word,
with U+2581 before it, is matched greedily longest-first against the vocabulary (whose
word-initial pieces carry U+2581 and continuation pieces no prefix); a word that cannot be
pieced whole is the unknown token. Character classes are llama.cpp's (Unicode 15.1).

Hugging Face (tokenizer.json): added tokens are split out first (the unnormalized ones from
the raw text, the normalized ones after normalization); BertNormalizer (drop NUL, U+FFFD and
control characters, white space to spaces, CJK ideographs padded with spaces, NFD and
nonspacing marks dropped, full lower-casing), BertPreTokenizer (split at white space,
punctuation isolated), then WordPiece with the `##` continuation prefix; a word longer than
`max_input_chars_per_word` characters is the unknown token. Character classes are those
`tokenizers` uses (older general categories, newer lower-casing; `_unicode.py`).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from matrixctl.errors import FormatError
from matrixctl.tokenizers.model import _ggml, _unicode
from matrixctl.tokenizers.model._ggml import (
    ATTR_CONTROL,
    ATTR_NORMAL,
    ATTR_UNKNOWN,
    ATTR_USER_DEFINED,
    SPACE_MARK,
    GgufVocab,
)
from matrixctl.tokenizers.model.base import (
    TOKENIZER_ID,
    TOKENIZER_UNSUPPORTED,
    TOKENIZER_VOCAB,
    ModelTokenizer,
)

WHITE_SPACE = frozenset(
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
    "\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
_WS_CLASS = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_CHUNKS = re.compile(f"[^{_WS_CLASS}]+")
_CHUNKS_CLEAN = re.compile("[^\t\n\r \xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+")
ASCII_PUNCT = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
_CACHE_LIMIT = 1 << 18  # entries
_CACHE_KEY_LIMIT = 256  # characters: longer runs (no white space for long) are not kept

_DEFAULTS = {"bos": 101, "eos": None, "unk": 100, "sep": 102, "pad": 0, "mask": 103}


def _points(ranges: Iterable[tuple[int, int]]) -> frozenset[int]:
    return frozenset(cp for a, b in ranges for cp in range(a, b + 1))


_LLAMA_NEW = {
    **dict.fromkeys(_points(_unicode.LLAMA_NEW_M), "M"),
    **dict.fromkeys(_points(_unicode.LLAMA_NEW_P), "P"),
    **dict.fromkeys(_points(_unicode.LLAMA_NEW_C), "C"),
}
_HF_NOT_CONTROL = _points(_unicode.HF_NOT_CONTROL)
_HF_EXTRA_CONTROL = _points(_unicode.HF_EXTRA_CONTROL)
_HF_NOT_MN = _points(_unicode.HF_NOT_MN)
_HF_EXTRA_MN = _points(_unicode.HF_EXTRA_MN)
_HF_NOT_PUNCT = _points(_unicode.HF_NOT_PUNCT)
_HF_EXTRA_PUNCT = _points(_unicode.HF_EXTRA_PUNCT)
_HF_LOWER = dict(_unicode.HF_LOWER)


class _LowerTable(dict[int, str]):
    """str.translate's table of Hugging Face's lower-casing, filled as code points come."""

    def __missing__(self, cp: int) -> str:
        low = _HF_LOWER.get(cp)
        if low is None:
            low = chr(cp).lower()
        self[cp] = low
        return low


_HF_LOWER_TABLE = _LowerTable()


def is_chinese(cp: int) -> bool:
    """The CJK ideograph blocks BERT isolates (both references use these bounds)."""
    return (
        0x4E00 <= cp <= 0x9FFF
        or 0x3400 <= cp <= 0x4DBF
        or 0x20000 <= cp <= 0x2A6DF
        or 0x2A700 <= cp <= 0x2B73F
        or 0x2B740 <= cp <= 0x2B81F
        or 0x2B920 <= cp <= 0x2CEAF
        or 0xF900 <= cp <= 0xFAFF
        or 0x2F800 <= cp <= 0x2FA1F
    )


def _llama_major(cp: int) -> str:
    """llama.cpp's major class of a code point ("" when unassigned)."""
    cat = unicodedata.category(chr(cp))
    if cat == "Cn":
        return _LLAMA_NEW.get(cp, "")
    return cat[0]


# Character kinds of the llama.cpp word splitter.
_SPACE, _DROP, _ALONE, _PART = 0, 1, 2, 3


class WordPiece(ModelTokenizer):
    """BERT WordPiece (family "wpm"), llama.cpp's (`from_gguf_kv`) or Hugging Face's
    (`from_tokenizer_json`)."""

    family = "wpm"
    lowercase: bool
    strip_accents: bool
    clean_text: bool
    handle_chinese: bool
    _vocab: GgufVocab
    _ids: dict[str, int]
    _splitters: list[tuple[str, int, int]]
    _max_len: int
    _pieces: list[bytes]
    _encode: Callable[[str], list[int]]
    _prefix: str
    _max_chars: int
    _unk: int
    _raw_added: _AddedMatcher
    _norm_added: _AddedMatcher

    def __init__(self) -> None:
        self._cache: dict[str, list[int]] = {}
        self._chars: dict[str, tuple[int, str]] = {}

    # Construction ----------------------------------------------------------------------------

    @classmethod
    def from_gguf_kv(cls, kv: Mapping[str, Any]) -> WordPiece:
        vocab = GgufVocab(kv, "bert", _DEFAULTS)
        self = cls()
        self.source = "gguf"
        self.pre = vocab.pre
        self.vocab_size = vocab.n
        self.bos_id = vocab.special["bos"]
        self.eos_id = vocab.special["sep"]  # BERT ends with [SEP]
        self.unk_id = vocab.special["unk"]
        self.pad_id = vocab.special["pad"]
        self.add_bos = vocab.flag("tokenizer.ggml.add_bos_token", kv, True)
        self.add_eos = vocab.flag("tokenizer.ggml.add_sep_token", kv, True)
        self.lowercase = vocab.flag("tokenizer.ggml.normalizer.lowercase", kv, True)
        self.strip_accents = vocab.flag(
            "tokenizer.ggml.normalizer.strip_accents", kv, self.lowercase
        )
        self._vocab = vocab
        self._ids = vocab.ids
        self._splitters = vocab.splitters
        self._max_len = max(len(t) for t in vocab.tokens)
        self._pieces = [self._gguf_piece(i) for i in range(vocab.n)]
        self._encode = self._encode_gguf
        return self

    @classmethod
    def from_tokenizer_json(cls, obj: dict[str, Any]) -> WordPiece:
        if not isinstance(obj, dict):
            raise FormatError(TOKENIZER_VOCAB, "tokenizer.json is not an object")
        model = obj.get("model")
        if not isinstance(model, dict) or model.get("type") != "WordPiece":
            kind = model.get("type") if isinstance(model, dict) else model
            raise FormatError(
                TOKENIZER_UNSUPPORTED, f"model type {kind!r} is not WordPiece", field="model"
            )
        vocab = model.get("vocab")
        if not isinstance(vocab, dict) or not vocab:
            raise FormatError(
                TOKENIZER_VOCAB, "model.vocab is not a non-empty object", field="model.vocab"
            )
        ids: dict[str, int] = {}
        for text, tid in vocab.items():
            if not isinstance(tid, int) or isinstance(tid, bool) or tid < 0:
                raise FormatError(
                    TOKENIZER_VOCAB, f"model.vocab[{text!r}] is not an id", field="model.vocab"
                )
            ids[text] = tid
        unk = model.get("unk_token")
        prefix = model.get("continuing_subword_prefix", "##")
        max_chars = model.get("max_input_chars_per_word", 100)
        if not isinstance(unk, str) or unk not in ids:
            raise FormatError(
                TOKENIZER_VOCAB,
                f"model.unk_token {unk!r} is not in the vocabulary",
                field="model.unk_token",
            )
        if not isinstance(prefix, str):
            raise FormatError(
                TOKENIZER_VOCAB,
                "model.continuing_subword_prefix is not a string",
                field="model.continuing_subword_prefix",
            )
        if not isinstance(max_chars, int) or isinstance(max_chars, bool):
            raise FormatError(
                TOKENIZER_VOCAB,
                "model.max_input_chars_per_word is not an int",
                field="model.max_input_chars_per_word",
            )

        norm = obj.get("normalizer")
        self = cls()
        self.clean_text = self.handle_chinese = self.lowercase = self.strip_accents = False
        if norm is not None:
            if not isinstance(norm, dict) or norm.get("type") != "BertNormalizer":
                kind = norm.get("type") if isinstance(norm, dict) else norm
                raise FormatError(
                    TOKENIZER_UNSUPPORTED,
                    f"normalizer {kind!r} (only BertNormalizer is implemented)",
                    field="normalizer",
                )
            flags = {}
            for key, default in (
                ("clean_text", True),
                ("handle_chinese_chars", True),
                ("lowercase", True),
            ):
                value = norm.get(key, default)
                if not isinstance(value, bool):
                    raise FormatError(
                        TOKENIZER_VOCAB,
                        f"normalizer.{key} is not a bool",
                        field=f"normalizer.{key}",
                    )
                flags[key] = value
            strip = norm.get("strip_accents")
            if strip is not None and not isinstance(strip, bool):
                raise FormatError(
                    TOKENIZER_VOCAB,
                    "normalizer.strip_accents is not a bool",
                    field="normalizer.strip_accents",
                )
            self.clean_text = flags["clean_text"]
            self.handle_chinese = flags["handle_chinese_chars"]
            self.lowercase = flags["lowercase"]
            self.strip_accents = flags["lowercase"] if strip is None else strip
        pre = obj.get("pre_tokenizer")
        if not isinstance(pre, dict) or pre.get("type") != "BertPreTokenizer":
            kind = pre.get("type") if isinstance(pre, dict) else pre
            raise FormatError(
                TOKENIZER_UNSUPPORTED,
                f"pre_tokenizer {kind!r} (only BertPreTokenizer is implemented)",
                field="pre_tokenizer",
            )

        added: list[tuple[str, int, dict[str, Any]]] = []
        raw_added = obj.get("added_tokens") or []
        if not isinstance(raw_added, list):
            raise FormatError(TOKENIZER_VOCAB, "added_tokens is not a list", field="added_tokens")
        specials: set[int] = set()
        for i, tok in enumerate(raw_added):
            if not isinstance(tok, dict):
                raise FormatError(
                    TOKENIZER_VOCAB, f"added_tokens[{i}] is not an object", field="added_tokens"
                )
            content, tid = tok.get("content"), tok.get("id")
            if (
                not isinstance(content, str)
                or not content
                or not isinstance(tid, int)
                or (isinstance(tid, bool) or tid < 0)
            ):
                raise FormatError(
                    TOKENIZER_VOCAB, f"added_tokens[{i}] has no content or id", field="added_tokens"
                )
            flags = {}
            for key, default in (
                ("single_word", False),
                ("lstrip", False),
                ("rstrip", False),
                ("normalized", not tok.get("special", False)),
                ("special", False),
            ):
                value = tok.get(key, default)
                if not isinstance(value, bool):
                    raise FormatError(
                        TOKENIZER_VOCAB,
                        f"added_tokens[{i}].{key} is not a bool",
                        field="added_tokens",
                    )
                flags[key] = value
            added.append((content, tid, flags))
            if flags["special"]:
                specials.add(tid)

        self.source = "tokenizer.json"
        self.pre = "BertPreTokenizer"
        self._ids = ids
        self._prefix = prefix
        self._max_chars = max_chars
        self._unk = ids[unk]
        by_id: dict[int, str] = {tid: text for text, tid in ids.items()}
        for content, tid, _ in added:
            by_id.setdefault(tid, content)
        self.vocab_size = max(by_id) + 1
        if self.vocab_size > 2 * len(by_id) + 1024:
            raise FormatError(
                TOKENIZER_VOCAB,
                f"token ids reach {self.vocab_size - 1} for {len(by_id)} tokens",
                field="model.vocab",
            )
        self.unk_id = ids[unk]
        self.bos_id = ids.get("[CLS]")
        self.eos_id = ids.get("[SEP]")
        self.pad_id = ids.get("[PAD]")
        self.add_bos = self.add_eos = obj.get("post_processor") is not None
        self._raw_added = _AddedMatcher([a for a in added if not a[2]["normalized"]])
        self._norm_added = _AddedMatcher([a for a in added if a[2]["normalized"]])
        pieces: list[bytes] = []
        for tid in range(self.vocab_size):
            text = by_id.get(tid)
            if text is None or tid in specials:
                pieces.append(b"")
            elif text.startswith(prefix) and prefix:
                pieces.append(text[len(prefix) :].encode("utf-8", "surrogatepass"))
            else:
                pieces.append(b" " + text.encode("utf-8", "surrogatepass"))
        self._pieces = pieces
        self._encode = self._encode_hf
        return self

    # llama.cpp -------------------------------------------------------------------------------

    def _llama_char(self, c: str) -> tuple[int, str]:
        got = self._chars.get(c)
        if got is not None:
            return got
        cp = ord(c)
        if self.strip_accents:
            d = unicodedata.normalize("NFD", c)
            cp = ord(d[0])
        ch = chr(cp)
        major = _llama_major(cp)
        if ch in WHITE_SPACE:
            got = (_SPACE, "")
        elif cp in (0, 0xFFFD) or major == "C" or (self.strip_accents and major == "M"):
            got = (_DROP, "")
        else:
            if self.lowercase:
                low = ch.lower()
                ch = low[0] if low else ch
            alone = major == "P" or (cp < 0x7F and major == "S") or is_chinese(cp)
            got = (_ALONE if alone else _PART, ch)
        self._chars[c] = got
        return got

    def _llama_words(self, text: str) -> list[str]:
        words: list[str] = []
        cur: list[str] = []
        char = self._llama_char
        for c in text:
            kind, s = char(c)
            if kind == _PART:
                cur.append(s)
            elif kind == _ALONE:
                if cur:
                    words.append("".join(cur))
                    cur = []
                words.append(s)
            elif kind == _SPACE and cur:
                words.append("".join(cur))
                cur = []
        if cur:
            words.append("".join(cur))
        return words

    def _llama_word(self, word: str) -> list[int]:
        ids = self._ids
        w = SPACE_MARK + word
        n = len(w)
        out: list[int] = []
        i = 0
        while i < n:
            j = min(n, i + self._max_len)
            while j > i:
                tid = ids.get(w[i:j])
                if tid is not None:
                    out.append(tid)
                    break
                j -= 1
            else:
                if self.unk_id is None:
                    raise FormatError(
                        TOKENIZER_VOCAB,
                        "the vocabulary has no unknown token",
                        field="tokenizer.ggml.unknown_token_id",
                    )
                return [self.unk_id]
            i = j
        return out

    def _encode_gguf(self, text: str) -> list[int]:
        out: list[int] = []
        frags = _ggml.partition(text, self._splitters) if self._splitters else [text]
        cache = self._cache
        for frag in frags:
            if isinstance(frag, int):
                out.append(frag)
                continue
            # White space only ends words: each run between is tokenized alone, once.
            for chunk in _CHUNKS.findall(frag):
                ids = cache.get(chunk)
                if ids is None:
                    ids = []
                    for word in self._llama_words(chunk):
                        ids.extend(self._llama_word(word))
                    if len(chunk) <= _CACHE_KEY_LIMIT:
                        if len(cache) >= _CACHE_LIMIT:
                            cache.clear()
                        cache[chunk] = ids
                out.extend(ids)
        return out

    def _gguf_piece(self, token_id: int) -> bytes:
        attr = self._vocab.attrs[token_id]
        text = self._vocab.tokens[token_id]
        if attr & (ATTR_CONTROL | ATTR_UNKNOWN):
            return b""
        if attr & ATTR_USER_DEFINED:
            return text.encode("utf-8", "surrogatepass")
        if attr & ATTR_NORMAL:
            return _ggml.spm_piece_text(text)
        return b""

    # Hugging Face ----------------------------------------------------------------------------

    def _hf_normalize(self, text: str) -> str:
        if self.clean_text:
            text = "".join(" " if c in WHITE_SPACE else c for c in text if not _hf_control(c))
        if self.handle_chinese:
            text = "".join(f" {c} " if is_chinese(ord(c)) else c for c in text)
        if self.strip_accents:
            text = "".join(c for c in unicodedata.normalize("NFD", text) if not _hf_mn(c))
        if self.lowercase:  # code point by code point: no final-sigma rule
            text = text.translate(_HF_LOWER_TABLE)
        return text

    def _hf_words(self, text: str) -> list[str]:
        words: list[str] = []
        cur: list[str] = []
        for c in text:
            if c in WHITE_SPACE:
                if cur:
                    words.append("".join(cur))
                    cur = []
            elif _hf_punct(c):
                if cur:
                    words.append("".join(cur))
                    cur = []
                words.append(c)
            else:
                cur.append(c)
        if cur:
            words.append("".join(cur))
        return words

    def _hf_word(self, word: str) -> list[int]:
        if len(word) > self._max_chars:
            return [self._unk]
        ids, prefix = self._ids, self._prefix
        out: list[int] = []
        start, n = 0, len(word)
        while start < n:
            end = n
            while end > start:
                piece = word[start:end]
                tid = ids.get(prefix + piece if start else piece)
                if tid is not None:
                    out.append(tid)
                    break
                end -= 1
            else:
                return [self._unk]
            start = end
        return out

    def _hf_model(self, text: str, out: list[int]) -> None:
        for word in self._hf_words(text):
            out.extend(self._hf_word(word))

    def _encode_hf(self, text: str) -> list[int]:
        out: list[int] = []
        cache = self._cache
        chunks = _CHUNKS_CLEAN if self.clean_text else _CHUNKS
        for piece in self._raw_added.split(text):
            if isinstance(piece, int):
                out.append(piece)
                continue
            if not self._norm_added.empty:
                self._hf_piece(piece, out)
                continue
            # White space (a space once normalized) only ends words: each run between is
            # normalized and tokenized alone, once (control white space is dropped, not a
            # space, when the text is cleaned: it does not cut).
            for chunk in chunks.findall(piece):
                ids = cache.get(chunk)
                if ids is None:
                    ids = []
                    self._hf_piece(chunk, ids)
                    if len(chunk) <= _CACHE_KEY_LIMIT:
                        if len(cache) >= _CACHE_LIMIT:
                            cache.clear()
                        cache[chunk] = ids
                out.extend(ids)
        return out

    def _hf_piece(self, piece: str, out: list[int]) -> None:
        for part in self._norm_added.split(self._hf_normalize(piece)):
            if isinstance(part, int):
                out.append(part)
            else:
                self._hf_model(part, out)

    # The contract ----------------------------------------------------------------------------

    def encode_ordinary(self, text: str) -> list[int]:
        return self._encode(text)

    def token_bytes(self, token_id: int) -> bytes:
        if not isinstance(token_id, int) or not 0 <= token_id < self.vocab_size:
            raise FormatError(
                TOKENIZER_ID, f"token id {token_id} is outside 0..{self.vocab_size - 1}"
            )
        return self._pieces[token_id]

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """The pieces joined: a word-initial piece with a space before it (dropped at the
        start), a continuation piece glued; special, control and unknown tokens give
        nothing. Lossy: the text was lower-cased, stripped of accents and control characters,
        and its white space is now single spaces between words and around punctuation."""
        out = b"".join(self.token_bytes(int(i)) for i in ids)
        return out[1:] if out.startswith(b" ") else out


def _hf_control(c: str) -> bool:
    cp = ord(c)
    if cp in (0, 0xFFFD) or cp in _HF_EXTRA_CONTROL:
        return True
    if c in "\t\n\r" or cp in _HF_NOT_CONTROL:
        return False
    return unicodedata.category(c) in ("Cc", "Cf", "Co")


def _hf_mn(c: str) -> bool:
    cp = ord(c)
    if cp in _HF_EXTRA_MN:
        return True
    return unicodedata.category(c) == "Mn" and cp not in _HF_NOT_MN


def _hf_punct(c: str) -> bool:
    cp = ord(c)
    if cp in _HF_EXTRA_PUNCT:
        return True
    if cp in _HF_NOT_PUNCT:
        return False
    return c in ASCII_PUNCT or unicodedata.category(c)[0] == "P"


def _is_word_char(c: str) -> bool:
    """A regular expression's Unicode \\w (alphabetic, marks, digits, connector punctuation,
    joiners)."""
    return (
        c.isalnum()
        or unicodedata.category(c)[0] in "MN"
        or unicodedata.category(c) == "Pc"
        or (c in "\u200c\u200d")
    )


class _AddedMatcher:
    """Hugging Face's added-token split: leftmost-longest matches, left to right, with the
    single_word, lstrip and rstrip flags."""

    def __init__(self, tokens: list[tuple[str, int, dict[str, Any]]]) -> None:
        self._tokens = {content: (tid, flags) for content, tid, flags in tokens}
        if self._tokens:
            alts = sorted(self._tokens, key=lambda s: (-len(s), s))
            self._re: re.Pattern[str] | None = re.compile("|".join(map(re.escape, alts)))
        else:
            self._re = None
        self.empty = not self._tokens

    def split(self, text: str) -> list[str | int]:
        if self._re is None or not text:
            return [text] if text else []
        out: list[str | int] = []
        offset = 0
        for m in self._re.finditer(text):
            start, stop = m.start(), m.end()
            tid, flags = self._tokens[m.group()]
            if flags["single_word"]:
                if start > 0 and _is_word_char(text[start - 1]):
                    continue
                if stop < len(text) and _is_word_char(text[stop]):
                    continue
            if flags["lstrip"]:
                s = start
                while s > 0 and text[s - 1].isspace() and text[s - 1] in WHITE_SPACE:
                    s -= 1
                start = max(s, offset)
            if flags["rstrip"]:
                while stop < len(text) and text[stop] in WHITE_SPACE:
                    stop += 1
            if offset < start:
                out.append(text[offset:start])
            out.append(tid)
            offset = stop
        if offset < len(text):
            out.append(text[offset:])
        return out
