"""Load, describe and validate document indexes (`doc_index.bin`).

The file alone is checked here (header, size, CRCs, tiling); an ingest pack's `verify` also
checks it against the atoms (every document ends with the end-of-document id) and the manifest
(every source index names a listed source).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from matrixctl.crc import crc32_chunked
from matrixctl.findings import Finding, finding
from matrixctl.formats import doc_index
from matrixctl.io import Source
from matrixctl.validate.engine import rule, sample, shown

FMT = doc_index.FORMAT
PREVIEW = 8
TILE_CHUNK = 1 << 20


@dataclass
class IndexSubject:
    src: Source
    header: doc_index.IndexHeader

    @property
    def records_ok(self) -> bool:
        h = self.header
        return h.header_bytes == doc_index.HEADER_SIZE and self.src.size == (
            doc_index.HEADER_SIZE + h.doc_count * doc_index.RECORD_SIZE
        )


def load(src: Source) -> IndexSubject:
    return IndexSubject(src, doc_index.IndexHeader.parse(src.head(doc_index.HEADER_SIZE)))


def describe(s: IndexSubject) -> dict[str, Any]:
    out: dict[str, Any] = {"size": s.src.size, "header": s.header.to_json()}
    if s.records_ok and s.header.doc_count:
        recs = doc_index.records_view(s.src.buf, s.header)[: shown(PREVIEW)]
        out["preview"] = sample(
            [
                {
                    "doc": n,
                    "token_offset": int(r["token_offset"]),
                    "token_length": int(r["token_length"]),
                    "source": int(r["source"]),
                    "item": int(r["item"]),
                }
                for n, r in enumerate(recs)
            ],
            s.header.doc_count,
        )
    return out


def _at(name: str) -> int:
    return doc_index.FIELDS[name][0]


@rule(FMT, "header fields", header=True)
def check_fields(s: IndexSubject) -> Iterator[Finding]:
    h = s.header
    if h.version != doc_index.VERSION:
        yield finding(
            doc_index.DIDX_VERSION,
            f"version {h.version} is not supported",
            offset=_at("version"),
            field="version",
        )
    if h.header_bytes != doc_index.HEADER_SIZE:
        yield finding(
            doc_index.DIDX_HEADER_BYTES,
            f"header_bytes is {h.header_bytes}, v1 requires 48",
            offset=_at("header_bytes"),
            field="header_bytes",
        )
    if h.flags:
        yield finding(
            doc_index.DIDX_RESERVED,
            f"flags is 0x{h.flags:08x}, must be 0",
            offset=_at("flags"),
            field="flags",
        )
    if h.reserved:
        yield finding(
            doc_index.DIDX_RESERVED,
            "reserved field at 0x2C is not zero",
            offset=_at("reserved"),
            field="reserved",
        )
    want = doc_index.header_crc(s.src.head(doc_index.HEADER_SIZE))
    if h.header_crc32 != want:
        yield finding(
            doc_index.DIDX_HEADER_CRC,
            f"header_crc32 is 0x{h.header_crc32:08x}, the header's CRC-32 is 0x{want:08x}",
            offset=_at("header_crc32"),
            field="header_crc32",
        )


@rule(FMT, "file size", cause=True)
def check_size(s: IndexSubject) -> Iterator[Finding]:
    h = s.header
    want = doc_index.HEADER_SIZE + h.doc_count * doc_index.RECORD_SIZE
    if s.src.size != want:
        yield finding(
            doc_index.DIDX_SIZE,
            f"file is {s.src.size} bytes; {h.doc_count} records need {want}",
            offset=min(s.src.size, want),
            field="doc_count",
        )


@rule(FMT, "records_crc32, tiling", scan=True)
def check_records(s: IndexSubject) -> Iterator[Finding]:
    import numpy as np

    if not s.records_ok:
        return
    h = s.header
    crc = crc32_chunked(s.src.buf, doc_index.HEADER_SIZE, s.src.size)
    if crc != h.records_crc32:
        yield finding(
            doc_index.DIDX_CRC,
            f"records_crc32 is 0x{h.records_crc32:08x}, the records' CRC-32 is 0x{crc:08x}",
            offset=_at("records_crc32"),
            field="records_crc32",
        )
    recs = doc_index.records_view(s.src.buf, h)
    expected = 0
    for start in range(0, h.doc_count, TILE_CHUNK):
        part = recs[start : start + TILE_CHUNK]
        off = part["token_offset"].astype(np.uint64)
        length = part["token_length"].astype(np.uint64)
        if length.size and int(length.max()) > h.token_count:
            n = start + int(np.argmax(length > np.uint64(h.token_count)))
            yield finding(
                doc_index.DIDX_TILING,
                f"record {n} token_length exceeds token_count {h.token_count}",
                offset=doc_index.HEADER_SIZE + n * doc_index.RECORD_SIZE + 8,
                field=f"record[{n}].token_length",
            )
            return
        ends = np.cumsum(length, dtype=np.uint64) + np.uint64(expected)
        starts = np.concatenate([[np.uint64(expected)], ends[:-1]])
        bad = np.flatnonzero(off != starts)
        if bad.size:
            n = start + int(bad[0])
            yield finding(
                doc_index.DIDX_TILING,
                f"record {n} starts at token {int(off[bad[0]])}, the previous record ends at "
                f"{int(starts[bad[0]])}",
                offset=doc_index.HEADER_SIZE + n * doc_index.RECORD_SIZE,
                field=f"record[{n}].token_offset",
            )
            return
        if part["reserved"].any():
            n = start + int(np.argmax(part["reserved"] != 0))
            yield finding(
                doc_index.DIDX_RESERVED,
                f"record {n} reserved field is not zero",
                offset=doc_index.HEADER_SIZE + n * doc_index.RECORD_SIZE + 20,
                field=f"record[{n}].reserved",
            )
        expected = int(ends[-1]) if ends.size else expected
    if expected != h.token_count:
        yield finding(
            doc_index.DIDX_TILING,
            f"the records hold {expected} tokens, token_count says {h.token_count}",
            offset=_at("token_count"),
            field="token_count",
        )
