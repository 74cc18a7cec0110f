"""Byte-level BPE (GPT-2's family: `tokenizer.ggml.model` "gpt2", or a `tokenizer.json` whose
model is BPE over GPT-2's byte alphabet), giving exactly the model's own ids.

How a text becomes ids (docs/tokenizers.md, "Byte-level BPE"):

1. Added tokens are cut out first: from a GGUF, the user-defined ones as llama.cpp does
   (`llama_special.py`); from a tokenizer.json, its non-special added tokens as Hugging Face
   does. Special tokens are never parsed from text.
2. Each remaining piece of text is split by the pre-tokenizer: a sequence of regular
   expressions, each applied to every chunk the previous one left, matches and the text between
   them both kept ("isolated"). llama.cpp's expressions are rewritten here for Python's `re`,
   with its Unicode categories (`uclasses.py`) and its white space.
3. Each chunk's UTF-8 bytes are merged pairwise by merge rank, lowest rank first and the leftmost
   of equal pairs first, until no adjacent pair is a merge; each final symbol is one token.
   Chunks repeat, so their ids are cached.

Steps 2 and 3 run in the compiled kernel (`matrixctl/_bpe_kernel.c`) for the pre-tokenizers it
has a scanner for (GPT-2's, Llama 3's, Qwen2's and Qwen3.5's expressions, and starcoder's
digits-then-GPT-2 steps): the whole text in one call, with the GIL released. Every other
pre-tokenizer runs the Python path below; both give the same ids (tests/tokenizers/model/
test_bpe_kernel.py checks them against each other).

Decoding is exact: each token's text is spelt in GPT-2's byte alphabet, so the bytes come back.
"""

from __future__ import annotations

import heapq
import operator
import re
import unicodedata
from array import array
from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from functools import cache, partial
from itertools import accumulate, chain, repeat
from typing import Any

from matrixctl import _bpe_kernel
from matrixctl.errors import FormatError
from matrixctl.tokenizers.model import bpe_cache
from matrixctl.tokenizers.model import llama_special as special
from matrixctl.tokenizers.model.base import (
    TOKENIZER_ID,
    TOKENIZER_UNSUPPORTED,
    TOKENIZER_VOCAB,
    ModelTokenizer,
    kv_get,
    kv_list,
)
from matrixctl.tokenizers.model.uclasses import (
    UNICODE_15_1_ADDED,
    WHITE_SPACE,
    WS,
    char_class,
    group_ranges,
)

# GPT-2's byte alphabet: printable Latin-1 bytes stand for themselves, the other 68 bytes for
# U+0100.. in byte order.
_PRINTABLE = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]


def _byte_alphabet() -> list[str]:
    chars = [""] * 256
    n = 0
    for b in range(256):
        if b in _PRINTABLE:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return chars


BYTE_TO_CHAR: list[str] = _byte_alphabet()
CHAR_TO_BYTE: dict[str, int] = {c: b for b, c in enumerate(BYTE_TO_CHAR)}
_DECODE_TABLE = {ord(c): b for c, b in CHAR_TO_BYTE.items()}


# each alphabet character as the Latin-1 character of its byte; a text of alphabet characters
# only is a match of _ALPHABET_TEXT
_ALPHABET_LATIN1 = {ord(c): b for c, b in CHAR_TO_BYTE.items()}
_ALPHABET_TEXT = re.compile("[" + "".join(re.escape(c) for c in BYTE_TO_CHAR) + "]*")


def alphabet_bytes(text: str) -> bytes | None:
    """The bytes `text` spells in GPT-2's byte alphabet, or None when a character is not in it."""
    if _ALPHABET_TEXT.fullmatch(text) is None:
        return None
    return text.translate(_ALPHABET_LATIN1).encode("latin-1")


_NOT_ALPHABET = re.compile("[^" + "".join(re.escape(c) for c in BYTE_TO_CHAR) + "]")


