"""What every input kind of `ingest docs` shares: the options, counters and codes of
extraction, the hashing reader of a source as stored, UTF-8 decoding, and the one spelling of
each per-document error.

A document is `(item, pieces)`: `item` locates it in its source (a JSON Lines line number, a
JSON array index, a row number, 0 otherwise) and `pieces` is an iterator of text pieces, so a
5 GB text file streams through with bounded memory.
"""

from __future__ import annotations

import codecs
import hashlib
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

from matrixctl import codes
from matrixctl.errors import FormatError

G = "ingest"
INGEST_BINARY = codes.define(
    "INGEST_BINARY", "A named source file is binary (a NUL byte in its first 8 KiB).", group=G
)
INGEST_UTF8 = codes.define(
    "INGEST_UTF8",
    "A source file is not valid UTF-8 (the error names the file and byte offset), or a JSON "
    "or JSON Lines text holds an escape of a lone surrogate (`\\ud800`), which is no character.",
    group=G,
)
INGEST_JSON = codes.define("INGEST_JSON", "A JSON or JSON Lines source is not valid JSON.", group=G)
INGEST_TOO_LARGE = codes.define(
    "INGEST_TOO_LARGE",
    "A document is larger than --max-doc-size (default 256 MiB): an HTML or JSON source "
    "(parsed whole), a JSON Lines line or a Parquet/Arrow cell.",
    group=G,
)
INGEST_COLUMNAR = codes.define(
    "INGEST_COLUMNAR",
    "A Parquet or Arrow input cannot be read: damaged, no such column, pyarrow missing, or "
    "given compressed or on stdin.",
    group=G,
)
INGEST_TEXT_FIELD = codes.define(
    "INGEST_TEXT_FIELD",
    "A JSON document lacks the text field (or it is not a string) under --missing-field error; "
    "a Parquet/Arrow input has no such column, or its type is not text (the error names it).",
    group=G,
)

MAX_WHOLE = 256 << 20
SNIFF = 8192
PIECE = 1 << 20

Doc = tuple[int, Iterator[str]]
Text = tuple[int, "str | bytes | memoryview"]  # a document of one text: (item, text)


@dataclass(frozen=True)
class Options:
    text_field: str = "text"
    missing_field: str = "skip"  # skip | error
    encoding_errors: str = "error"  # error | replace | skip-file
    max_doc: int = MAX_WHOLE  # --max-doc-size in bytes
    input_kind: str = "auto"  # --input-kind: auto (names and bytes) or a kind for every input


@dataclass
class Counters:
    skipped_records: int = 0
    lines: int = 0  # JSON Lines: lines read


def too_long(name: str, line: int, offset: int, max_doc: int) -> FormatError:
    """The one error for a line (a JSON Lines record) longer than --max-doc-size."""
    return FormatError(
        INGEST_TOO_LARGE,
        f"line {line} is longer than --max-doc-size ({max_doc:,} bytes)",
        path=name,
        offset=offset,
        field=f"line {line}",
    )


class HashingReader:
    """Read a file while computing its SHA-256 and counting bytes (as stored); `on_bytes`, when
    given, hears the count after every read (progress within a file)."""

    def __init__(self, fp: BinaryIO, on_bytes: Callable[[int], None] | None = None) -> None:
        self.fp = fp
        self.sha = hashlib.sha256()
        self.size = 0
        self.on_bytes = on_bytes

    def read(self, n: int = -1) -> bytes:
        data = self.fp.read(n)
        self.sha.update(data)
        self.size += len(data)
        if self.on_bytes is not None:
            self.on_bytes(self.size)
        return data

    def readline(self, limit: int = -1) -> bytes:
        data = self.fp.readline(limit)
        self.sha.update(data)
        self.size += len(data)
        return data

    def drain(self) -> None:
        while self.read(PIECE):
            pass


def utf8_error(name: str, offset: int, reason: str) -> FormatError:
    return FormatError(
        INGEST_UTF8,
        f"not valid UTF-8 ({reason})",
        path=name,
        offset=offset,
        hint="pass --encoding-errors replace (U+FFFD) or skip-file to go on",
    )


