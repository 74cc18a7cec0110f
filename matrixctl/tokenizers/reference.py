"""Compact reference tokenizers for the three tokenizer families GGUF models use, written to
measure how far π's greedy leftmost-longest matching agrees with a model's own tokenizer
(`ingest gguf`; docs/formats/gguf.md, "Which tokenizer the model uses").

- `ByteLevelBPE`: GPT-2-style byte-level BPE (`tokenizer.ggml.model` gpt2). The text is split
  by the pre-tokenizer's regular expression (GPT-2's or Qwen2's, rewritten for Python's `re`:
  see `pretokenizer`), each piece's UTF-8 bytes are spelt in GPT-2's byte alphabet, and
  adjacent symbols are merged by merge rank (lowest rank first, every occurrence left to right)
  until no pair is a merge.
- `SentencePieceBPE`: SentencePiece BPE as llama.cpp runs it for `llama` vocabularies: spaces
  become U+2581 (with a leading one when the vocabulary adds a space prefix), the text starts as
  one symbol per character, and the adjacent pair whose concatenation is a token with the
  highest score is merged first (ties: the leftmost); a final symbol that is not a token
  becomes its UTF-8 bytes as `<0xNN>` tokens (byte fallback), or the unknown token.
- `WordPiece`: BERT's WordPiece as llama.cpp runs it for `bert` vocabularies: NFD, accents
  (Mn) and control characters dropped, lower-cased code point by code point, split at white
  space, punctuation and CJK characters; each word greedy longest-match-first, its first piece
  with U+2581 before it; a word that cannot be pieced whole is one unknown token.

What they cover (and what they do not) is in docs/formats/gguf.md. Every tokenizer returns its
tokens as `(id, start, end)` spans in one coordinate system shared with π (see each class), so
`agreement` can compare them. This module imports no codec and no validation module.
"""

from __future__ import annotations

import heapq
import math
import re
import unicodedata
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

Span = tuple[int, int, int]  # (token id, start, end); id -1: a piece the vocabulary lacks
SPM_MARKER = "\u2581"
# Unicode White_Space (Python's \s also matches U+001C..U+001F, which are not white space).
WHITE_SPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
LAST_LETTER_OR_NUMBER = 0x323AF  # above: tags, variation selectors, private use (no L or N)


# Tokenizer types -----------------------------------------------------------------------------

PRE_TOKENIZERS = {"gpt-2": "GPT-2", "qwen2": "Qwen2"}


@dataclass(frozen=True)
class TokenizerType:
    """What `tokenizer.ggml.model` (and, for BPE, `tokenizer.ggml.pre`) say the model uses."""

    family: str  # bpe, sentencepiece, wordpiece, unigram, or unknown
    name: str  # in plain words, for the report and the manifest
    measurable: bool  # a reference tokenizer of this module covers it


def tokenizer_type(model: str | None, pre: str | None) -> TokenizerType:
    """The tokenizer type of a GGUF vocabulary, from llama.cpp's tokenizer kinds."""
    if model == "gpt2":
        if pre in PRE_TOKENIZERS:
            return TokenizerType(
                "bpe", f"BPE (byte-level, {PRE_TOKENIZERS[pre]} pre-tokenizer)", True
            )
        what = f"pre-tokenizer {pre!r}" if pre else "no pre-tokenizer named"
        return TokenizerType("bpe", f"BPE (byte-level, {what})", False)
    if model == "llama":
        return TokenizerType("sentencepiece", "SentencePiece", True)
    if model == "bert":
        return TokenizerType("wordpiece", "WordPiece", True)
    if model == "t5":
        return TokenizerType("unigram", "SentencePiece Unigram", False)
    if model is None:
        return TokenizerType("unknown", "unknown (no tokenizer.ggml.model)", False)
    return TokenizerType("unknown", f"unknown (tokenizer.ggml.model {model!r})", False)


