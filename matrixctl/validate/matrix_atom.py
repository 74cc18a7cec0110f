"""Load, describe and validate MATRIX-ATOM files (rules for `inspect` and `verify`)."""

from __future__ import annotations

import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from matrixctl.crc import crc32
from matrixctl.findings import Finding, finding
from matrixctl.formats import matrix_atom
from matrixctl.io import Releaser, Source
from matrixctl.validate.engine import rule, sample, shown
from matrixctl.validate.ids import IdPreview
from matrixctl.validate.ids import describe_ids as ids_section

FMT = matrix_atom.FORMAT
SCAN_CHUNK_BYTES = 1 << 20  # small enough to stay in L2 between the CRC and the max pass
PREVIEW_ATOMS = 4
PREVIEW_TOKENS = 16


def field_offset(name: str) -> int:
    return matrix_atom.FIELDS[name][0]


@dataclass
class PayloadStats:
    crc: int
    max_id: int
    first_bad: int | None  # index of the first id >= vocab_size
    bad_count: int


class AtomSubject:
    def __init__(self, src: Source, header: matrix_atom.AtomHeader) -> None:
        self.src = src
        self.header = header
        self.raw = src.head(matrix_atom.HEADER_SIZE)
        self._stats: PayloadStats | None = None

    @property
    def payload_ok(self) -> bool:
        """Whether the payload can be read as the header describes (size, dtype, offset)."""
        h = self.header
        return (
            h.itemsize is not None
            and h.data_offset == matrix_atom.HEADER_SIZE
            and self.src.size == h.data_offset + h.token_count * h.itemsize
        )

    def stats(self) -> PayloadStats:
        """One pass over the payload: CRC-32, the largest id, and ids >= vocab_size."""
        if self._stats is None:
            self._stats = scan_payload(self.src.buf, self.header)
        return self._stats


SMALL_PAYLOAD = 1 << 20


def scan_payload(buf: Any, header: matrix_atom.AtomHeader) -> PayloadStats:
    itemsize = header.itemsize or 0
    nbytes = header.token_count * itemsize
    if nbytes <= SMALL_PAYLOAD and sys.byteorder == "little":
        return _scan_small(buf, header)
    import numpy as np

    tokens = matrix_atom.token_view(buf, header)
    itemsize = tokens.itemsize
    step = SCAN_CHUNK_BYTES // itemsize
    crc = 0
    max_id = -1
    first_bad: int | None = None
    bad = 0
    vocab = header.vocab_size
    releaser = Releaser(buf)
    for i in range(0, tokens.size, step):
        chunk = tokens[i : i + step]
        crc = crc32(chunk.data.cast("B"), crc)
        hi = int(chunk.max())
        max_id = max(max_id, hi)
        if hi >= vocab:
            mask = chunk >= vocab
            if first_bad is None:
                first_bad = i + int(np.argmax(mask))
            bad += int(np.count_nonzero(mask))
        releaser.advance(header.data_offset + (i + chunk.size) * itemsize)
    return PayloadStats(crc, max_id, first_bad, bad)


def _scan_small(buf: Any, header: matrix_atom.AtomHeader) -> PayloadStats:
    """The same scan without numpy (cheaper to start than to import numpy for a small file)."""
    itemsize = header.itemsize or 0
    start = header.data_offset
    raw = memoryview(buf)[start : start + header.token_count * itemsize]
    ids = raw.cast("H" if itemsize == 2 else "I")
    vocab = header.vocab_size
    bad = [i for i, v in enumerate(ids) if v >= vocab] if ids and max(ids) >= vocab else []
    stats = PayloadStats(crc32(raw), max(ids, default=-1), bad[0] if bad else None, len(bad))
    ids.release()
    raw.release()
    return stats


def load(src: Source) -> AtomSubject:
    return AtomSubject(src, matrix_atom.AtomHeader.parse(src.head(matrix_atom.HEADER_SIZE)))


def describe(s: AtomSubject) -> dict[str, Any]:
    h = s.header
    out: dict[str, Any] = {
        "size": s.src.size,
        "header": h.to_json(),
        "fields": [
            {"field": name, "offset": off, "size": size}
            for name, (off, size) in matrix_atom.FIELDS.items()
        ],
        "payload": {
            "dtype": h.dtype_name,
            "itemsize": h.itemsize,
            "bytes": h.payload_bytes,
            "tokens": h.token_count,
            "atoms": h.atom_count,
        },
    }
    if s.payload_ok and h.token_count:
        out["preview"] = preview(s)
    return out


