"""Parquet's own bytes where pyarrow cannot be trusted with them (docs/inputs.md, "Parquet and
Arrow"): the column chunks' places from the footer and the page headers, read by matrixctl.

pyarrow's accessor of a column chunk's metadata aborts the whole process on some damaged
footers (a C++ exception it does not translate), and a page header says how large a page's
values are before pyarrow decodes them, so a cell over --max-doc-size is refused before it is
built. Both readers are bounded (header size, pages per chunk, nesting depth) and raise
ValueError on anything they do not understand; `columnar.py` turns that into its one error.
No pyarrow here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

MAX_HEADER = 1 << 20  # a Parquet page header longer than this is damage
MAX_PAGES = 1 << 20  # pages looked at in one column chunk


class Thrift:
    """Just enough of Thrift's compact protocol to read a Parquet page header from a file:
    the page's sizes and value count, every other field skipped (binary fields by seeking,
    so a page's statistics cost nothing). Bounded: depth, lengths and the header's size."""

    def __init__(self, fp: Any, start: int, end: int, limit: int = MAX_HEADER) -> None:
        self.fp = fp
        self.pos = start
        self.start = start
        self.end = end
        self.limit = limit
        fp.seek(start)

    def byte(self) -> int:
        data = self.fp.read(1)
        if not data or self.pos >= self.end or self.pos - self.start > self.limit:
            raise ValueError("a page header runs past its column chunk")
        self.pos += 1
        return data[0]

    def varint(self) -> int:
        out = shift = 0
        while True:
            b = self.byte()
            out |= (b & 0x7F) << shift
            if not b & 0x80:
                return out
            shift += 7
            if shift > 63:
                raise ValueError("a varint in a page header is too long")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def skip_bytes(self, n: int) -> None:
        if n < 0 or self.pos + n > self.end or self.pos + n - self.start > self.limit:
            raise ValueError("a page header field runs past its column chunk")
        self.pos += n
        self.fp.seek(self.pos)

    def value(self, kind: int, depth: int) -> Any:
        if depth > 16:
            raise ValueError("a page header is nested too deeply")
        if kind in (1, 2):
            return kind == 1
        if kind == 3:
            return self.byte()
        if kind in (4, 5, 6):
            return self.zigzag()
        if kind == 7:
            self.skip_bytes(8)
        elif kind == 8:
            n = self.varint()
            if n <= 4096:  # a name; longer binaries (statistics) are skipped
                start = self.pos
                self.skip_bytes(n)
                self.fp.seek(start)
                return self.fp.read(n)
            self.skip_bytes(n)
        elif kind in (9, 10):
            head = self.byte()
            size = head >> 4 if head >> 4 != 15 else self.varint()
            if size > self.end - self.pos:
                raise ValueError("a list in the footer is longer than its bytes")
            return [
                self.value(head & 0x0F if head & 0x0F not in (1, 2) else 3, depth + 1)
                for _ in range(size)
            ]
        elif kind == 11:
            size = self.varint()
            types = self.byte() if size else 0
            for _ in range(size):
                self.value(types >> 4, depth + 1)
                self.value(types & 0x0F, depth + 1)
        elif kind == 12:
            return self.struct(depth + 1)
        else:
            raise ValueError(f"a page header has a field of unknown type {kind}")
        return None

    def struct(self, depth: int = 0) -> dict[int, Any]:
        fields: dict[int, Any] = {}
        last = 0
        while True:
            head = self.byte()
            if head == 0:
                return fields
            delta, kind = head >> 4, head & 0x0F
            last = last + delta if delta else self.zigzag()
            fields[last] = self.value(kind, depth)


def column_chunks(path: str, column: str | None) -> list[tuple[int, int, bool]]:
    """For each row group, where the column chunk of `column` (a dotted path; None: all the
    row group's chunks together) is stored: `(start, end, has a dictionary page)`, read from
    the file's footer here. pyarrow's own
    accessor of a column chunk's metadata aborts the process on some damaged footers (a C++
    exception it does not translate: "Definition level histogram size mismatch", found by
    fuzz/fuzz_columnar_dictionary_parquet.py); this reader raises ValueError instead."""
    import io
    import os

    with open(path, "rb") as fp:
        size = os.fstat(fp.fileno()).st_size
        if size < 12:
            raise ValueError("too short for a Parquet footer")
        fp.seek(size - 8)
        tail = fp.read(8)
        length = int.from_bytes(tail[:4], "little")
        if tail[4:] != b"PAR1" or length > size - 12:
            raise ValueError("no Parquet footer")
        fp.seek(size - 8 - length)
        footer = fp.read(length)
    meta = Thrift(io.BytesIO(footer), 0, length, length).struct()
    want = None if column is None else column.encode("utf-8")
    out: list[tuple[int, int, bool]] = []
    for group in meta.get(4) or []:
        found = (0, 0, False)
        ends: list[int] = []
        for chunk in (group.get(1) or []) if isinstance(group, dict) else []:
            cmeta = chunk.get(3) if isinstance(chunk, dict) else None
            if not isinstance(cmeta, dict):
                continue
            names = cmeta.get(3) or []
            if not all(isinstance(n, bytes) for n in names):
                raise ValueError("a column chunk's path is not names")
            if want is not None and b".".join(names) != want:
                continue
            data, stored = cmeta.get(9), cmeta.get(7)
            dictionary = cmeta.get(11)
            if not isinstance(data, int) or not isinstance(stored, int):
                raise ValueError("a column chunk lacks its offsets")
            has_dict = isinstance(dictionary, int) and dictionary > 0
            start = min(data, dictionary) if isinstance(dictionary, int) and has_dict else data
            found = (start, start + stored, has_dict)
            ends.append(start + stored)
        out.append(found if want is not None else (0, max(ends, default=0), False))
    return out


def pages(fp: Any, start: int, end: int) -> Iterator[tuple[int, int, int]]:
    """(page type, uncompressed size, values) of each page of a column chunk stored in
    `start`..`end`, from the page headers (the pages themselves are not read)."""
    pos = start
    for _ in range(MAX_PAGES):
        if pos >= end:
            return
        reader = Thrift(fp, pos, end)
        header = reader.struct()
        kind, size, stored = header.get(1), header.get(2), header.get(3)
        if not (isinstance(kind, int) and isinstance(size, int) and isinstance(stored, int)):
            raise ValueError("a page header lacks its type or sizes")
        if size < 0 or stored < 0:
            raise ValueError("a page header has a negative size")
        inner: dict[int, Any] = next(
            (header[k] for k in (5, 7, 8) if isinstance(header.get(k), dict)), {}
        )
        values = inner.get(1)
        yield kind, size, values if isinstance(values, int) and values > 0 else 0
        pos = reader.pos + stored