# Agreement -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Agreement:
    """How many of the reference's tokens π produces identically: the same id over the same
    span. `share` = matched / max(reference tokens, π tokens): 1 exactly when the two
    tokenizations are the same, token for token."""

    matched: int
    reference_tokens: int
    pi_tokens: int

    @property
    def share(self) -> float:
        most = max(self.reference_tokens, self.pi_tokens)
        return 1.0 if most == 0 else self.matched / most

    @property
    def exact(self) -> bool:
        return self.matched == self.reference_tokens == self.pi_tokens

    def percent(self) -> str:
        """The share as a percentage rounded down to 0.1 (100 only when exact)."""
        if self.exact:
            return "100"
        return f"{math.floor(self.share * 1000) / 10:.1f}"

    def rounded(self) -> float:
        """The share rounded down to 4 decimals (1.0 only when exact)."""
        return 1.0 if self.exact else math.floor(self.share * 10000) / 10000


def agreement(reference: Sequence[Span], got: Sequence[Span]) -> Agreement:
    common = Counter(reference) & Counter(got)
    return Agreement(sum(common.values()), len(reference), len(got))


# Character classes for the pre-tokenizers ----------------------------------------------------


def _ranges(points: list[int]) -> str:
    out: list[str] = []
    i = 0
    while i < len(points):
        j = i
        while j + 1 < len(points) and points[j + 1] == points[j] + 1:
            j += 1
        lo, hi = points[i], points[j]
        out.append(f"\\U{lo:08x}" if lo == hi else f"\\U{lo:08x}-\\U{hi:08x}")
        i = j + 1
    return "".join(out)


@lru_cache(maxsize=8)
def _letter_number_classes(chars: frozenset[str] | None = None) -> tuple[str, str]:
    """\\p{L} and \\p{N} as the contents of `re` character classes, from the general
    categories of Python's `unicodedata` (exact for its Unicode version): of every code point,
    or only of `chars` (a pattern applied to a text tests no other character)."""
    letters: list[int] = []
    numbers: list[int] = []
    category = unicodedata.category
    points = range(LAST_LETTER_OR_NUMBER + 1) if chars is None else sorted(map(ord, chars))
    for cp in points:
        major = category(chr(cp))[0]
        if major == "L":
            letters.append(cp)
        elif major == "N":
            numbers.append(cp)
    return _ranges(letters), _ranges(numbers)


@lru_cache(maxsize=8)
def pretokenizer(name: str, chars: frozenset[str] | None = None) -> re.Pattern[str]:
    """The pre-tokenizer regular expression `name` (a key of PRE_TOKENIZERS) for `re`: the
    published pattern with \\p{L} and \\p{N} spelt as explicit classes (of the characters in
    `chars` when given: the pattern then splits only texts made of them as the full one does)
    and \\s as Unicode White_Space."""
    letter, number = _letter_number_classes(chars)
    L, N, s, S = f"[{letter}]", f"[{number}]", f"[{WHITE_SPACE}]", f"[^{WHITE_SPACE}]"
    other = f"[^{WHITE_SPACE}{letter}{number}]"
    nothing = "[^\\x00-\\U0010ffff]"  # an empty class is not valid syntax
    L = L if letter else nothing
    N = N if number else nothing
    if name == "gpt-2":
        pattern = rf"'s|'t|'re|'ve|'m|'ll|'d| ?{L}+| ?{N}+| ?{other}+|{s}+(?!{S})|{s}+"
    elif name == "qwen2":
        pattern = (
            r"'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]"
            rf"|[^\r\n{letter}{number}]?{L}+|{N}| ?{other}+[\r\n]*|{s}*[\r\n]+|{s}+(?!{S})|{s}+"
        )
    else:
        raise KeyError(name)
    return re.compile(pattern)


# Byte-level BPE ------------------------------------------------------------------------------


def byte_alphabet() -> list[str]:
    """GPT-2's byte alphabet: byte b as one printable character (printable Latin-1 bytes as
    themselves, the other 68 from U+0100 up, in byte order)."""
    table: list[str] = [""] * 256
    extra = 0
    for b in range(256):
        if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or 0xAE <= b <= 0xFF:
            table[b] = chr(b)
        else:
            table[b] = chr(0x100 + extra)
            extra += 1
    return table