def alphabet_bytes_many(texts: Sequence[str]) -> list[bytes | None]:
    """`alphabet_bytes` of each text (one pass over them all: building a large vocabulary)."""
    joined = "".join(texts)
    bad = [m.start() for m in _NOT_ALPHABET.finditer(joined)]
    if bad:
        joined = _NOT_ALPHABET.sub("\x00", joined)
    data = joined.translate(_ALPHABET_LATIN1).encode("latin-1")
    out: list[bytes | None] = []
    pos = 0
    for t in texts:
        end = pos + len(t)
        out.append(data[pos:end])
        pos = end
    if bad:
        ends = list(accumulate(len(t) for t in texts))
        for at in bad:
            out[bisect_right(ends, at)] = None
    return out


def alphabet_text(data: bytes) -> str:
    """`data` spelt in GPT-2's byte alphabet."""
    return "".join(BYTE_TO_CHAR[b] for b in data)


def utf8(text: str) -> bytes:
    """A text to encode as UTF-8; a lone surrogate as the three bytes it would be
    ("surrogatepass": what llama.cpp reads from such bytes)."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


def token_utf8(text: str) -> bytes:
    """A token's text as UTF-8: surrogate escapes (GGUF bytes that were not UTF-8, as
    tests/helpers/gguf_kv.py reads them) as the bytes they stand for."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        try:
            return text.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            return text.encode("utf-8", "surrogatepass")


# Pre-tokenizers ------------------------------------------------------------------------------

# Non-ASCII white space becomes U+000B before llama.cpp matches an expression without Unicode
# categories (its std::wregex has no Unicode \s); only its literal ranges can tell.
_WIDE_TABLE = {ord(c): "\x0b" for c in WHITE_SPACE if ord(c) > 0x7F}


class Step:
    """One regular expression of a pre-tokenizer. `wide`: matched on the text with non-ASCII
    white space turned into U+000B (llama.cpp's expressions without Unicode categories)."""

    __slots__ = ("regex", "wide")

    def __init__(self, pattern: str, *, wide: bool = False) -> None:
        self.regex = re.compile(pattern)
        if self.regex.match(""):
            raise ValueError("a pre-tokenizer expression must not match the empty string")
        self.wide = wide

    def split(self, chunks: list[str]) -> list[str]:
        out: list[str] = []
        regex = self.regex
        for chunk in chunks:
            subject = chunk.translate(_WIDE_TABLE) if self.wide else chunk
            pos = 0
            for m in regex.finditer(subject):
                s, e = m.span()
                if s > pos:
                    out.append(chunk[pos:s])
                out.append(chunk[s:e])
                pos = e
            if pos < len(chunk):
                out.append(chunk[pos:])
        return out


@cache
def _llama_patterns() -> dict[str, str]:
    L, N, P, M = (char_class(g) for g in "LNPM")
    W = WS
    contractions = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
    tail = f"[{W}]*[\\r\\n]+|[{W}]+(?![^{W}])|[{W}]+"
    return {
        # llama.cpp's hand-written matchers (unicode.cpp) behave as these expressions
        "gpt2": (
            f"'s|'t|'re|'ve|'m|'ll|'d| ?[{L}]+| ?[{N}]+| ?[^{W}{L}{N}]+|[{W}]+(?![^{W}])|[{W}]+"
        ),
        "llama3": (
            f"{contractions}|[^\\r\\n{L}{N}]?[{L}]+|[{N}]{{1,3}}| ?[^{W}{L}{N}]+[\\r\\n]*|{tail}"
        ),
        "qwen2": f"{contractions}|[^\\r\\n{L}{N}]?[{L}]+|[{N}]| ?[^{W}{L}{N}]+[\\r\\n]*|{tail}",
        "qwen35": (
            f"{contractions}|[^\\r\\n{L}{N}]?[{L}{M}]+|[{N}]| ?[^{W}{L}{M}{N}]+[\\r\\n]*|{tail}"
        ),
        "P": f"[{P}]",
        "L": f"[{L}]",
        "N": f"[{N}]",
        "W": f"[{W}]",
    }


