"""Load, describe and validate SVG-Tensor files.

SVG-Tensor has no checksum, so a flipped payload bit is only caught against the MATRIX-ATOM
file the projection was made from (an ingest pack's `verify` does that comparison).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

from matrixctl.findings import Finding, finding
from matrixctl.formats import svgt
from matrixctl.io import Source
from matrixctl.validate.engine import rule, sample, shown

FMT = svgt.FORMAT
PREVIEW_ATOMS = 2


class SvgtSubject:
    def __init__(self, src: Source, header: svgt.SvgtHeader) -> None:
        self.src = src
        self.header = header

    @property
    def payload_ok(self) -> bool:
        h = self.header
        return (
            h.data_offset == svgt.HEADER_SIZE
            and h.rows > 0
            and h.cols > 0
            and self.src.size == h.data_offset + h.payload_bytes
        )


def load(src: Source) -> SvgtSubject:
    return SvgtSubject(src, svgt.SvgtHeader.parse(src.head(svgt.HEADER_SIZE)))


def describe(s: SvgtSubject) -> dict[str, Any]:
    h = s.header
    out: dict[str, Any] = {
        "size": s.src.size,
        "header": h.to_json(),
        "payload": {"dtype": "uint16", "atom_size": h.atom_size, "bytes": h.payload_bytes},
    }
    if s.payload_ok and h.atom_count:
        grids = []
        for atom in range(min(shown(PREVIEW_ATOMS) or h.atom_count, h.atom_count)):
            for r in range(min(h.rows, shown(4) or h.rows)):
                off = h.data_offset + 2 * (atom * h.atom_size + r * h.cols)
                n = min(h.cols, shown(16) or h.cols)
                ids = struct.unpack_from(f"<{n}H", s.src.buf, off)
                more = " ..." if n < h.cols else ""
                grids.append({"atom": atom, "row": r, "ids": " ".join(map(str, ids)) + more})
        out["preview"] = sample(grids, h.atom_count * h.rows)
    return out


def _at(name: str) -> int:
    return svgt.FIELDS[name][0]


@rule(FMT, "header fields", header=True)
def check_fields(s: SvgtSubject) -> Iterator[Finding]:
    h = s.header
    if h.version != svgt.VERSION:
        yield finding(
            svgt.SVGT_VERSION,
            f"version {h.version} is not supported",
            offset=_at("version"),
            field="version",
        )
    if h.header_bytes != svgt.HEADER_SIZE:
        yield finding(
            svgt.SVGT_HEADER_BYTES,
            f"header_bytes is {h.header_bytes}, v1 requires 32",
            offset=_at("header_bytes"),
            field="header_bytes",
        )
    for name in ("rows", "cols"):
        if getattr(h, name) == 0:
            yield finding(svgt.SVGT_GRID, f"{name} is 0", offset=_at(name), field=name)
    if h.data_offset != svgt.HEADER_SIZE:
        yield finding(
            svgt.SVGT_DATA_OFFSET,
            f"data_offset is {h.data_offset}, v1 requires 32",
            offset=_at("data_offset"),
            field="data_offset",
        )


@rule(FMT, "file size", cause=True)
def check_size(s: SvgtSubject) -> Iterator[Finding]:
    h = s.header
    if h.data_offset < svgt.HEADER_SIZE:
        return
    expected = h.data_offset + h.payload_bytes
    if s.src.size < expected:
        yield finding(
            svgt.SVGT_TRUNCATED,
            f"file is {s.src.size} bytes; {h.atom_count} atoms of {h.rows}x{h.cols} uint16 "
            f"need {expected}",
            offset=s.src.size,
            field="atom_count",
        )
    elif s.src.size > expected:
        yield finding(
            svgt.SVGT_TRAILING,
            f"{s.src.size - expected} bytes follow the last atom",
            offset=expected,
            field="payload",
        )