class ByteLevelBPE:
    """Spans are byte offsets in the UTF-8 text.

    `ids` maps token texts (in the byte alphabet) to ids, `ranks` maps merges ("a b": the two
    symbols with one space between, as `tokenizer.ggml.merges` lists them) to their rank;
    `from_lists` builds both from the GGUF arrays (the first of equal merges counts)."""

    def __init__(self, ids: Mapping[str, int], ranks: Mapping[str, int], pre: str) -> None:
        if pre not in PRE_TOKENIZERS:
            raise KeyError(pre)
        self.ids = ids
        self.ranks = ranks
        self.pre = pre
        alphabet = byte_alphabet()
        self.spell = {b: alphabet[b] for b in range(256)}
        self._cache: dict[str, list[str]] = {}

    @classmethod
    def from_lists(cls, tokens: Sequence[str], merges: Sequence[str], pre: str) -> ByteLevelBPE:
        ranks = dict(zip(merges, range(len(merges)), strict=True))
        if len(ranks) < len(merges):
            ranks = {}
            for rank, merge in enumerate(merges):
                ranks.setdefault(merge, rank)
        return cls(dict(zip(tokens, range(len(tokens)), strict=True)), ranks, pre)

    def spelt(self, piece: str) -> str:
        """A piece's UTF-8 bytes in the byte alphabet."""
        spell = self.spell
        return "".join(spell[b] for b in piece.encode("utf-8"))

    def bpe(self, word: str) -> list[str]:
        """Merge the symbols of one pre-tokenized piece (spelt in the byte alphabet)."""
        done = self._cache.get(word)
        if done is not None:
            return done
        parts = list(word)
        ranks = self.ranks
        while len(parts) > 1:
            best = None
            for i in range(len(parts) - 1):
                r = ranks.get(parts[i] + " " + parts[i + 1])
                if r is not None and (best is None or r < best):
                    best = r
            if best is None:
                break
            merged: list[str] = []
            i = 0
            while i < len(parts):
                if i + 1 < len(parts) and ranks.get(parts[i] + " " + parts[i + 1]) == best:
                    merged.append(parts[i] + parts[i + 1])
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        self._cache[word] = parts
        return parts

    def pieces(self, text: str) -> list[str]:
        """The pre-tokenizer's pieces of `text` (their concatenation is the text)."""
        return pretokenizer(self.pre, frozenset(text)).findall(text)

    def tokenize(self, text: str) -> list[Span]:
        out: list[Span] = []
        pos = 0
        for piece in self.pieces(text):
            for part in self.bpe(self.spelt(piece)):
                out.append((self.ids.get(part, -1), pos, pos + len(part)))
                pos += len(part)  # one alphabet character per byte
        return out


# SentencePiece BPE ---------------------------------------------------------------------------