# deepseek-llm's letter ranges (a literal class in its expression, not a Unicode category)
_DEEPSEEK_LETTERS = (
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-"
    "\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-"
    "\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5"
    "\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-"
    "\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-"
    "\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-"
    "\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-"
    "\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149"
    "\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d"
    "\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-"
    "\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-"
    "\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-"
    "\U0001e943"
)
_DEEPSEEK_PUNCT = "!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002"
_DEEPSEEK_CJK = "\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff"
# ECMAScript's \s in llama.cpp's std::wregex (the "C" locale: ASCII white space only)
_ASCII_S = "[\\t\\n\\x0b\\x0c\\r ]"


def _llama_steps(kind: str) -> list[Step]:
    p = _llama_patterns()
    if kind in ("gpt2", "llama3", "qwen2", "qwen35"):
        return [Step(p[kind])]
    if kind == "deepseek-llm":
        return [
            Step("[\\r\\n]", wide=True),
            Step(f"{_ASCII_S}?[{_DEEPSEEK_LETTERS}]+", wide=True),
            Step(f"{_ASCII_S}?[{_DEEPSEEK_PUNCT}]+", wide=True),
            Step(f"{_ASCII_S}+\\Z", wide=True),
            Step(f"[{_DEEPSEEK_CJK}]+", wide=True),
            Step(f"{p['N']}+"),
        ]
    if kind == "deepseek-coder":
        return [
            Step("[\\r\\n]", wide=True),
            Step(f"{p['W']}?{p['L']}+"),
            Step(f"{p['W']}?{p['P']}+"),
            Step(f"[{_DEEPSEEK_CJK}]+", wide=True),
            Step(p["N"]),
        ]
    if kind == "falcon":
        return [
            Step(f"[{char_class('P')}$+<=>^~|`]+"),
            Step(p["gpt2"]),
            Step("[0-9][0-9][0-9]", wide=True),
        ]
    if kind == "starcoder":
        return [Step(p["N"]), Step(p["gpt2"])]
    if kind == "default":
        return [
            Step(f"[{char_class('P')}$+<=>^~|]+"),
            Step(p["gpt2"]),
            Step(f"{p['N']}+"),
            Step("[0-9][0-9][0-9]", wide=True),
        ]
    raise AssertionError(kind)


# tokenizer.ggml.pre -> (llama.cpp's pre-tokenizer kind, ignore_merges, add_bos by default)
LLAMA_PRE: dict[str | None, tuple[str, bool, bool]] = {
    None: ("default", False, False),
    "default": ("default", False, False),
    "gpt-2": ("gpt2", False, False),
    "mpt": ("gpt2", False, False),
    "llama-bpe": ("llama3", True, True),
    "qwen2": ("qwen2", False, False),
    "qwen35": ("qwen35", False, False),
    "deepseek-llm": ("deepseek-llm", False, False),
    "deepseek-coder": ("deepseek-coder", False, False),
    "falcon": ("falcon", False, False),
    "starcoder": ("starcoder", False, False),
    "refact": ("starcoder", False, False),
    "command-r": ("starcoder", False, False),
}

_STEPS_CACHE: dict[str, list[Step]] = {}


def llama_steps(kind: str) -> list[Step]:
    steps = _STEPS_CACHE.get(kind)
    if steps is None:
        steps = _STEPS_CACHE[kind] = _llama_steps(kind)
    return steps


# BPE -----------------------------------------------------------------------------------------

Ranks = dict[tuple[Any, Any], int]


