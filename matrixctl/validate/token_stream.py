"""Load, describe and validate token streams (the format `tokenize` writes, `pack` reads)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from matrixctl.errors import FormatError
from matrixctl.formats import token_stream as ts
from matrixctl.io import Source
from matrixctl.validate.engine import rule
from matrixctl.validate.findings import Finding, from_error

FMT = ts.FORMAT


class StreamSubject:
    def __init__(self, src: Source, header: ts.StreamHeader) -> None:
        self.src = src
        self.header = header


def load(src: Source) -> StreamSubject:
    return StreamSubject(src, ts.StreamHeader.parse(src.head(ts.HEADER_SIZE)))


def describe(s: StreamSubject) -> dict[str, Any]:
    h = s.header
    out: dict[str, Any] = {
        "size": s.src.size,
        "header": {
            "magic": ts.MAGIC.decode(),
            "version": h.version,
            "dtype": h.dtype,
            "vocab_size": h.vocab_size or None,
        },
    }
    end = ts.read_end(s.src.buf, s.src.size)
    if end is not None:
        out["end"] = {
            "token_count": end.token_count,
            "doc_count": end.doc_count,
            "crc32": f"0x{end.crc32:08x}",
        }
    return out


@rule(FMT, "frames, END trailer, CRC-32, id range", scan=True)
def check_frames(s: StreamSubject) -> Iterator[Finding]:
    reader = ts.MemReader(s.src.buf, ts.HEADER_SIZE)
    try:
        for _ in ts.iter_events(reader, s.header):
            pass
    except FormatError as err:
        yield from_error(err)