class SentencePieceBPE:
    """Spans are byte offsets in the UTF-8 text with its prefix space (when added): U+2581 stands
    for one space byte, as in π's sentencepiece marking."""

    def __init__(
        self,
        tokens: Sequence[str],
        scores: Sequence[float],
        *,
        prefix_space: bool = True,
        unk_id: int = 0,
    ) -> None:
        self.ids = dict(
            zip(tokens, range(len(tokens)), strict=True)
        )  # llama.cpp's map: the last of equals
        self.scores = scores
        self.prefix_space = prefix_space
        self.unk_id = unk_id
        self.byte_ids = [self.ids.get(f"<0x{b:02X}>", -1) for b in range(256)]

    def tokenize(self, text: str) -> list[Span]:
        if not text:
            return []
        original = " " + text if self.prefix_space else text
        chars = list(original.replace(" ", SPM_MARKER))
        widths = [len(c.encode("utf-8")) for c in original]
        n = len(chars)
        sym = chars[:]  # symbol i's text (empty once merged into its left neighbour)
        nxt = [*range(1, n), -1]
        prv = list(range(-1, n - 1))
        heap: list[tuple[float, int, int, int]] = []
        ids, scores = self.ids, self.scores

        def push(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            joined = sym[left] + sym[right]
            tid = ids.get(joined)
            if tid is not None and tid < len(scores):
                heapq.heappush(heap, (-scores[tid], left, right, len(joined)))

        for i in range(1, n):
            push(i - 1, i)
        while heap:
            _, left, right, size = heapq.heappop(heap)
            if not sym[left] or not sym[right] or len(sym[left]) + len(sym[right]) != size:
                continue
            sym[left] += sym[right]
            sym[right] = ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prv[nxt[right]] = left
            push(prv[left], left)
            push(left, nxt[left])
        out: list[Span] = []
        pos = 0
        i = 0
        while i >= 0:
            stop = nxt[i] if nxt[i] >= 0 else n
            width = sum(widths[i:stop])
            tid = ids.get(sym[i])
            if tid is not None:
                out.append((tid, pos, pos + width))
            else:  # byte fallback
                for k, b in enumerate(original[i:stop].encode("utf-8")):
                    bid = self.byte_ids[b]
                    out.append((bid if bid >= 0 else self.unk_id, pos + k, pos + k + 1))
            pos += width
            i = nxt[i]
        return out


# WordPiece -----------------------------------------------------------------------------------


def _is_cjk(o: int) -> bool:
    return (
        0x4E00 <= o <= 0x9FFF
        or 0x3400 <= o <= 0x4DBF
        or 0x20000 <= o <= 0x2A6DF
        or 0x2A700 <= o <= 0x2CEAF
        or 0xF900 <= o <= 0xFAFF
        or 0x2F800 <= o <= 0x2FA1F
    )


def _stands_alone(c: str) -> bool:
    o = ord(c)
    return (
        33 <= o <= 47
        or 58 <= o <= 64
        or 91 <= o <= 96
        or 123 <= o <= 126
        or unicodedata.category(c).startswith("P")
        or _is_cjk(o)
    )


class WordPiece:
    """Spans are offsets counted in the bytes of the normalized text that are not white space
    (words are what both tokenizers piece; the spaces between them are no token)."""

    def __init__(self, tokens: Sequence[str], *, unk_id: int, marker: str = SPM_MARKER) -> None:
        self.ids = dict(zip(tokens, range(len(tokens)), strict=True))
        self.unk_id = unk_id
        self.marker = marker
        self.longest = max((len(t) for t in tokens), default=1)

    @staticmethod
    def words(text: str) -> list[str]:
        """Normalize (NFD, no accents or controls, lower case) and split into words."""
        out: list[str] = []
        word: list[str] = []
        for c in unicodedata.normalize("NFD", text):
            cat = unicodedata.category(c)
            if c.isspace():
                if word:
                    out.append("".join(word))
                    word = []
            elif cat == "Mn" or cat in ("Cc", "Cf"):
                continue
            elif _stands_alone(c):
                if word:
                    out.append("".join(word))
                    word = []
                out.append(c.lower())
            else:
                word.append(c.lower())
        if word:
            out.append("".join(word))
        return out

    def tokenize(self, text: str) -> list[Span]:
        out: list[Span] = []
        pos = 0
        ids, longest, m = self.ids, self.longest, len(self.marker)
        for w in self.words(text):
            marked = self.marker + w
            pieces: list[Span] = []
            i = 0
            while i < len(marked):
                for j in range(min(len(marked), i + longest), i, -1):
                    tid = ids.get(marked[i:j])
                    if tid is not None:
                        break
                else:
                    pieces = []
                    break
                start = pos + len(marked[m:i].encode("utf-8")) if i > 0 else pos
                pieces.append((tid, start, pos + len(marked[m:j].encode("utf-8"))))
                i = j
            width = len(w.encode("utf-8"))
            out.extend(pieces if pieces else [(self.unk_id, pos, pos + width)])
            pos += width
        return out
