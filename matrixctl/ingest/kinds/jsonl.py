"""JSON Lines input: one document per line, its text the --text-field of the line's object.

A stream is read line by line (`texts_stream`); a work unit's bytes (whole lines, cut by
`ingest/units.py`) go through the compiled extractor (`texts`). Both give the same texts, line
numbers, offsets, counts and errors.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterator
from typing import Any

from matrixctl.errors import FormatError
from matrixctl.ingest.kinds.base import (
    INGEST_JSON,
    PIECE,
    Counters,
    Doc,
    Kind,
    Options,
    SkipFile,
    crlf,
    no_surrogates,
    text_field,
    too_long,
    too_many_digits,
    utf8_error,
)


def _read_line(fp: Any, limit: int) -> tuple[bytes, bool]:
    """One line and whether it fits in `limit` bytes, read a piece at a time: a longer line
    costs no more memory than `limit` and is never joined (the caller reports it)."""
    raw = fp.readline(min(limit, PIECE))
    if len(raw) < PIECE or raw.endswith(b"\n"):
        return bytes(raw), len(raw) < limit or raw.endswith(b"\n")
    parts = [raw]
    size = len(raw)
    while size < limit:
        more = fp.readline(min(PIECE, limit - size))
        if not more:
            break
        parts.append(more)
        size += len(more)
        if more.endswith(b"\n"):
            break
    if size >= limit and not parts[-1].endswith(b"\n"):
        return b"", False
    return b"".join(parts), True


def _fast_loads() -> Callable[[bytes], Any] | None:
    """orjson's parser, or None without it. It takes the line's bytes (it validates the UTF-8
    itself); a line it refuses, for any reason, goes through the standard library's decode
    and parse, which give the error message and offset (or accept what orjson does not: an
    integer beyond 64 bits, NaN, a lone surrogate escape, deep nesting)."""
    try:
        import orjson
    except ImportError:  # pragma: no cover - a declared dependency
        return None
    return orjson.loads


def texts_stream(
    fp: Any, name: str, opts: Options, counters: Counters, line_no: int = 0, offset: int = 0
) -> Iterator[tuple[int, str]]:
    """Each JSON Lines record's text as `(line number, text)`, read line by line from `fp`."""
    first_line = line_no
    errors = "replace" if opts.encoding_errors == "replace" else "strict"
    fast = _fast_loads()
    refused = (ValueError, RecursionError)
    while True:
        raw, fits = _read_line(fp, opts.max_doc + 1)
        if not raw and fits:
            counters.lines = line_no - first_line
            return
        line_no += 1
        if not fits:
            raise too_long(name, line_no, offset, opts.max_doc)
        start = offset
        offset += len(raw)
        if start == 0 and raw.startswith(b"\xef\xbb\xbf"):  # the file's first line
            raw = raw[3:]
            start += 3
        if fast is not None:
            try:
                obj = fast(raw)
            except refused:
                pass
            else:
                value = text_field(obj, opts, name, f"line {line_no}", counters)
                if value is not None:
                    yield line_no, crlf(value)
                continue
        value = _jsonl_slow(raw, start, line_no, name, opts, errors, counters)
        if value is not None:
            yield line_no, value


