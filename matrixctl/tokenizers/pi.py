"""The π symbol-map tokenizer (matrix-ingest-v1.md section 3; docs/formats/pi-symbol-map.md).

A symbol map (`pi_symbol_map.json`) lists `{"id", "text"}` symbols. Encoding is:

1. normalize the text with the map's `normalization` (`nfkc`, `nfc`, `nfkd`, `nfd` or `none`);
2. greedy leftmost-longest matching: at each position take the longest symbol that starts
   there; where no symbol starts, the character's UTF-8 bytes become `byte_base_id + b`
   (with `byte_fallback`) or the character becomes one `unk_id` (without).

The matcher is the compiled kernel `matrixctl/_pi_kernel.c`: a byte trie of the symbols'
keys, walked at each position for the longest key that starts there. Every single byte that is
not itself a symbol is added as a one-byte pattern (its byte token, or `unk` for a lead byte and
"nothing" for a continuation byte), so a match starts at every position and the matches tile
the input with no gaps: the fallback needs no slow path and stays exact. On valid UTF-8,
leftmost-longest over bytes equals leftmost-longest over characters (a symbol's first byte is a
lead byte, so matches start on character boundaries).

Decoding is the exact inverse: symbol ids give their text, byte ids give bytes that are
reassembled into UTF-8 (an invalid sequence is an error naming the token, or U+FFFD with
`errors="replace"`), `unk_id` gives U+FFFD, `pad_id` and `eos_id` give nothing.

Codecs never print or exit: problems are findings (`check_map`) or `FormatError`s.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable, Iterator
from functools import partial
from typing import TYPE_CHECKING, Any, NoReturn

from matrixctl import _pi_kernel, codes
from matrixctl.errors import FormatError, UsageError
from matrixctl.findings import Finding, finding
from matrixctl.records import FrozenRecord

if TYPE_CHECKING:
    import numpy as np

FORMAT = "pi-symbol-map"
VERSION = 1
NORMALIZATIONS = ("nfkc", "nfc", "nfkd", "nfd", "none")
MAX_MAP_BYTES = 256 << 20  # a 150k-symbol map is ~5 MiB; refuse to parse absurd files
MAX_VOCAB = (1 << 32) - 1  # vocab_size is a u32 in MATRIX-ATOM
MAX_SYMBOL_BYTES = 1024  # bounds the look-ahead the streaming encoder keeps
BATCH = 8192  # symbols serialized per piece (JSON text of a large map is built in pieces)
REQUIRED = ("version", "vocab_size", "unk_id", "normalization", "symbols")
KNOWN_KEYS = {
    "version",
    "vocab_size",
    "unk_id",
    "pad_id",
    "eos_id",
    "byte_fallback",
    "byte_base_id",
    "normalization",
    "symbols",
    "space_marking",
    "name",
    "description",
}
REPLACEMENT = "\ufffd"

G = FORMAT
PI_JSON = codes.define(
    "PI_JSON", "The symbol map is not a UTF-8 JSON object (or exceeds 256 MiB).", group=G
)
PI_VERSION = codes.define("PI_VERSION", "Unsupported symbol map version (v1 only).", group=G)
PI_FIELD = codes.define(
    "PI_FIELD", "A symbol map field is missing or has the wrong JSON type.", group=G
)
PI_VOCAB_SIZE = codes.define("PI_VOCAB_SIZE", "vocab_size is not between 1 and 2**32 - 1.", group=G)
PI_ID_RANGE = codes.define("PI_ID_RANGE", "A symbol id is outside [0, vocab_size).", group=G)
PI_DUP_ID = codes.define("PI_DUP_ID", "Two symbols share an id.", group=G)
PI_DUP_TEXT = codes.define("PI_DUP_TEXT", "Two symbols share a text.", group=G)
PI_EMPTY_TEXT = codes.define("PI_EMPTY_TEXT", "A symbol's text is empty.", group=G)
PI_SYMBOL_LONG = codes.define(
    "PI_SYMBOL_LONG", "A symbol's text is longer than 1024 UTF-8 bytes.", group=G
)
PI_SPECIAL_RANGE = codes.define(
    "PI_SPECIAL_RANGE", "unk_id, pad_id or eos_id is outside [0, vocab_size).", group=G
)
PI_SPECIAL_COLLISION = codes.define(
    "PI_SPECIAL_COLLISION",
    "unk_id, pad_id or eos_id is also a symbol or byte id (decode reads it as that symbol).",
    group=G,
    severity=codes.Severity.WARNING,
)
PI_BYTE_RANGE = codes.define(
    "PI_BYTE_RANGE",
    "With byte_fallback, the 256 byte ids [byte_base_id, byte_base_id + 256) are not all "
    "inside the vocabulary.",
    group=G,
)
PI_BYTE_COLLISION = codes.define(
    "PI_BYTE_COLLISION", "A byte-fallback id is also a symbol id.", group=G
)
PI_NORMALIZATION = codes.define(
    "PI_NORMALIZATION", "normalization is not nfkc, nfc, nfkd, nfd or none.", group=G
)
PI_NOT_NORMALIZED = codes.define(
    "PI_NOT_NORMALIZED",
    "A symbol's text changes under the map's normalization, so it can never match.",
    group=G,
    severity=codes.Severity.WARNING,
)
PI_UNKNOWN_KEY = codes.define(
    "PI_UNKNOWN_KEY",
    "The symbol map has a key v1 does not define (ignored, not hashed).",
    group=G,
    severity=codes.Severity.INFO,
)
PI_DECODE_ID = codes.define(
    "PI_DECODE_ID",
    "A token id is neither a symbol, a byte, unk_id, pad_id nor eos_id, so it has no text.",
    group=G,
)
PI_DECODE_UTF8 = codes.define(
    "PI_DECODE_UTF8", "Byte tokens do not reassemble into valid UTF-8.", group=G
)
PI_TEXT_UTF8 = codes.define("PI_TEXT_UTF8", "Input text is not valid UTF-8.", group=G)
PI_SPACE_MARKING = codes.define(
    "PI_SPACE_MARKING",
    "space_marking is not an object naming a known scheme (sentencepiece, byte_level, "
    "wordpiece) with fields of the right types.",
    group=G,
)

SCHEMES = ("sentencepiece", "byte_level", "wordpiece")
SPM_MARKER = "\u2581"  # SentencePiece's word marker, LOWER ONE EIGHTH BLOCK


def gpt2_bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: every byte as one printable character (the published
    algorithm: printable Latin-1 bytes map to themselves, the other 68 to U+0100 upwards)."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(0x100 + extra)
            extra += 1
    return table


# A character outside GPT-2's byte alphabet (U+0021-U+007E, U+00A1-U+00AC, U+00AE-U+0143).
_OUTSIDE_BYTE_ALPHABET = re.compile("[^\u0021-\u007e\u00a1-\u00ac\u00ae-\u0143]")
# str.translate table: each alphabet character to the character of its byte (then latin-1).
_BYTE_LEVEL_TRANSLATE = {ord(c): chr(b) for b, c in gpt2_bytes_to_unicode().items()}
_BYTE_LEVEL_DECODER: dict[str, int] | None = None


def byte_level_decoder() -> dict[str, int]:
    global _BYTE_LEVEL_DECODER
    if _BYTE_LEVEL_DECODER is None:
        _BYTE_LEVEL_DECODER = {c: b for b, c in gpt2_bytes_to_unicode().items()}
    return _BYTE_LEVEL_DECODER


class SpaceMarking(FrozenRecord):
    """How a vocabulary marks word boundaries (the map's optional `space_marking` field;
    docs/formats/pi-symbol-map.md, "Space marking"). It changes the bytes a symbol matches
    (its *key*) and, for some schemes, the text before matching:

    - sentencepiece: `marker` (U+2581) in a symbol's text matches a space; with
      `prefix_space`, each document is matched as if it began with a space;
    - byte_level: a symbol's text is spelt in GPT-2's byte alphabet (`Ġ` is the space byte);
      it matches the bytes it spells;
    - wordpiece: words are matched piece by piece; a word's first piece is marked, either by
      `marker` before it (the form llama.cpp's converter writes: `▁the`, `ing`) or by
      `continuation` before every other piece (Hugging Face's vocab.txt: `the`, `##ing`).
      Text is split into words at white space, punctuation and CJK characters (after
      optional lower-casing and accent stripping); each document starts a word.
    """

    __slots__ = (
        "continuation",
        "lowercase",
        "marker",
        "prefix_space",
        "scheme",
        "strip_accents",
    )
    scheme: str
    marker: str | None
    continuation: str | None
    prefix_space: bool
    lowercase: bool
    strip_accents: bool

    def __init__(
        self,
        scheme: str,
        marker: str | None = None,
        continuation: str | None = None,
        prefix_space: bool = False,
        lowercase: bool = False,
        strip_accents: bool = False,
    ) -> None:
        self._init(scheme, marker, continuation, prefix_space, lowercase, strip_accents)

    def to_json(self) -> dict[str, Any]:
        if self.scheme == "sentencepiece":
            return {"scheme": self.scheme, "marker": self.marker, "prefix_space": self.prefix_space}
        if self.scheme == "wordpiece":
            mark = {"marker": self.marker} if self.marker else {"continuation": self.continuation}
            return {
                "scheme": self.scheme,
                **mark,
                "lowercase": self.lowercase,
                "strip_accents": self.strip_accents,
            }
        return {"scheme": self.scheme}

    @property
    def adds_prefix(self) -> bool:
        """Whether each document is matched as if it began with a space (dropped on decode)."""
        return self.scheme == "wordpiece" or (self.scheme == "sentencepiece" and self.prefix_space)

    def key(self, text: str) -> bytes:
        """The bytes a symbol matches in the prepared text."""
        if self.marker is not None:  # sentencepiece, or wordpiece with a word-start marker
            return text.replace(self.marker, " ").encode("utf-8")
        if self.scheme == "byte_level":
            if _OUTSIDE_BYTE_ALPHABET.search(text):
                return text.encode("utf-8")  # an added token spelt in plain text
            return text.translate(_BYTE_LEVEL_TRANSLATE).encode("latin-1")
        cont = self.continuation or ""
        if cont and text.startswith(cont) and len(text) > len(cont):
            return text[len(cont) :].encode("utf-8")
        return b" " + text.encode("utf-8")

    def prepare(self, text: str) -> str:
        """Text (already normalized) as the symbols' keys expect it."""
        if self.scheme != "wordpiece":
            return text
        if self.lowercase:
            text = text.translate(_LOWER)
        if self.strip_accents:
            text = "".join(
                c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) != "Mn"
            )
        return text.translate(_WORD_SPLIT)


def _is_cjk(o: int) -> bool:
    return (
        0x4E00 <= o <= 0x9FFF
        or 0x3400 <= o <= 0x4DBF
        or 0x20000 <= o <= 0x2A6DF
        or 0x2A700 <= o <= 0x2CEAF
        or 0xF900 <= o <= 0xFAFF
        or 0x2F800 <= o <= 0x2FA1F
    )


class _Lower(dict[int, str]):
    """str.translate table lower-casing one character at a time (no context: the same result
    whatever the chunking, as llama.cpp's per-code-point lower-casing)."""

    def __missing__(self, o: int) -> str:
        low = chr(o).lower()
        self[o] = low
        return low


class _WordSplit(dict[int, str]):
    """str.translate table for WordPiece: white space becomes one space, punctuation and CJK
    characters stand alone between spaces (BERT's basic tokenizer)."""

    def __missing__(self, o: int) -> str:
        c = chr(o)
        if c.isspace():
            out = " "
        elif (
            (0x21 <= o <= 0x2F or 0x3A <= o <= 0x40 or 0x5B <= o <= 0x60 or 0x7B <= o <= 0x7E)
            or unicodedata.category(c).startswith("P")
            or _is_cjk(o)
        ):
            out = f" {c} "
        else:
            out = c
        self[o] = out
        return out


_LOWER = _Lower()
_WORD_SPLIT = _WordSplit()


def parse_space_marking(value: Any) -> tuple[SpaceMarking | None, str | None]:
    """(the marking, None) or (None, what is wrong)."""
    if not isinstance(value, dict):
        return None, f"space_marking must be an object, got {type(value).__name__}"
    scheme = value.get("scheme")
    if scheme not in SCHEMES:
        return None, f"space_marking scheme {scheme!r:.40} is not one of {', '.join(SCHEMES)}"
    allowed = {
        "sentencepiece": {"scheme", "marker", "prefix_space"},
        "byte_level": {"scheme"},
        "wordpiece": {"scheme", "marker", "continuation", "lowercase", "strip_accents"},
    }[scheme]
    extra = sorted(set(value) - allowed)
    if extra:
        return None, f"space_marking field(s) {', '.join(extra)} are not defined for {scheme}"
    fields: dict[str, Any] = {}
    for key in sorted(allowed - {"scheme"}):
        if key not in value:
            continue
        got = value[key]
        if key in ("prefix_space", "lowercase", "strip_accents"):
            if not isinstance(got, bool):
                return None, f"space_marking {key} must be true or false"
        elif not isinstance(got, str) or not got or any(c.isspace() for c in got):
            return None, f"space_marking {key} must be a non-empty string without spaces"
        elif key == "marker" and len(got) != 1:
            return None, "space_marking marker must be one character"
        fields[key] = got
    if scheme == "sentencepiece":
        fields.setdefault("marker", SPM_MARKER)
    if scheme == "wordpiece" and ("marker" in fields) == ("continuation" in fields):
        return None, "space_marking wordpiece needs exactly one of marker and continuation"
    return SpaceMarking(scheme, **fields), None


# The fields of a SymbolMap that define it (equality and hash); `extra` (name, description)
# does not.
_MAP_FIELDS = (
    "vocab_size",
    "unk_id",
    "pad_id",
    "byte_fallback",
    "byte_base_id",
    "normalization",
    "symbols",
    "eos_id",
    "version",
    "space_marking",
    "specials",
)


class SymbolMap:
    """A checked symbol map. `symbols` is sorted by id. Frozen, compared and hashed by its
    defining fields (not `extra`). A plain class rather than a dataclass: importing
    `dataclasses` (with `inspect`) and building the class took 10-20 ms of every `tokenize pi`
    command's start (docs/architecture.md, rule 13); its `symbols` can be loaded on first use
    (`deferred`), which a slotted record cannot do."""

    vocab_size: int
    unk_id: int
    pad_id: int
    byte_fallback: bool
    byte_base_id: int | None
    normalization: str
    symbols: tuple[tuple[int, str], ...]
    eos_id: int | None
    version: int
    extra: dict[str, Any]
    space_marking: SpaceMarking | None
    specials: frozenset[int]  # symbol ids listed but never matched

    def __init__(
        self,
        vocab_size: int,
        unk_id: int,
        pad_id: int,
        byte_fallback: bool,
        byte_base_id: int | None,
        normalization: str,
        symbols: tuple[tuple[int, str], ...],
        eos_id: int | None = None,
        version: int = VERSION,
        extra: dict[str, Any] | None = None,
        space_marking: SpaceMarking | None = None,
        specials: frozenset[int] = frozenset(),
    ) -> None:
        put = self.__dict__
        put["vocab_size"] = vocab_size
        put["unk_id"] = unk_id
        put["pad_id"] = pad_id
        put["byte_fallback"] = byte_fallback
        put["byte_base_id"] = byte_base_id
        put["normalization"] = normalization
        put["symbols"] = symbols
        put["eos_id"] = eos_id
        put["version"] = version
        put["extra"] = {} if extra is None else extra
        put["space_marking"] = space_marking
        put["specials"] = specials

    def _values(self) -> tuple[Any, ...]:
        return tuple([getattr(self, name) for name in _MAP_FIELDS])

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, SymbolMap)
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        shown = ", ".join(
            f"{name}=<{len(self.symbols):,} symbols>"
            if name == "symbols"
            else f"{name}={getattr(self, name)!r}"
            for name in _MAP_FIELDS
        )
        return f"SymbolMap({shown})"

    def replace(self, **changes: Any) -> SymbolMap:
        """A copy with `changes` (field name -> value); `extra` is kept unless given."""
        names = (*_MAP_FIELDS, "extra")
        unknown = set(changes) - set(names)
        if unknown:
            raise TypeError(f"SymbolMap has no field {', '.join(sorted(unknown))}")
        return SymbolMap(**{name: changes.get(name, getattr(self, name)) for name in names})

    def __setattr__(self, name: str, value: Any) -> NoReturn:
        raise AttributeError(f"cannot assign to field {name!r} of a SymbolMap")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError(f"cannot delete field {name!r} of a SymbolMap")

    @classmethod
    def deferred(
        cls, load_symbols: Callable[[], tuple[tuple[int, str], ...]], **fields: Any
    ) -> SymbolMap:
        """A map whose `symbols` are produced by `load_symbols` on first use (the map cache:
        encoding with a compiled trie never needs them). Every other field is given."""
        smap = cls.__new__(cls)
        for name, value in fields.items():
            object.__setattr__(smap, name, value)
        object.__setattr__(smap, "_load_symbols", load_symbols)
        return smap

    def __getstate__(self) -> dict[str, Any]:
        # A deferred map pickles with its symbols loaded (its loader is a closure).
        state = dict(self.__dict__)
        if state.pop("_load_symbols", None) is not None:
            state["symbols"] = self.symbols
        return state

    if not TYPE_CHECKING:  # (mypy keeps checking every other attribute name)

        def __getattr__(self, name: str) -> Any:
            # Reached only when `symbols` is not set yet: a deferred map loads it now.
            load = self.__dict__.get("_load_symbols")
            if name != "symbols" or load is None:
                raise AttributeError(name)
            value = load()
            object.__setattr__(self, "symbols", value)
            return value

    def canonical(self) -> dict[str, Any]:
        """The fields that define the tokenizer, in the canonical form that is hashed. The
        extension fields appear only when used, so maps without them hash as before."""
        doc = self.canonical_head()
        doc["symbols"] = [self._entry(i, t) for i, t in self.symbols]
        return doc

    def _entry(self, i: int, t: str) -> dict[str, Any]:
        if i in self.specials:
            return {"id": i, "text": t, "special": True}
        return {"id": i, "text": t}

    def key(self, text: str) -> bytes:
        """The bytes a symbol's text matches (its UTF-8, unless space_marking says otherwise)."""
        if self.space_marking is None:
            return text.encode("utf-8")
        return self.space_marking.key(text)

    def canonical_bytes(self) -> bytes:
        """`json.dumps(canonical(), sort_keys=True, separators=(",", ":"),
        ensure_ascii=False)`, with the symbols array written directly (a test checks the two
        agree): for a 262,144-symbol map that is several times faster and smaller in memory
        than building its dicts."""
        return b"".join(self._canonical_pieces())

    def _canonical_pieces(self) -> Iterator[bytes]:
        from json.encoder import encode_basestring

        head = self.canonical_head()
        head["symbols"] = []
        text = json.dumps(head, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        marker = '"symbols":[]'
        at = text.index(marker) + len(marker) - 1
        yield text[:at].encode("utf-8")
        symbols = self.symbols
        for start in range(0, len(symbols), BATCH):
            batch = symbols[start : start + BATCH]
            texts = list(map(encode_basestring, [t for _, t in batch]))
            items = [f'{{"id":{i},"text":{e}}}' for (i, _), e in zip(batch, texts, strict=True)]
            for k in self._special_positions(batch):
                items[k] = f'{{"id":{batch[k][0]},"special":true,"text":{texts[k]}}}'
            yield (("," if start else "") + ",".join(items)).encode("utf-8")
        yield text[at:].encode("utf-8")

    def _special_positions(self, batch: tuple[tuple[int, str], ...]) -> list[int]:
        if not self.specials:
            return []
        specials = self.specials
        return [k for k, (i, _) in enumerate(batch) if i in specials]

    def canonical_head(self) -> dict[str, Any]:
        """The canonical fields without `symbols`."""
        doc: dict[str, Any] = {
            "version": self.version,
            "vocab_size": self.vocab_size,
            "unk_id": self.unk_id,
            "pad_id": self.pad_id,
            "eos_id": self.eos_id,
            "byte_fallback": self.byte_fallback,
            "byte_base_id": self.byte_base_id if self.byte_fallback else None,
            "normalization": self.normalization,
        }
        if self.space_marking is not None:
            doc["space_marking"] = self.space_marking.to_json()
        return doc

    def canonical_hash(self) -> str:
        """`sha256:` + hex digest of the canonical JSON (docs/formats/pi-symbol-map.md)."""
        known: str | None = self.__dict__.get("_canonical_hash")
        if known is not None:
            return known
        import hashlib  # here: OpenSSL's start is not paid by an encode with a cached map

        h = hashlib.sha256()
        for piece in self._canonical_pieces():
            h.update(piece)
        value = "sha256:" + h.hexdigest()
        self.remember_hash(value)
        return value

    def remember_hash(self, value: str) -> None:
        """Keep the canonical hash (computed once; the map cache stores it)."""
        object.__setattr__(self, "_canonical_hash", value)

    @property
    def max_symbol_bytes(self) -> int:
        return max((len(t.encode("utf-8")) for _, t in self.symbols), default=1)

    def special_ids(self) -> dict[str, int]:
        out = {"unk_id": self.unk_id, "pad_id": self.pad_id}
        if self.eos_id is not None:
            out["eos_id"] = self.eos_id
        return out

    def to_json_bytes(self) -> bytes:
        """The map as a file: the canonical fields, one symbol per line (deterministic)."""
        from json.encoder import encode_basestring

        canon = self.canonical_head()
        order = [*list(canon)[:8], "space_marking"]  # the file's key order: symbols last
        head = {k: canon[k] for k in order if canon.get(k) is not None}
        lines = ["{"]
        for key, value in head.items():
            lines.append(f"  {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)},")
        lines.append('  "symbols": [\n')
        out = bytearray("\n".join(lines).encode("utf-8"))
        symbols = self.symbols
        for start in range(0, len(symbols), BATCH):  # batches: memory stays ~ the output
            batch = symbols[start : start + BATCH]
            texts = list(map(encode_basestring, [t for _, t in batch]))
            lines = [
                f'    {{"id": {i}, "text": {e}}},' for (i, _), e in zip(batch, texts, strict=True)
            ]
            for k in self._special_positions(batch):
                lines[k] = f'    {{"id": {batch[k][0]}, "text": {texts[k]}, "special": true}},'
            if start + BATCH >= len(symbols) and lines:
                lines[-1] = lines[-1][:-1]  # no comma after the last symbol
            out += ("\n".join(lines) + "\n").encode("utf-8")
        out += b"  ]\n}\n"
        return bytes(out)


def _is_int(v: Any) -> bool:
    return type(v) is int


def _field_error(name: str, want: str, got: Any) -> Finding:
    return finding(
        PI_FIELD, f"{name} must be {want}, got {type(got).__name__} {got!r:.40}", field=name
    )


def check_map(raw: bytes) -> tuple[SymbolMap | None, list[Finding]]:
    """Parse and check a symbol map. Returns the map (None when it cannot be used) and findings.

    Every check of spec section 3.1 is a finding: ids inside [0, vocab_size), unique ids,
    unique non-empty texts, unk/pad/eos in range, the 256 byte ids inside the vocabulary and
    clear of symbol ids when byte_fallback is on, a known normalization (case-insensitive).
    """
    out: list[Finding] = []
    if len(raw) > MAX_MAP_BYTES:
        return None, [finding(PI_JSON, f"symbol map is {len(raw)} bytes, limit {MAX_MAP_BYTES}")]
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        return None, [finding(PI_JSON, f"not UTF-8: {exc.reason}", offset=exc.start)]
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        offset = len(text[: exc.pos].encode("utf-8"))
        return None, [finding(PI_JSON, f"not valid JSON: {exc.msg}", offset=offset)]
    except RecursionError:
        return None, [finding(PI_JSON, "JSON nested too deeply")]
    if not isinstance(doc, dict):
        return None, [finding(PI_JSON, f"top level is a {type(doc).__name__}, not an object")]
    for key in REQUIRED:
        if key not in doc:
            out.append(finding(PI_FIELD, f"required field {key!r} is missing", field=key))
    for key in sorted(set(doc) - KNOWN_KEYS):
        out.append(finding(PI_UNKNOWN_KEY, f"unknown key {key!r} is ignored", field=key))
    if any(f.code == PI_FIELD for f in out):
        return None, out

    version = doc["version"]
    if not _is_int(version):
        out.append(_field_error("version", "an integer", version))
    elif version != VERSION:
        out.append(finding(PI_VERSION, f"version {version} is not supported", field="version"))
    vocab = doc["vocab_size"]
    usable = True
    if not _is_int(vocab):
        out.append(_field_error("vocab_size", "an integer", vocab))
        usable = False
    elif not 1 <= vocab <= MAX_VOCAB:
        out.append(
            finding(
                PI_VOCAB_SIZE, f"vocab_size {vocab} is not in [1, {MAX_VOCAB}]", field="vocab_size"
            )
        )
        usable = False
    norm = doc["normalization"]
    if not isinstance(norm, str):
        out.append(_field_error("normalization", "a string", norm))
        usable = False
    elif norm.lower() not in NORMALIZATIONS:
        out.append(
            finding(
                PI_NORMALIZATION,
                f"normalization {norm!r} is not one of {', '.join(NORMALIZATIONS)}",
                field="normalization",
            )
        )
        usable = False
    byte_fallback = doc.get("byte_fallback", False)
    if not isinstance(byte_fallback, bool):
        out.append(_field_error("byte_fallback", "true or false", byte_fallback))
        usable = False
        byte_fallback = False
    base = doc.get("byte_base_id")
    if byte_fallback and base is None:
        out.append(
            finding(
                PI_FIELD, "byte_fallback is true but byte_base_id is missing", field="byte_base_id"
            )
        )
        usable = False
    elif base is not None and not _is_int(base):
        out.append(_field_error("byte_base_id", "an integer", base))
        usable = False
        base = None
    specials_ids: dict[str, int] = {}
    for key in ("unk_id", "pad_id", "eos_id"):
        if key not in doc or (key == "eos_id" and doc[key] is None):
            continue
        value = doc[key]
        if not _is_int(value):
            out.append(_field_error(key, "an integer", value))
            usable = False
            continue
        specials_ids[key] = value
        if _is_int(vocab) and not 0 <= value < vocab:
            out.append(
                finding(PI_SPECIAL_RANGE, f"{key} {value} is outside [0, {vocab})", field=key)
            )
            usable = False
    symbols_raw = doc["symbols"]
    if not isinstance(symbols_raw, list):
        out.append(_field_error("symbols", "a list", symbols_raw))
        return None, out
    if _is_int(vocab) and len(symbols_raw) > vocab:
        out.append(
            finding(
                PI_ID_RANGE,
                f"{len(symbols_raw)} symbols cannot have distinct ids below vocab_size {vocab}",
                field="symbols",
            )
        )
    marking: SpaceMarking | None = None
    if "space_marking" in doc and doc["space_marking"] is not None:
        marking, why = parse_space_marking(doc["space_marking"])
        if why is not None:
            out.append(finding(PI_SPACE_MARKING, why, field="space_marking"))
            usable = False
    symbols: list[tuple[int, str]] = []
    specials: set[int] = set()
    ids: dict[int, int] = {}
    texts: dict[bytes, int] = {}
    form = norm.lower() if isinstance(norm, str) else "none"
    for n, entry in enumerate(symbols_raw):
        where = f"symbols[{n}]"
        if not isinstance(entry, dict) or "id" not in entry or "text" not in entry:
            out.append(
                finding(PI_FIELD, f"{where} must be an object with id and text", field=where)
            )
            usable = False
            continue
        sid, stext = entry["id"], entry["text"]
        special = entry.get("special", False)
        if not _is_int(sid):
            out.append(_field_error(f"{where}.id", "an integer", sid))
            usable = False
            continue
        if not isinstance(stext, str):
            out.append(_field_error(f"{where}.text", "a string", stext))
            usable = False
            continue
        if not isinstance(special, bool):
            out.append(_field_error(f"{where}.special", "true or false", special))
            usable = False
            continue
        if _is_int(vocab) and not 0 <= sid < vocab:
            out.append(
                finding(PI_ID_RANGE, f"{where} id {sid} is outside [0, {vocab})", field=where)
            )
            usable = False
        if sid in ids:
            out.append(
                finding(
                    PI_DUP_ID,
                    f"{where} id {sid} is also the id of symbols[{ids[sid]}]",
                    field=where,
                )
            )
            usable = False
        else:
            ids[sid] = n
        try:
            stext.encode("utf-8")
        except UnicodeEncodeError:
            out.append(
                finding(PI_FIELD, f"{where} text holds a lone surrogate (not UTF-8)", field=where)
            )
            usable = False
            continue
        if special:
            # Listed for its id and text, never matched: the matching rules do not apply.
            specials.add(sid)
            symbols.append((sid, stext))
            continue
        if stext == "":
            out.append(finding(PI_EMPTY_TEXT, f"{where} (id {sid}) has an empty text", field=where))
            usable = False
            continue
        matched = marking.key(stext) if marking is not None else stext.encode("utf-8")
        nbytes = len(matched)
        if nbytes > MAX_SYMBOL_BYTES:
            out.append(
                finding(
                    PI_SYMBOL_LONG,
                    f"{where} (id {sid}) text is {nbytes} bytes, limit {MAX_SYMBOL_BYTES}",
                    field=where,
                )
            )
            usable = False
        if matched in texts:
            same = "matches the same bytes as" if marking is not None else "has the same text as"
            out.append(
                finding(
                    PI_DUP_TEXT,
                    f"{where} (id {sid}) {same} symbols[{texts[matched]}]",
                    field=where,
                )
            )
            usable = False
        else:
            texts[matched] = n
        if form in NORMALIZATIONS and form != "none" and normalize(stext, form) != stext:
            out.append(
                finding(
                    PI_NOT_NORMALIZED,
                    f"{where} (id {sid}) text {stext!r:.40} is not {form.upper()}-normalized, "
                    "so normalized input never contains it",
                    field=where,
                )
            )
        symbols.append((sid, stext))
    if byte_fallback and _is_int(base) and _is_int(vocab) and base is not None:
        if not (base >= 0 and base + 256 <= vocab):
            out.append(
                finding(
                    PI_BYTE_RANGE,
                    f"byte ids {base}..{base + 255} do not fit in [0, {vocab})",
                    field="byte_base_id",
                )
            )
            usable = False
        clash = sorted(i for i in ids if base <= i < base + 256)
        if clash:
            out.append(
                finding(
                    PI_BYTE_COLLISION,
                    f"{len(clash)} symbol id(s) fall among the byte ids {base}..{base + 255}, "
                    f"first {clash[0]} (symbols[{ids[clash[0]]}])",
                    field=f"symbols[{ids[clash[0]]}]",
                )
            )
            usable = False
    for key, value in specials_ids.items():
        hits = []
        if value in ids and value not in specials:
            hits.append(f"symbol id (symbols[{ids[value]}])")
        if byte_fallback and _is_int(base) and base is not None and base <= value < base + 256:
            hits.append(f"byte id (byte 0x{value - base:02x})")
        if hits:
            out.append(
                finding(
                    PI_SPECIAL_COLLISION, f"{key} {value} is also a {' and '.join(hits)}", field=key
                )
            )
    if not usable or any(f.severity is codes.Severity.ERROR for f in out):
        return None, out
    symbols.sort()
    extra = {k: doc[k] for k in ("name", "description") if k in doc}
    smap = SymbolMap(
        vocab_size=vocab,
        unk_id=specials_ids["unk_id"],
        pad_id=specials_ids.get("pad_id", specials_ids["unk_id"]),
        byte_fallback=byte_fallback,
        byte_base_id=base if byte_fallback else None,
        normalization=form,
        symbols=tuple(symbols),
        eos_id=specials_ids.get("eos_id"),
        extra=extra,
        space_marking=marking,
        specials=frozenset(specials),
    )
    return smap, out


def load_symbol_map(path: str) -> tuple[SymbolMap, bytes]:
    """Read and check a map file; raise the first error as a FormatError. Returns (map, raw)."""
    raw = read_map_bytes(path)
    return check_map_bytes(raw, path), raw


def read_map_bytes(path: str) -> bytes:
    """The bytes of a map file (at most MAX_MAP_BYTES + 1, so check_map can refuse more)."""
    from matrixctl.errors import from_os_error
    from matrixctl.io import open_input_stream

    with open_input_stream(path) as fp:
        try:
            raw: bytes = fp.read(MAX_MAP_BYTES + 1)
        except OSError as exc:
            raise from_os_error(exc, path) from None
    return raw


def check_map_bytes(raw: bytes, path: str) -> SymbolMap:
    """`check_map`, raising its first error as a FormatError naming `path`."""
    from matrixctl.io import display_name

    name = display_name(path)
    smap, findings = check_map(raw)
    errors = [f for f in findings if f.severity is codes.Severity.ERROR]
    if smap is None or errors:
        first = errors[0] if errors else findings[0]
        more = (
            f" (and {len(errors) - 1} more; run `matrixctl verify {name}`)"
            if len(errors) > 1
            else ""
        )
        raise FormatError(
            first.code, first.message + more, path=name, offset=first.offset, field=first.field
        )
    return smap


def default_map_path() -> str:
    """The bundled default symbol map (see tools/build_default_symbols.py)."""
    from matrixctl.package import data_path

    return data_path("pi_symbol_map.json")


NORMALIZE_GAP = 64  # segments to normalize closer than this many characters are merged


def normalize(text: str, form: str) -> str:
    """`unicodedata.normalize`, applied only where it can change something: ASCII is stable
    under every form and a cut before an ASCII character is safe (see `safe_cut`), so only
    runs of non-ASCII characters, each with the character before it, are normalized (the
    kernel finds them). Same result as normalizing the whole text."""
    if form == "none" or text.isascii():
        return text
    upper: Any = form.upper()
    # The kernel finds the runs, calls `normalize` on each and joins the parts (no bytecode per
    # run: a 20 MB text has ~40,000 of them, and this loop is what parallel encoding's threads
    # cannot run at the same time).
    return _pi_kernel.normalize_runs(text, NORMALIZE_GAP, partial(unicodedata.normalize, upper))


# Normalization works on whole strings; a stream is cut only before a character that can never
# interact with what precedes it under NFC/NFKC/NFD/NFKD: an ASCII character (a starter with no
# decomposition that is never the second element of a composition), or a CJK ideograph, Hangul
# syllable or kana letter (likewise). See docs/formats/pi-symbol-map.md, "Streaming".
def _safe_char(c: str) -> bool:
    o = ord(c)
    return (
        o < 0x80
        or 0x3400 <= o <= 0x9FFF
        or 0xAC00 <= o <= 0xD7A3
        or 0x3041 <= o <= 0x3096
        or 0x30A1 <= o <= 0x30FA
    )


SAFE_SCAN = 1 << 16
FORCE_CUT_CHARS = 16 << 20


def safe_cut(text: str) -> int:
    """An index i such that normalize(text[:i]) + normalize(text[i:]) == normalize(text).

    Returns 0 when no safe cut is found near the end (the caller keeps accumulating).
    """
    stop = max(0, len(text) - SAFE_SCAN)
    for i in range(len(text) - 1, stop - 1, -1):
        if _safe_char(text[i]):
            return i
    if len(text) < FORCE_CUT_CHARS:
        return 0
    # Pathological input: 16 Mi characters with no ASCII or CJK character. Cut before a
    # starter with no decomposition outside the Hangul jamo, which is safe for every text
    # outside a few scripts' composition pairs (documented limitation).
    for i in range(len(text) - 1, 0, -1):
        c = text[i]
        if (
            unicodedata.combining(c) == 0
            and unicodedata.decomposition(c) == ""
            and not 0x1100 <= ord(c) <= 0x11FF
        ):
            return i
    return 0


class Tokenizer:
    """Encoder and decoder for one symbol map. Build once; encode many texts.

    Matching and decoding run in the compiled kernel (`matrixctl/_pi_kernel.c`): a byte trie
    of the patterns, walked greedily for the longest pattern at each position, with the GIL
    released. `trie` is a compiled trie of this map (from the cache in
    `matrixctl.tokenizers.pi_cache`); without it the trie is built from the symbols.
    """

    def __init__(self, smap: SymbolMap, trie: Any = None) -> None:
        self.map = smap
        self.marking = smap.space_marking
        self.trie = trie if trie is not None else _pi_kernel.Trie(*self.patterns(smap))
        self.prefix = b" " if self.marking is not None and self.marking.adds_prefix else b""
        self.lookahead: int = self.trie.lookahead
        self.dtype = "uint16" if smap.vocab_size <= 1 << 16 else "uint32"
        self.itemsize = 2 if self.dtype == "uint16" else 4  # every id < vocab_size fits
        self._decode_table: Any = None
        self._keys: Any = None

    @staticmethod
    def patterns(smap: SymbolMap) -> tuple[list[bytes], list[int]]:
        """The matcher's patterns and the id each gives (-1: none). Every single byte that is
        not itself a symbol is a pattern too (its byte token; without byte fallback `unk_id`
        for a character's first byte and nothing for a continuation byte), so a match starts
        at every position and the fallback needs no slow path."""
        patterns: list[bytes] = []
        ids: list[int] = []
        specials = smap.specials
        for sid, text in smap.symbols:
            if sid in specials:
                continue
            patterns.append(smap.key(text))
            ids.append(sid)
        have = set(patterns)
        marking = smap.space_marking
        wordpiece = marking is not None and marking.scheme == "wordpiece"
        for b in range(256):
            one = bytes([b])
            if one in have:
                continue
            patterns.append(one)
            if wordpiece and b == 0x20:
                ids.append(-1)  # a word boundary that starts no word: dropped
            elif smap.byte_fallback:
                assert smap.byte_base_id is not None
                ids.append(smap.byte_base_id + b)
            elif b < 0x80 or b >= 0xC0:
                ids.append(smap.unk_id)  # a character's first byte: one unk per character
            else:
                ids.append(-1)  # continuation byte of an uncovered character: dropped
        return patterns, ids

    # Encoding ---------------------------------------------------------------------------------

    def match(self, data: bytes, limit: int | None = None) -> tuple[np.ndarray, int]:
        """Ids of the greedy leftmost-longest tiling of `data`, stopping before the first token
        that starts after `limit` (default: the whole of `data`), and the bytes consumed."""
        import numpy as np

        raw, used = self.trie.match(data, len(data) if limit is None else limit, 8)
        return np.frombuffer(raw, dtype=np.int64), used

    def encode_normalized_bytes(self, data: bytes) -> np.ndarray:
        """Token ids of already-normalized UTF-8 text."""
        return self.match(data)[0]

    def prepare(self, text: str) -> bytes:
        """Normalized text as the bytes the matcher matches (space marking applied, without
        the document's prefix space)."""
        text = normalize(text, self.map.normalization)
        if self.marking is not None:
            text = self.marking.prepare(text)
        return text.encode("utf-8")

    def encode(self, text: str) -> np.ndarray:
        """Token ids (int64) of `text`: normalize, then greedy leftmost-longest matching."""
        data = self.prepare(text)
        return self.encode_normalized_bytes(self.prefix + data if data else data)

    def spans(self, text: str) -> tuple[bytes, list[tuple[int, int, int]]]:
        """The bytes `encode` matches (the document's prefix included) and each token of
        `encode(text)` as (id, start, end) in them; an unk token spans its whole character."""
        import numpy as np

        data = self.prepare(text)
        data = self.prefix + data if data else data
        triples = np.frombuffer(self.trie.spans(data), dtype=np.int64).reshape(-1, 3).tolist()
        out: list[tuple[int, int, int]] = []
        for sid, pos, end in triples:
            if sid >= 0:
                out.append((sid, pos, end))
            elif out and out[-1][2] == pos and data[pos] & 0xC0 == 0x80:
                out[-1] = (out[-1][0], out[-1][1], end)  # a continuation byte of an unk
        return data, out

    def stream(self) -> StreamEncoder:
        return StreamEncoder(self)

    # Decoding ---------------------------------------------------------------------------------

    SPARSE = 1 << 22  # above this many ids, the decode table is indexed through `_keys`

    def _table(self) -> Any:
        """The kernel's decode table: the bytes of every id that has text."""
        if self._decode_table is None:
            import numpy as np

            smap = self.map
            table: dict[int, bytes] = {smap.unk_id: REPLACEMENT.encode("utf-8")}
            table.setdefault(smap.pad_id, b"")
            if smap.eos_id is not None:
                table[smap.eos_id] = b""
            if smap.byte_fallback and smap.byte_base_id is not None:
                for b in range(256):
                    table[smap.byte_base_id + b] = bytes([b])
            for sid, text in smap.symbols:
                if sid in smap.specials:
                    table.setdefault(sid, text.encode("utf-8"))
                else:
                    table[sid] = smap.key(text)
            top = max(table) + 1
            if top <= self.SPARSE:
                dense: list[bytes | None] = [None] * top
                for k, v in table.items():
                    dense[k] = v
                self._keys = None
                self._decode_table = _pi_kernel.Table(dense)
            else:  # ids far apart: dense positions of the sorted ids
                keys = sorted(table)
                self._keys = np.array(keys, dtype=np.int64)
                self._decode_table = _pi_kernel.Table([table[k] for k in keys])
        return self._decode_table

    def decode_bytes(self, ids: Any, *, start: int = 0, errors: str = "strict") -> bytes:
        """The bytes of token ids (not yet checked as UTF-8). `start` numbers the first token."""
        import numpy as np

        table = self._table()
        values = np.asarray(ids).reshape(-1)
        if self._keys is not None:
            keys = self._keys
            pos = np.minimum(np.searchsorted(keys, values), keys.size - 1)
            arg = np.where(keys[pos] == values, pos, -1).astype(np.int64)
        elif values.dtype in (np.uint16, np.uint32):
            arg = np.ascontiguousarray(values)
        else:
            arg = np.ascontiguousarray(values, dtype=np.int64)  # no copy for int64 input
        rep = REPLACEMENT.encode("utf-8") if errors != "strict" else None
        data, bad = table.join(arg, arg.dtype.itemsize, rep)
        if bad >= 0 and rep is None:
            raise FormatError(
                PI_DECODE_ID,
                f"token {start + bad} (id {values[bad]}) is not a symbol, byte, unk, pad or eos "
                "id of this map",
                field=f"token[{start + bad}]",
            )
        return bytes(data)

    def decode(self, ids: Any, *, errors: str = "strict") -> str:
        """Text of token ids: the exact inverse of `encode` (up to normalization)."""
        decoder = StreamDecoder(self, errors=errors)
        return decoder.feed(ids) + decoder.finish()


class StreamEncoder:
    """Encode text that arrives in pieces, exactly as if it had arrived whole.

    Two carries: decoded text after the last safe normalization cut, and normalized bytes
    within `lookahead` bytes of the end (a longer symbol could still start there).
    """

    def __init__(self, tok: Tokenizer) -> None:
        self.tok = tok
        self._raw = ""
        self._carry = tok.prefix  # the document's prefix space, if the marking adds one
        self._fresh = True  # no text yet: an empty document gets no prefix token

    def feed(self, text: str) -> np.ndarray:
        """Ids (int64) of the tokens `text` completes."""
        import numpy as np

        return np.frombuffer(self._feed(text, 8), dtype=np.int64)

    def finish(self) -> np.ndarray:
        """Ids (int64) of the remaining tokens."""
        import numpy as np

        return np.frombuffer(self._finish(8), dtype=np.int64)

    def feed_bytes(self, text: str) -> bytes:
        """`feed` as the bytes of the ids in the tokenizer's dtype (no numpy needed)."""
        return self._feed(text, self.tok.itemsize)

    def finish_bytes(self) -> bytes:
        """`finish` as the bytes of the ids in the tokenizer's dtype."""
        return self._finish(self.tok.itemsize)

    def _feed(self, text: str, itemsize: int) -> bytes:
        pending = self._raw + text if self._raw else text
        cut = safe_cut(pending)
        if cut == 0:
            self._raw = pending
            return b""
        self._raw = pending[cut:]
        data = self.tok.prepare(pending[:cut])
        self._fresh = self._fresh and not data
        return self._tokenize(data, itemsize, final=False)

    def _finish(self, itemsize: int) -> bytes:
        data = self.tok.prepare(self._raw)
        self._raw = ""
        if self._fresh and not data:
            self._carry = b""
        return self._tokenize(data, itemsize, final=True)

    def _tokenize(self, data: bytes, itemsize: int, *, final: bool) -> bytes:
        buf = self._carry + data if self._carry else data
        if not buf:
            return b""
        if final:
            self._carry = b""
            return self.tok.trie.match(buf, len(buf), itemsize)[0]
        # Tokens starting at or before `limit` cannot change with more input.
        ids, used = self.tok.trie.match(buf, len(buf) - self.tok.lookahead, itemsize)
        self._carry = buf[used:]
        return ids


class StreamDecoder:
    """Decode token ids arriving in pieces; UTF-8 sequences may span pieces."""

    def __init__(self, tok: Tokenizer, *, errors: str = "strict") -> None:
        if errors not in ("strict", "replace"):
            raise UsageError(f"errors must be strict or replace, got {errors!r}")
        self.tok = tok
        self.errors = errors
        self.tokens = 0
        self._pending = b""
        self._pending_tokens: list[int] = []  # token index of each pending byte's token
        self._at_start = True  # a document starts: its prefix space (if any) is dropped

    def feed(self, ids: Any) -> str:
        import numpy as np

        ids = np.asarray(ids).reshape(-1)
        if self.tok.prefix:
            data = self._decode_dropping_prefixes(ids)
        else:
            data = self.tok.decode_bytes(ids, start=self.tokens, errors=self.errors)
        first = self.tokens
        self.tokens += int(ids.size)
        buf = self._pending + data if self._pending else data
        # Hold back an incomplete UTF-8 sequence at the end (at most 3 bytes).
        cut = len(buf)
        for back in range(1, min(4, len(buf)) + 1):
            b = buf[-back]
            if b & 0xC0 == 0x80:
                continue
            need = (
                2 if b & 0xE0 == 0xC0 else 3 if b & 0xF0 == 0xE0 else 4 if b & 0xF8 == 0xF0 else 1
            )
            if need > back:
                cut = len(buf) - back
            break
        head = memoryview(buf)[:cut] if cut < len(buf) else buf
        self._pending = buf[cut:]
        return self._text(head, ids, first, len(buf) - len(data))

    def finish(self) -> str:
        head, self._pending = self._pending, b""
        return self._text(head, None, self.tokens, 0)

    def _decode_dropping_prefixes(self, ids: Any) -> bytes:
        """Decode, dropping the space the encoder put before each document: the first byte of
        a document's first non-empty token, if it is a space. Documents start at the
        beginning of the stream and after every eos_id token."""
        import numpy as np

        tok, errors, first = self.tok, self.errors, self.tokens
        eos = tok.map.eos_id
        starts = [0] if self._at_start else []
        if eos is not None:
            starts += (np.flatnonzero(ids == eos) + 1).tolist()
        n = int(ids.size)
        self._at_start = False
        out: list[bytes] = []
        done = 0  # tokens decoded into `out` so far
        try:
            for begin in starts:
                j = max(begin, done)
                part = b""
                while j < n and ids[j] != eos:
                    part = tok.decode_bytes(ids[j : j + 1], start=first + j, errors=errors)
                    if part:
                        break
                    j += 1  # pad tokens decode to nothing
                if j >= n:
                    self._at_start = True  # the document's first text is in a later piece
                    break
                if ids[j] != eos and part[:1] == b" ":
                    out.append(tok.decode_bytes(ids[done:j], start=first + done, errors=errors))
                    out.append(part[1:])
                    done = j + 1
        except FormatError:
            tok.decode_bytes(ids, start=first, errors=errors)  # names the first bad token
            raise
        out.append(tok.decode_bytes(ids[done:], start=first + done, errors=errors))
        return b"".join(out)

    def _text(self, head: bytes | memoryview, ids: Any, first: int, carried: int) -> str:
        try:
            return str(head, "utf-8", self.errors)
        except UnicodeDecodeError as exc:
            index = self._token_at(ids, first, exc.start - carried)
            raise FormatError(
                PI_DECODE_UTF8,
                f"byte tokens do not form valid UTF-8 at token {index}: {exc.reason}",
                field=f"token[{index}]",
                hint="decode with --errors replace to substitute U+FFFD",
            ) from None

    def _token_at(self, ids: Any, first: int, byte_pos: int) -> int:
        """The token whose bytes hold position `byte_pos` of this piece's decoded bytes."""
        import numpy as np

        if ids is None or byte_pos < 0:
            return max(0, first - 1)
        lens = np.array(
            [len(self.tok.decode_bytes(ids[i : i + 1], errors="replace")) for i in range(ids.size)]
        )
        ends = np.cumsum(lens)
        return first + int(np.searchsorted(ends, byte_pos, side="right"))


def iter_text(fp: Any, name: str, chunk: int = 1 << 20) -> Iterator[str]:
    """Decode a UTF-8 byte stream in pieces; an invalid byte is PI_TEXT_UTF8 with its offset."""
    import codecs

    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    consumed = 0
    first = True
    while True:
        data = fp.read(chunk)
        final = not data
        try:
            buffered = len(decoder.getstate()[0])
            text = decoder.decode(data, final=final)
        except UnicodeDecodeError as exc:
            offset = consumed - buffered + exc.start
            raise FormatError(
                PI_TEXT_UTF8,
                f"not valid UTF-8 ({exc.reason})",
                path=name,
                offset=offset,
            ) from None
        consumed += len(data)
        if first and text:
            first = False
            if text[0] == "\ufeff":
                text = text[1:]
        if text:
            yield text
        if final:
            return
