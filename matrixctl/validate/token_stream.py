"""Load, describe and validate token streams (the format `tokenize` writes, `pack` reads)."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

from matrixctl.errors import FormatError
from matrixctl.findings import Finding, from_error
from matrixctl.formats import token_stream
from matrixctl.io import Source
from matrixctl.validate.engine import rule
from matrixctl.validate.ids import IdPreview
from matrixctl.validate.ids import describe_ids as ids_section

FMT = token_stream.FORMAT


class StreamSubject:
    def __init__(self, src: Source, header: token_stream.StreamHeader) -> None:
        self.src = src
        self.header = header


def load(src: Source) -> StreamSubject:
    return StreamSubject(src, token_stream.StreamHeader.parse(src.head(token_stream.HEADER_SIZE)))


def describe(s: StreamSubject) -> dict[str, Any]:
    h = s.header
    out: dict[str, Any] = {
        "size": s.src.size,
        "header": {
            "magic": token_stream.MAGIC.decode(),
            "version": h.version,
            "dtype": h.dtype,
            "vocab_size": h.vocab_size or None,
        },
    }
    end = token_stream.read_end(s.src.buf, s.src.size)
    if end is not None:
        out["end"] = {
            "token_count": end.token_count,
            "doc_count": end.doc_count,
            "crc32": f"0x{end.crc32:08x}",
        }
    return out


def describe_ids(s: StreamSubject, preview: IdPreview) -> dict[str, Any]:
    """Ids `preview.start` .. `+ count`, found by walking the frames from the header."""
    ids, stopped = read_ids(s.src.buf, s.src.size, s.header, preview.start, preview.count)
    end = token_stream.read_end(s.src.buf, s.src.size)
    of = end.token_count if end is not None else None
    return ids_section(
        ids, preview.start, of, preview, stopped=stopped, vocab_size=s.header.vocab_size
    )


def read_ids(
    buf: Any, size: int, header: token_stream.StreamHeader, start: int, count: int
) -> tuple[list[int], str | None]:
    """Up to `count` ids from token index `start`, and why the walk stopped early (if it did).

    Frames are skipped by their counts; every position is checked against `size` before it is
    read, so frames that claim more than the file holds end the preview, never a read past
    the end. Each frame moves the walk forward by at least 8 bytes, so it always ends.
    """
    itemsize = header.itemsize
    code = "H" if itemsize == 2 else "I"
    out: list[int] = []
    pos = token_stream.HEADER_SIZE
    index = 0  # token index of the next frame's first id
    while len(out) < count:
        if pos + token_stream.FRAME_SIZE > size:
            return out, f"the stream ends at offset {size} without its END frame"
        kind, _, n = token_stream.FRAME.unpack_from(buf, pos)
        body = pos + token_stream.FRAME_SIZE
        if kind == token_stream.KIND_END:
            return out, None
        if kind == token_stream.KIND_DOC:
            if n > token_stream.MAX_LABEL_BYTES:
                return out, f"the frame at offset {pos} has a label length {n} beyond the limit"
            pos = body + n + (-n) % token_stream.ALIGN
            continue
        if kind != token_stream.KIND_TOKENS or not 1 <= n <= token_stream.MAX_FRAME_TOKENS:
            return out, f"the frame at offset {pos} is not a valid frame (kind {kind}, count {n})"
        present = min(n, max(0, (size - body) // itemsize))
        first = max(start - index, 0)
        take = min(present, first + count - len(out)) - first
        if take > 0:
            out.extend(struct.unpack_from(f"<{take}{code}", buf, body + first * itemsize))
        if present < n:
            return out, f"the stream ends at offset {size}, inside the frame at offset {pos}"
        index += n
        nbytes = n * itemsize
        pos = body + nbytes + (-nbytes) % token_stream.ALIGN
    return out, None


@rule(FMT, "frames, END trailer, CRC-32, id range", scan=True)
def check_frames(s: StreamSubject) -> Iterator[Finding]:
    reader = token_stream.MemReader(s.src.buf, token_stream.HEADER_SIZE)
    try:
        for _ in token_stream.iter_events(reader, s.header):
            pass
    except FormatError as err:
        yield from_error(err)