class TextBuffer:
    """Where `jsonl_texts` writes the texts it yields, reused from call to call: the texts
    are views into it, valid until it is given to `jsonl_texts` again. A buffer for each
    piece cost page faults for every text byte (the pages of a freed buffer went back to the
    system, a quarter of the extractor's time); an anonymous mapping is neither zeroed nor
    touched before the extractor writes into it. A buffer larger than KEEP is not kept (a
    piece with one huge line)."""

    KEEP = 32 << 20

    def __init__(self) -> None:
        self.data: Any = bytearray()

    def at_least(self, size: int) -> Any:
        import mmap

        if len(self.data) >= size:
            return self.data
        # Private: a worker forked after the buffer was made writes its own copy of the pages
        # (an anonymous mapping is shared by default). A little larger than asked: the pieces
        # vary in size, it grows once or twice.
        out = mmap.mmap(-1, size + size // 4, flags=mmap.MAP_PRIVATE)
        if size <= self.KEEP:
            self.data = out
        return out


def texts(
    data: bytes | bytearray,
    name: str,
    opts: Options,
    counters: Counters,
    line_no: int = 0,
    offset: int = 0,
    size: int = -1,
    into: TextBuffer | None = None,
) -> Iterator[tuple[int, str | memoryview]]:
    """`texts_stream` over the first `size` bytes (default: all) of a buffer that holds
    whole lines: a work unit's bytes; the same texts, line numbers, offsets, counts and errors.

    The lines are scanned by the compiled extractor first (`_jsonl_kernel.texts`, GIL
    released): a record that orjson takes with a string text field gives its text unescaped
    to UTF-8 with CRLF as LF, as a memoryview of those bytes in `into` (or in a buffer of
    this call's own), without a dict or a string per record. Every line the extractor leaves
    (an error, a record without the text field, a line too long, anything it is not sure
    of) goes the way of the line reader and gives a str: orjson on a slice of the buffer (no
    copy), then the standard library."""
    from matrixctl import _jsonl_kernel

    first_line = line_no
    errors = "replace" if opts.encoding_errors == "replace" else "strict"
    fast = _fast_loads()
    refused = (ValueError, RecursionError)
    end = len(data) if size < 0 else size
    limit = opts.max_doc
    key = opts.text_field.encode("utf-8", "surrogatepass")  # a lone surrogate never matches
    out = bytearray(end + 16) if into is None else into.at_least(end + 16)
    rows = _jsonl_kernel.texts(data, 0, end, key, limit, out)
    texts = memoryview(out)
    view = memoryview(data)
    try:
        for pos, stop, off, n, kind in struct.iter_unpack("5q", rows):
            line_no += 1
            if kind:  # 1: ASCII, 2: other UTF-8
                yield line_no, texts[off : off + n]
                continue
            if stop - pos - (data[stop - 1] == 10) > limit:
                raise too_long(name, line_no, offset + pos, opts.max_doc)
            start = offset + pos
            first = pos
            if start == 0 and data.startswith(b"\xef\xbb\xbf"):  # the file's first line
                first += 3
                start += 3
            if fast is not None:
                try:
                    obj = fast(view[first:stop])
                except refused:
                    pass
                else:
                    value = text_field(obj, opts, name, f"line {line_no}", counters)
                    if value is not None:
                        yield line_no, crlf(value)
                    continue
            value = _jsonl_slow(
                bytes(view[first:stop]), start, line_no, name, opts, errors, counters
            )
            if value is not None:
                yield line_no, value
    finally:
        view.release()
    counters.lines = line_no - first_line


def _jsonl_slow(
    raw: bytes,
    start: int,
    line_no: int,
    name: str,
    opts: Options,
    errors: str,
    counters: Counters,
) -> str | None:
    """A line orjson refused (or without orjson): the standard library's decode and parse give
    the error message and offset, or accept what orjson does not. None: no text (a blank
    line, or a record without the field under --missing-field skip)."""
    try:
        line = raw.decode("utf-8", errors)
    except UnicodeDecodeError as exc:
        if opts.encoding_errors == "skip-file":
            raise SkipFile(f"not UTF-8 at byte {start + exc.start}") from None
        raise utf8_error(name, start + exc.start, exc.reason) from None
    if not line.strip():
        return None
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise FormatError(
            INGEST_JSON,
            f"line {line_no} is not valid JSON: {exc.msg}",
            path=name,
            offset=start + len(line[: exc.pos].encode("utf-8")),
            field=f"line {line_no}",
        ) from None
    except ValueError:  # an integer longer than Python's int-string limit
        raise too_many_digits(name, f"line {line_no}", start) from None
    except RecursionError:
        raise FormatError(
            INGEST_JSON, f"line {line_no}: JSON nested too deeply", path=name, offset=start
        ) from None
    where = f"line {line_no}"
    value = text_field(obj, opts, name, where, counters)
    return None if value is None else crlf(no_surrogates(value, opts, name, where, start))


def documents(fp: Any, name: str, opts: Options, counters: Counters) -> Iterator[Doc]:
    """JSON Lines as documents of one piece each (the step reads `texts_stream` itself)."""
    for item, text in texts_stream(fp, name, opts, counters):
        yield item, iter([text])


def sniff(body: bytes) -> bool:
    """A leading `{` whose first line is a complete JSON object."""
    if not body.startswith(b"{"):
        return False
    try:
        return isinstance(json.loads(body.split(b"\n", 1)[0].strip()), dict)
    except (ValueError, RecursionError):
        return False


KINDS = (
    Kind(
        "jsonl",
        3,
        hints=(".jsonl", ".ndjson"),
        sniff=sniff,
        documents=documents,
        texts=texts_stream,
        cut="lines",
    ),
)