def merge_symbols(symbols: list[Any], ranks: Ranks) -> list[Any]:
    """Merge adjacent symbols (bytes or str) by rank: the lowest rank first, the leftmost of
    equal ones first, until no adjacent pair is in `ranks`."""
    n = len(symbols)
    if n < 2:
        return symbols
    if n <= 48:
        get = ranks.get
        while len(symbols) > 1:
            best = -1
            best_rank = 1 << 62
            prev = symbols[0]
            for i in range(1, len(symbols)):
                cur = symbols[i]
                r = get((prev, cur))
                if r is not None and r < best_rank:
                    best_rank = r
                    best = i - 1
                prev = cur
            if best < 0:
                break
            symbols[best : best + 2] = [symbols[best] + symbols[best + 1]]
        return symbols
    # long chunks: a heap of (rank, left index) over a linked list, stale entries skipped
    syms = list(symbols)
    nxt = list(range(1, n + 1))
    nxt[-1] = -1
    prv = list(range(-1, n - 1))
    heap: list[tuple[int, int, int]] = []
    for i in range(n - 1):
        r = ranks.get((syms[i], syms[i + 1]))
        if r is not None:
            heap.append((r, i, i + 1))
    heapq.heapify(heap)
    while heap:
        r, left, right = heapq.heappop(heap)
        if syms[left] is None or syms[right] is None or nxt[left] != right:
            continue
        if ranks.get((syms[left], syms[right])) != r:
            continue
        syms[left] = syms[left] + syms[right]
        syms[right] = None
        after = nxt[right]
        nxt[left] = after
        if after >= 0:
            prv[after] = left
        before = prv[left]
        if before >= 0:
            rb = ranks.get((syms[before], syms[left]))
            if rb is not None:
                heapq.heappush(heap, (rb, before, left))
        if after >= 0:
            ra = ranks.get((syms[left], syms[after]))
            if ra is not None:
                heapq.heappush(heap, (ra, left, after))
    return [s for s in syms if s is not None]


def _split_merge(entry: str) -> tuple[str, str] | None:
    """A merge line "first second": split at the first space after the first character (as
    llama.cpp and Hugging Face read them)."""
    pos = entry.find(" ", 1)
    if pos < 0:
        return None
    return entry[:pos], entry[pos + 1 :]


# The compiled kernel -------------------------------------------------------------------------

# chunks the kernel's cache holds before it starts again (the ids do not depend on it)
KERNEL_CACHE_LIMIT = 1 << 19


@cache
def _kernel_kinds() -> dict[str, int]:
    """The expressions the kernel has a scanner for, and the kernel's name of each."""
    p = _llama_patterns()
    k = _bpe_kernel
    return {
        p["gpt2"]: k.KIND_GPT2,
        p["llama3"]: k.KIND_LLAMA3,
        p["qwen2"]: k.KIND_QWEN2,
        p["qwen35"]: k.KIND_QWEN35,
    }


def kernel_kind(steps: Sequence[Step]) -> int | None:
    """The kernel's scanner for a pre-tokenizer, or None when it has none (the Python path)."""
    if len(steps) != 1 or steps[0].wide:
        return None
    return _kernel_kinds().get(steps[0].regex.pattern)


def kernel_kind_of(kind: str) -> int | None:
    """The kernel's scanner for one of llama.cpp's pre-tokenizer kinds (`LLAMA_PRE`)."""
    k = _bpe_kernel
    names = {"gpt2": k.KIND_GPT2, "llama3": k.KIND_LLAMA3, "qwen2": k.KIND_QWEN2}
    return {**names, "qwen35": k.KIND_QWEN35, "starcoder": k.KIND_STARCODER}.get(kind)


@cache
def kernel_classes(marks: bool) -> bytes:
    """The kernel's class flags of every code point: llama.cpp's letters, numbers and white
    space (its Unicode 15.1: this Python's data plus the code points 15.0 and 15.1 assigned),
    and with `marks` its marks (Qwen3.5's expression)."""
    k = _bpe_kernel
    flags = {"L": k.CLASS_L, "N": k.CLASS_N}
    ranges = [(a, b, flags[g]) for a, b, g in UNICODE_15_1_ADDED if g in flags]
    if marks:
        ranges += [(a, b, k.CLASS_M) for a, b in group_ranges("M")]
    return k.classes(ranges, WHITE_SPACE)