def preview(s: AtomSubject) -> dict[str, Any]:
    h = s.header
    code = "H" if h.itemsize == 2 else "I"
    rows: list[dict[str, Any]] = []
    for atom in range(min(shown(PREVIEW_ATOMS) or h.atom_count, h.atom_count)):
        n = min(shown(PREVIEW_TOKENS) or h.atom_size, h.atom_size)
        off = h.data_offset + atom * h.atom_size * (h.itemsize or 0)
        # Header fields can disagree (atom_size x atom_count != token_count is its own
        # finding): show only ids that are inside both the token count and the file.
        n = min(n, h.token_count - atom * h.atom_size, (s.src.size - off) // (h.itemsize or 1))
        if n <= 0:
            break
        ids = struct.unpack_from(f"<{n}{code}", s.src.buf, off)
        more = " ..." if n < h.atom_size else ""
        rows.append({"atom": atom, "tokens": " ".join(map(str, ids)) + more})
    return sample(rows, h.atom_count)


def describe_ids(s: AtomSubject, preview: IdPreview) -> dict[str, Any]:
    """Ids `preview.start` .. `+ count` of the payload: only tokens that are inside both the
    declared token_count and the file (header fields may disagree with the file's size)."""
    h = s.header
    itemsize = h.itemsize
    if itemsize is None:
        return ids_section([], preview.start, None, preview, stopped="the dtype_id is unknown")
    present = max(0, (s.src.size - h.data_offset) // itemsize) if h.data_offset >= 0 else 0
    available = min(h.token_count, present)
    n = max(0, min(preview.count, available - preview.start))
    code = "H" if itemsize == 2 else "I"
    ids = (
        list(struct.unpack_from(f"<{n}{code}", s.src.buf, h.data_offset + preview.start * itemsize))
        if n
        else []
    )
    stopped = None
    if present < h.token_count and preview.start + preview.count > present:
        stopped = f"the file ends after {present} of the {h.token_count} tokens it declares"
    return ids_section(
        ids,
        preview.start,
        h.token_count,
        preview,
        atom_size=h.atom_size,
        stopped=stopped,
        vocab_size=h.vocab_size,
    )


@rule(FMT, "header fields", header=True)
def check_fields(s: AtomSubject) -> Iterator[Finding]:
    h = s.header
    if h.version != matrix_atom.VERSION:
        yield finding(
            matrix_atom.ATOM_VERSION,
            f"version {h.version} is not supported (this reader knows v{matrix_atom.VERSION})",
            offset=field_offset("version"),
            field="version",
        )
    if h.header_bytes != matrix_atom.HEADER_SIZE:
        yield finding(
            matrix_atom.ATOM_HEADER_BYTES,
            f"header_bytes is {h.header_bytes}, v1 requires {matrix_atom.HEADER_SIZE}",
            offset=field_offset("header_bytes"),
            field="header_bytes",
        )
    if h.dtype_id not in matrix_atom.DTYPES:
        yield finding(
            matrix_atom.ATOM_DTYPE,
            f"dtype_id {h.dtype_id} is unknown (1 = uint16, 2 = uint32)",
            offset=field_offset("dtype_id"),
            field="dtype_id",
        )
    if h.flags & ~matrix_atom.KNOWN_FLAGS:
        yield finding(
            matrix_atom.ATOM_FLAGS,
            f"flags 0x{h.flags:02x} has undefined bits 0x{h.flags & ~matrix_atom.KNOWN_FLAGS:02x}",
            offset=field_offset("flags"),
            field="flags",
        )
    if h.reserved0:
        yield finding(
            matrix_atom.ATOM_RESERVED,
            f"reserved field at 0x0E is 0x{h.reserved0:04x}, must be 0",
            offset=field_offset("reserved0"),
            field="reserved0",
        )
    if any(h.reserved1):
        yield finding(
            matrix_atom.ATOM_RESERVED,
            f"reserved bytes at 0x38 are {h.reserved1.hex()}, must be zero",
            offset=field_offset("reserved1"),
            field="reserved1",
        )
    if h.data_offset != matrix_atom.HEADER_SIZE:
        yield finding(
            matrix_atom.ATOM_DATA_OFFSET,
            f"data_offset is {h.data_offset}, v1 payloads start right after the 64-byte header",
            offset=field_offset("data_offset"),
            field="data_offset",
        )
    if h.vocab_size == 0:
        yield finding(
            matrix_atom.ATOM_VOCAB_SIZE,
            "vocab_size is 0: no token id can be valid",
            offset=field_offset("vocab_size"),
            field="vocab_size",
        )
    if h.atom_size == 0:
        yield finding(
            matrix_atom.ATOM_ATOM_SIZE,
            "atom_size is 0",
            offset=field_offset("atom_size"),
            field="atom_size",
        )
    if h.atom_count * h.atom_size != h.token_count:
        yield finding(
            matrix_atom.ATOM_COUNT,
            f"atom_count {h.atom_count} * atom_size {h.atom_size} = "
            f"{h.atom_count * h.atom_size}, but token_count is {h.token_count}",
            offset=field_offset("atom_count"),
            field="atom_count",
        )
    if h.dtype_id == 1 and h.vocab_size > matrix_atom.UINT16_LIMIT:
        yield finding(
            matrix_atom.ATOM_DTYPE_NARROW,
            f"uint16 payload but vocab_size is {h.vocab_size}",
            offset=field_offset("dtype_id"),
            field="dtype_id",
        )
    if h.dtype_id == 2 and 0 < h.vocab_size <= matrix_atom.UINT16_LIMIT:
        yield finding(
            matrix_atom.ATOM_DTYPE_WIDE,
            f"uint32 payload but vocab_size {h.vocab_size} fits uint16",
            offset=field_offset("dtype_id"),
            field="dtype_id",
        )


@rule(FMT, "file size", cause=True)
def check_size(s: AtomSubject) -> Iterator[Finding]:
    h = s.header
    if h.itemsize is None or h.data_offset < matrix_atom.HEADER_SIZE:
        return
    expected = h.data_offset + h.token_count * h.itemsize
    if s.src.size < expected:
        have = max(0, (s.src.size - h.data_offset) // h.itemsize)
        yield finding(
            matrix_atom.ATOM_TRUNCATED,
            f"file is {s.src.size} bytes; token_count {h.token_count} x {h.itemsize} bytes "
            f"needs {expected} (only {have} whole tokens present)",
            offset=s.src.size,
            field="token_count",
        )
    elif s.src.size > expected:
        yield finding(
            matrix_atom.ATOM_TRAILING,
            f"{s.src.size - expected} bytes follow the last declared token",
            offset=expected,
            field="payload",
        )


@rule(FMT, "header_crc32", header=True)
def check_header_crc(s: AtomSubject) -> Iterator[Finding]:
    h = s.header
    want = matrix_atom.header_crc(s.raw)
    if h.header_crc32 == want:
        return
    if h.header_crc32 == matrix_atom.header_crc(s.raw, legacy=True):
        yield finding(
            matrix_atom.ATOM_HEADER_CRC_LEGACY,
            "header_crc32 matches the header with payload_crc32 also zeroed "
            "(binary_pack.py's variant); the header is intact",
            offset=field_offset("header_crc32"),
            field="header_crc32",
        )
        return
    yield finding(
        matrix_atom.ATOM_HEADER_CRC,
        f"header_crc32 is 0x{h.header_crc32:08x}, the header's CRC-32 is 0x{want:08x}",
        offset=field_offset("header_crc32"),
        field="header_crc32",
    )


@rule(FMT, "payload_crc32", scan=True)
def check_payload_crc(s: AtomSubject) -> Iterator[Finding]:
    if not s.payload_ok:
        return
    got = s.stats().crc
    if got != s.header.payload_crc32:
        yield finding(
            matrix_atom.ATOM_PAYLOAD_CRC,
            f"payload_crc32 is 0x{s.header.payload_crc32:08x}, the payload's CRC-32 is 0x{got:08x}",
            offset=field_offset("payload_crc32"),
            field="payload_crc32",
        )


@rule(FMT, "token ids < vocab_size", scan=True)
def check_ids(s: AtomSubject) -> Iterator[Finding]:
    h = s.header
    if not s.payload_ok or h.vocab_size == 0:
        return
    st = s.stats()
    if st.first_bad is not None:
        itemsize = h.itemsize or 0
        yield finding(
            matrix_atom.ATOM_ID_RANGE,
            f"{st.bad_count} token id(s) >= vocab_size {h.vocab_size}; first at token "
            f"{st.first_bad} (largest id {st.max_id})",
            offset=h.data_offset + st.first_bad * itemsize,
            field=f"token[{st.first_bad}]",
        )