class SkipFile(Exception):
    """Raised by an extractor under --encoding-errors skip-file."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def decode_whole(data: bytes, name: str, opts: Options) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if opts.encoding_errors == "replace":
            text = data.decode("utf-8", "replace")
        elif opts.encoding_errors == "skip-file":
            raise SkipFile(f"not UTF-8 at byte {exc.start}") from None
        else:
            raise utf8_error(name, exc.start, exc.reason) from None
    return text.removeprefix("\ufeff")


def iter_decoded(fp: Any, name: str, opts: Options, offset: int = 0) -> Iterator[str]:
    """Stream UTF-8 text in pieces with CRLF and lone CR turned into LF; BOM dropped. `offset`:
    where `fp` starts in its file (a piece of it), for the offsets errors give."""
    errors = "replace" if opts.encoding_errors == "replace" else "strict"
    decoder = codecs.getincrementaldecoder("utf-8")(errors)
    consumed = offset
    first = True
    held_cr = False
    while True:
        data = fp.read(PIECE)
        final = not data
        buffered = len(decoder.getstate()[0])
        try:
            text = decoder.decode(data, final=final)
        except UnicodeDecodeError as exc:
            offset = consumed - buffered + exc.start
            if opts.encoding_errors == "skip-file":
                raise SkipFile(f"not UTF-8 at byte {offset}") from None
            raise utf8_error(name, offset, exc.reason) from None
        consumed += len(data)
        if first and text:
            first = False
            text = text.removeprefix("\ufeff")
        if held_cr:
            text = "\r" + text
            held_cr = False
        if not final and text.endswith("\r"):
            text = text[:-1]
            held_cr = True
        if "\r" in text:
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        if text:
            yield text
        if final:
            return


def crlf(text: str) -> str:
    """CRLF line ends as LF (the scan for a CR is much cheaper than a replace that finds none)."""
    return text.replace("\r\n", "\n") if "\r" in text else text


def read_whole(fp: Any, name: str, what: str, limit: int = MAX_WHOLE) -> bytes:
    data = fp.read(limit + 1)
    if len(data) > limit:
        raise FormatError(
            INGEST_TOO_LARGE,
            f"{what} source is larger than --max-doc-size ({limit:,} bytes; parsed whole)",
            path=name,
            hint="split it, use JSON Lines for large JSON data sets, or raise --max-doc-size",
        )
    return bytes(data)


def field_value(obj: Any, field: str) -> Any:
    """The value `--text-field` names in a JSON object: the key that is exactly `field`
    (dots and all) when the object has one, else, for `a.b`, the key `b` of the object under
    the key `a` (a path of any depth, as a Parquet struct column is read); None when the
    path is not there."""
    if not isinstance(obj, dict):
        return None
    if field in obj or "." not in field:
        return obj.get(field)
    for key in field.split("."):
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def text_field(obj: Any, opts: Options, name: str, where: str, counters: Counters) -> str | None:
    value = field_value(obj, opts.text_field)
    if isinstance(value, str):
        return value
    if opts.missing_field == "error":
        raise FormatError(
            INGEST_TEXT_FIELD,
            f"{where} has no string field {opts.text_field!r}",
            path=name,
            field=opts.text_field,
        )
    counters.skipped_records += 1
    return None


_SURROGATE = re.compile("[\ud800-\udfff]")


def no_surrogates(value: str, opts: Options, name: str, where: str, offset: int | None) -> str:
    """A JSON text as it may be tokenized: a lone surrogate (`"\\ud800"`, a cut escape of an
    emoji, common in web crawls) is not a character and has no UTF-8. Under
    `--encoding-errors replace` each becomes U+FFFD; under `skip-file` the file is skipped;
    else it is INGEST_UTF8 naming the record (`where`) and the offset of its line."""
    if value.isascii():
        return value
    found = _SURROGATE.search(value)
    if found is None:
        return value
    if opts.encoding_errors == "replace":
        return _SURROGATE.sub("\ufffd", value)
    reason = f"{where}: the text holds a lone surrogate (\\u{ord(found.group()):04x}), no character"
    if opts.encoding_errors == "skip-file":
        raise SkipFile(reason)
    raise FormatError(
        INGEST_UTF8,
        reason,
        path=name,
        offset=offset,
        field=where,
        hint="pass --encoding-errors replace (U+FFFD) or skip-file to go on",
    )


def int_limit() -> int:
    """The most digits the standard library's JSON parser turns into an int (Python's
    int-string limit, 4,300 unless PYTHONINTMAXSTRDIGITS says otherwise; 0 is no limit)."""
    return sys.get_int_max_str_digits()


def too_many_digits(name: str, where: str, offset: int | None) -> FormatError:
    """The one error for a JSON integer longer than Python reads (`int_limit`)."""
    return FormatError(
        INGEST_JSON,
        f"{where} holds an integer of more than {int_limit():,} digits, which is not read",
        path=name,
        offset=offset,
        field=where,
    )


Documents = Callable[[Any, str, Options, Counters], Iterator[Doc]]
Texts = Callable[[Any, str, Options, Counters], Iterator[Text]]
ByPath = Callable[..., Iterator[Text]]
CUTS = ("lines", "text", "row-groups")


@dataclass(frozen=True)
class Kind:
    name: str
    priority: int  # the order of the content sniffs and of the CLI's choices
    names: tuple[str, ...] = ()
    hints: tuple[str, ...] = ()
    magics: tuple[bytes, ...] = ()
    sniff: Callable[[bytes], bool] | None = None  # the head, BOM and leading blanks stripped
    documents: Documents | None = None
    texts: Texts | None = None
    by_path: ByPath | None = None  # a file as stored, not a stream (no compression, no stdin)
    cut: str | None = None