class ByteLevelBPE(ModelTokenizer):
    """Byte-level BPE; build it with `from_gguf_kv` or `from_tokenizer_json`."""

    family = "bpe"

    def __init__(
        self,
        *,
        tokens: Sequence[str],
        token_bytes: Sequence[bytes],
        byte_vocab: Mapping[bytes, int],
        ranks: Ranks | Callable[[], Ranks],
        steps: Sequence[Step] | Callable[[], Sequence[Step]],
        pre: str | None,
        source: str,
        ignore_merges: bool,
        missing: Callable[[bytes], list[int]],
        splitter: Callable[[str], list[str | int]] | None,
        normalize: Callable[[str], str] | None = None,
        prefix_space: bool = False,
        kernel_kind: int | None = None,
        kernel_tables: tuple[bytes, ...] | None = None,
        cache_key: bytes | None = None,
    ) -> None:
        """`ranks` and `steps`: the merge ranks and the pre-tokenizer's expressions, or functions
        making them (on first use); `kernel_kind`: the kernel's scanner for the expressions when
        the caller knows it (else found from `steps`); `kernel_tables`: the kernel's tables
        from the cache (`bpe_cache`); `cache_key`: where to store them when built."""
        self.tokens = list(tokens)
        self._token_bytes = list(token_bytes)
        self._vocab = dict(byte_vocab)
        self._ranks_made: Ranks | None = None if callable(ranks) else ranks
        self._make_ranks = ranks if callable(ranks) else None
        self._kernel_tables = kernel_tables
        self._cache_key = cache_key
        # the expressions, or what makes them (compiling them costs more than a kernel needs)
        self._steps_made: list[Step] | None = None if callable(steps) else list(steps)
        self._make_steps = steps if callable(steps) else None
        self._kernel_kind = kernel_kind
        self.pre = pre
        self.source = source
        self.vocab_size = len(self.tokens)
        self._ignore_merges = ignore_merges
        self._missing = missing
        self._splitter = splitter
        self._normalize = normalize
        self._prefix_space = prefix_space
        self._cache: dict[str, tuple[int, ...]] = {}
        self._kernel: Any = None  # the compiled kernel's model, built on first use
        self._kernel_state = 0  # 0: not built yet, 1: built, -1: the Python path
        self.notes: list[str] = []
        # bytes no token stands for: llama.cpp drops them from the ids (decoding loses them)
        self.missing_bytes = frozenset(b for b in range(256) if bytes([b]) not in self._vocab)

    # building --------------------------------------------------------------------------------

    @classmethod
    def from_gguf_kv(cls, kv: Mapping[str, Any]) -> ByteLevelBPE:
        """From a GGUF's metadata (`tokenizer.ggml.model` "gpt2"); encodes as llama.cpp."""
        model = kv_get(kv, "tokenizer.ggml.model", str)
        if model != "gpt2":
            raise FormatError(
                TOKENIZER_UNSUPPORTED,
                f"tokenizer.ggml.model {model!r} is not byte-level BPE",
                field="tokenizer.ggml.model",
            )
        pre = kv_get(kv, "tokenizer.ggml.pre", str, None)
        if pre not in LLAMA_PRE:
            raise FormatError(
                TOKENIZER_UNSUPPORTED,
                f"pre-tokenizer {pre!r} (tokenizer.ggml.pre) is not one matrixctl implements "
                f"exactly (it does: {', '.join(sorted(p for p in LLAMA_PRE if p))})",
                field="tokenizer.ggml.pre",
            )
        kind, ignore_merges, add_bos_default = LLAMA_PRE[pre]
        tokens = list(kv_list(kv, "tokenizer.ggml.tokens", str))
        if not tokens:
            raise FormatError(TOKENIZER_VOCAB, "tokenizer.ggml.tokens is empty", field="tokens")
        n = len(tokens)
        # llama.cpp names an empty token after its id
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
        attrs, notes = special.token_attrs(kv, tokens, types, default_eos=11)

        text_to_id: dict[str, int] = {}
        for i, t in enumerate(tokens):
            text_to_id[t] = i
        # the tables the kernel covers are cached per vocabulary (bpe_cache)
        covered = kernel_kind_of(kind) is not None
        key = bpe_cache.key_of(pre, tokens, attrs, merges) if covered else None
        entry = bpe_cache.load(key, n) if key is not None else None
        ranks: Ranks | Callable[[], Ranks]
        # the merge ranks, made when the kernel's tables or the Python path need them
        ranks = partial(_gguf_ranks, merges)
        if entry is not None:
            token_bytes, byte_vocab, tables = entry
        else:
            spelt = alphabet_bytes_many(tokens)
            byte_vocab = {}
            for i in text_to_id.values():
                b = spelt[i]
                if b is not None:
                    byte_vocab[b] = i
            token_bytes = [
                _gguf_token_bytes(t, a, b) for t, a, b in zip(tokens, attrs, spelt, strict=False)
            ]
            tables = None

        def missing(symbol: bytes) -> list[int]:
            # llama.cpp looks each byte of the symbol's alphabet spelling up as a one-byte token
            out: list[int] = []
            for byte in utf8(alphabet_text(symbol)):
                text = chr(byte) if byte < 0x80 else chr(0xDC00 + byte)
                tid = text_to_id.get(text)
                if tid is not None:
                    out.append(tid)
            return out

        splitter = special.SpecialSplitter(tokens, attrs)
        self = cls(
            tokens=tokens,
            token_bytes=token_bytes,
            byte_vocab=byte_vocab,
            ranks=ranks,
            steps=lambda: llama_steps(kind),
            kernel_kind=kernel_kind_of(kind),
            pre=pre,
            source="gguf",
            ignore_merges=ignore_merges,
            missing=missing,
            splitter=splitter.split if splitter else None,
            kernel_tables=tables,
            cache_key=key,
        )
        self.notes = notes
        self.bos_id = special_id(kv, "tokenizer.ggml.bos_token_id", n, default=11)
        self.eos_id = special_id(kv, "tokenizer.ggml.eos_token_id", n, default=11)
        self.unk_id = special_id(kv, "tokenizer.ggml.unknown_token_id", n)
        self.pad_id = special_id(kv, "tokenizer.ggml.padding_token_id", n)
        self.add_bos = bool(kv_get(kv, "tokenizer.ggml.add_bos_token", bool, add_bos_default))
        self.add_eos = bool(kv_get(kv, "tokenizer.ggml.add_eos_token", bool, False))
        return self

    @classmethod
    def from_tokenizer_json(cls, obj: Mapping[str, Any]) -> ByteLevelBPE:
        """From a Hugging Face `tokenizer.json` with a byte-level BPE model; encodes as
        `tokenizers`' `encode(text, add_special_tokens=False)` with special tokens not parsed."""
        from matrixctl.tokenizers.model import bpe_hf

        return bpe_hf.build(cls, obj)

    @property
    def _ranks(self) -> Ranks:
        ranks = self._ranks_made
        if ranks is None:
            assert self._make_ranks is not None
            ranks = self._ranks_made = self._make_ranks()
        return ranks

    @property
    def _steps(self) -> list[Step]:
        steps = self._steps_made
        if steps is None:
            assert self._make_steps is not None
            steps = self._steps_made = list(self._make_steps())
        return steps

    # the kernel ------------------------------------------------------------------------------

    def without_kernel(self) -> ByteLevelBPE:
        """A copy that encodes with the Python path only (for tests and benchmarks)."""
        other = type(self).__new__(type(self))
        other.__dict__.update(self.__dict__)
        other._kernel = None
        other._kernel_state = -1
        other._cache = {}
        return other

    @property
    def kernel(self) -> Any:
        """The compiled kernel's model, or None when the pre-tokenizer is not one it covers."""
        if self._kernel_state == 0:
            self._kernel = self._build_kernel()
            self._kernel_state = 1 if self._kernel is not None else -1
        return self._kernel

    def _build_kernel(self) -> Any:
        kind = self._kernel_kind
        if kind is None:
            kind = kernel_kind(self._steps)
        if kind is None:
            return None
        tables = self._kernel_tables
        if tables is not None:
            try:
                return self._model(kind, tables)
            except ValueError:  # a cache entry the kernel refuses: build the tables again
                self._kernel_tables = None
        tables = self._make_tables()
        if tables is None:
            return None
        model = self._model(kind, tables)
        if self._make_ranks is not None:
            self._ranks_made = None  # made again only if the Python path runs
        if self._cache_key is not None:
            entry = (self._token_bytes, self._vocab, tables)
            bpe_cache.store(self._cache_key, entry)
        return model

    def _model(self, kind: int, tables: tuple[bytes, ...]) -> Any:
        if len(tables) != bpe_cache.N_TABLES:
            raise ValueError("a kernel table is missing")
        sym_token, missing_off, missing_ids, merges, blob, offsets, vocab_ids = tables
        return _bpe_kernel.Model(
            kind,
            kernel_classes(kind == _bpe_kernel.KIND_QWEN35),
            array("i", range(256)),
            sym_token,
            missing_off,
            missing_ids,
            merges,
            blob,
            offsets,
            vocab_ids,
            self._ignore_merges,
            KERNEL_CACHE_LIMIT,
        )

    def _make_tables(self) -> tuple[bytes, ...] | None:
        """The kernel's tables (`bpe_cache.N_TABLES` of them, as bytes), or None when a symbol
        has no token and the source says that cannot be."""
        # symbols: every byte string a merge can make or use, numbered (the bytes first)
        lefts = [a for a, _ in self._ranks]
        rights = [b for _, b in self._ranks]
        made = list(map(operator.add, lefts, rights))
        singles = [bytes([b]) for b in range(256)]
        sym = {s: i for i, s in enumerate(dict.fromkeys(chain(singles, lefts, rights, made)))}
        number = sym.__getitem__
        merges = array("i", bytes(16 * len(made)))
        merges[0::4] = array("i", map(number, lefts))
        merges[1::4] = array("i", map(number, rights))
        merges[2::4] = array("i", self._ranks.values())
        merges[3::4] = array("i", map(number, made))
        vocab = self._vocab
        sym_token = array("i", map(vocab.get, sym, repeat(-1)))
        # symbols no token spells: the ids `_missing` gives instead (few, or none)
        counts = [0] * len(sym)
        missing_ids = array("i")
        symbols = list(sym)
        for i in [i for i, tid in enumerate(sym_token) if tid < 0]:
            try:
                ids = self._missing(symbols[i])
            except AssertionError:  # a source that says every symbol is a token
                return None
            missing_ids.extend(ids)
            counts[i] = len(ids)
        missing_off = array("i", accumulate(counts, initial=0))
        if self._ignore_merges:
            blob = b"".join(vocab)
            offsets = array("i", accumulate(map(len, vocab), initial=0))
            vocab_ids = array("i", vocab.values())
        else:
            blob, offsets, vocab_ids = b"", array("i", [0]), array("i")
        parts = (sym_token, missing_off, missing_ids, merges, blob, offsets, vocab_ids)
        return tuple(bytes(p) for p in parts)

    # encoding --------------------------------------------------------------------------------

    def _chunk_ids(self, chunk: str) -> tuple[int, ...]:
        data = utf8(chunk)
        vocab = self._vocab
        if self._ignore_merges:
            tid = vocab.get(data)
            if tid is not None:
                return (tid,)
        symbols = merge_symbols([data[i : i + 1] for i in range(len(data))], self._ranks)
        out: list[int] = []
        for s in symbols:
            tid = vocab.get(s)
            if tid is None:
                out.extend(self._missing(s))
            else:
                out.append(tid)
        return tuple(out)

    def _encode_text(self, text: str, out: list[int]) -> None:
        if self._normalize is not None:
            text = self._normalize(text)
        if self._prefix_space and not text.startswith(" "):
            text = " " + text
        kernel = self._kernel if self._kernel_state > 0 else self.kernel
        if kernel is not None:
            out.extend(kernel.encode_list(text))
            return
        chunks = [text]
        for step in self._steps:
            chunks = step.split(chunks)
        cache = self._cache
        if len(cache) > 500_000:
            cache.clear()
        for chunk in chunks:
            ids = cache.get(chunk)
            if ids is None:
                ids = cache[chunk] = self._chunk_ids(chunk)
            out.extend(ids)

    def encode_ordinary(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"text must be str, not {type(text).__name__}")
        out: list[int] = []
        if not text:
            return out
        if self._splitter is None:
            if self._kernel_state > 0 and self._normalize is None and not self._prefix_space:
                return self._kernel.encode_list(text)
            self._encode_text(text, out)
            return out
        for part in self._splitter(text):
            if isinstance(part, int):
                out.append(part)
            else:
                self._encode_text(part, out)
        return out

    def pieces(self, text: str) -> list[str]:
        """The pre-tokenizer's chunks of `text` (no added tokens cut out): for tests and
        inspection."""
        chunks = [text]
        for step in self._steps:
            chunks = step.split(chunks)
        return chunks

    # decoding --------------------------------------------------------------------------------

    def token_bytes(self, token_id: int) -> bytes:
        if not 0 <= token_id < len(self._token_bytes):
            raise FormatError(
                TOKENIZER_ID,
                f"token id {token_id} is outside the vocabulary (0..{len(self._token_bytes) - 1})",
            )
        return self._token_bytes[token_id]

    def decode_bytes(self, ids: Any) -> bytes:
        table = self._token_bytes
        n = len(table)
        parts = []
        for raw in ids:
            i = int(raw)
            if not 0 <= i < n:
                raise FormatError(
                    TOKENIZER_ID, f"token id {i} is outside the vocabulary (0..{n - 1})"
                )
            parts.append(table[i])
        return b"".join(parts)


def _gguf_ranks(merges: Sequence[str]) -> Ranks:
    """A GGUF's merges as ranks of byte-string pairs (the first of a repeated merge counts)."""
    pairs = [_split_merge(entry) or ("", "") for entry in merges]
    firsts = alphabet_bytes_many([p[0] for p in pairs])
    seconds = alphabet_bytes_many([p[1] for p in pairs])
    ranks: Ranks = {}
    for r, (a, b) in enumerate(zip(firsts, seconds, strict=True)):
        if not a or not b:
            continue  # not a pair, or no chunk's symbols can spell it
        ranks.setdefault((a, b), r)
    return ranks


def _gguf_token_bytes(text: str, attr: int, spelt: bytes | None) -> bytes:
    """What llama.cpp's token_to_piece gives for a byte-level BPE token (control tokens: their
    text, as with special=true)."""
    if attr & (special.ATTR_CONTROL | special.ATTR_UNKNOWN | special.ATTR_USER_DEFINED):
        return token_utf8(text)
    if attr & special.ATTR_BYTE:
        byte = byte_token_value(text)
        if byte is not None:
            return bytes([byte])
    if attr & (special.ATTR_NORMAL | special.ATTR_BYTE):
        if spelt is not None:  # alphabet_bytes(text)
            return spelt
        # characters outside the alphabet: their own UTF-8 (llama.cpp writes a marker instead)
        return b"".join(
            bytes([CHAR_TO_BYTE[c]]) if c in CHAR_TO_BYTE else token_utf8(c) for c in text
        )
    return b""  # unused and undefined tokens decode to nothing


_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def byte_token_value(text: str) -> int | None:
    """The byte a "<0xXX>" byte token stands for, or None."""
    m = _BYTE_TOKEN.fullmatch(text)
    return int(m.group(1), 16) if m else None


def special_id(kv: Mapping[str, Any], key: str, n: int, default: int | None = None) -> int | None:
    value = kv.get(key)
    if isinstance(value, int) and not isinstance(value, bool):
        if 0 <= value < n:
            return value
        return default if default is not None and 0 <= default < n else None
    if value is not None:
        raise FormatError(TOKENIZER_VOCAB, f"{key} is {type(value).__name__}, not int", field=key)
    return default if default is not None and 0 <= default < n else None


def nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)
