"""Load, describe and validate a Megatron indexed dataset: the `.idx` is the input, its `.bin`
is the file of the same prefix beside it (docs/formats/megatron.md).

Structure (inspect and verify): the header (magic, version, dtype code), the `.idx` size
against its counts (the root cause when it is cut), the `.bin` present and exactly as long as
the last sequence's end. Scan (verify): every length >= 0 and every pointer the previous
sequence's end (the sequences tile the `.bin`), document indices from 0, never decreasing, ending
at the sequence count. Arrays are read in bounded pieces; no count is trusted before the file
size has been checked against it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from matrixctl.findings import Finding, finding
from matrixctl.formats import megatron
from matrixctl.io import Source
from matrixctl.validate.engine import rule, sample, shown

FMT = megatron.FORMAT
PREVIEW = 8
CHUNK = 1 << 20  # entries per step


class IdxSubject:
    def __init__(self, src: Source, header: megatron.IdxHeader) -> None:
        self.src = src
        self.header = header
        self.bin_path = megatron.bin_path(src.path)
        try:
            self.bin_size: int | None = os.stat(self.bin_path).st_size
        except OSError:
            self.bin_size = None

    @property
    def size_ok(self) -> bool:
        h = self.header
        return (
            h.magic == megatron.MAGIC
            and h.itemsize is not None
            and self.src.size == h.expected_size()
        )

    def arrays(self) -> tuple[Any, Any, Any]:
        return megatron.arrays(self.src.buf, self.header)


def load(src: Source) -> IdxSubject:
    return IdxSubject(src, megatron.IdxHeader.parse(src.head(megatron.HEADER_SIZE)))


def describe(s: IdxSubject) -> dict[str, Any]:
    out: dict[str, Any] = {
        "size": s.src.size,
        "header": s.header.to_json(),
        "bin": {"path": s.bin_path, "bytes": s.bin_size},
    }
    if s.size_ok and s.header.sequence_count:
        lengths, pointers, _ = s.arrays()
        n = shown(PREVIEW)
        out["preview"] = sample(
            [
                {"sequence": i, "length": int(length), "pointer": int(pointer)}
                for i, (length, pointer) in enumerate(zip(lengths[:n], pointers[:n], strict=True))
            ],
            s.header.sequence_count,
        )
    return out


@rule(FMT, "header: magic, version, dtype code", header=True)
def check_header(s: IdxSubject) -> Iterator[Finding]:
    h = s.header
    if h.magic != megatron.MAGIC:
        yield finding(megatron.MEGATRON_HEADER, "magic is not MMIDIDX", offset=0, field="magic")
        return
    if h.version != megatron.VERSION:
        yield finding(
            megatron.MEGATRON_HEADER,
            f"version {h.version} is not supported (1 is)",
            offset=9,
            field="version",
        )
    if h.dtype is None:
        yield finding(
            megatron.MEGATRON_DTYPE,
            f"dtype code {h.dtype_code} is not one of 1-8",
            offset=17,
            field="dtype_code",
        )


@rule(FMT, "file sizes: .idx against its counts, .bin against the pointers", cause=True)
def check_sizes(s: IdxSubject) -> Iterator[Finding]:
    h = s.header
    if h.magic != megatron.MAGIC:
        return
    want = h.expected_size()
    if s.src.size != want:
        cut = s.src.size < want
        yield finding(
            megatron.MEGATRON_SIZE,
            f"file is {s.src.size:,} bytes; {h.sequence_count:,} sequences and "
            f"{h.document_count:,} document indices need {want:,}"
            + (f" (cut at byte {s.src.size:,})" if cut else ""),
            offset=min(s.src.size, want),
            field="sequence_count",
        )
        return
    if s.bin_size is None:
        yield finding(megatron.MEGATRON_MISSING, f"{s.bin_path} is missing", field="bin")
        return
    if not s.size_ok:
        return
    lengths, pointers, _ = s.arrays()
    end = 0
    if h.sequence_count:
        end = int(pointers[-1]) + int(lengths[-1]) * (h.itemsize or 1)
    if s.bin_size != end:
        yield finding(
            megatron.MEGATRON_SIZE,
            f"{os.path.basename(s.bin_path)} is {s.bin_size:,} bytes; the last sequence ends at "
            f"byte {end:,}" + (" (cut short)" if s.bin_size < end else ""),
            field="bin",
        )


@rule(FMT, "pointers tile the .bin, document indices", scan=True)
def check_arrays(s: IdxSubject) -> Iterator[Finding]:
    import numpy as np

    if not s.size_ok:
        return
    h = s.header
    item = h.itemsize or 1
    lengths, pointers, docs = s.arrays()
    base_lengths = megatron.HEADER_SIZE
    base_pointers = base_lengths + 4 * h.sequence_count
    expected = 0
    for start in range(0, h.sequence_count, CHUNK):
        ln = lengths[start : start + CHUNK].astype(np.int64)
        pt = pointers[start : start + CHUNK]
        if ln.size and int(ln.min()) < 0:
            i = start + int(np.argmax(ln < 0))
            yield finding(
                megatron.MEGATRON_POINTERS,
                f"sequence {i} has length {int(lengths[i])}",
                offset=base_lengths + 4 * i,
                field=f"sequence_lengths[{i}]",
            )
            return
        ends = np.cumsum(ln * item) + expected
        starts = np.concatenate([[expected], ends[:-1]])
        bad = np.flatnonzero(pt != starts)
        if bad.size:
            i = start + int(bad[0])
            yield finding(
                megatron.MEGATRON_POINTERS,
                f"sequence {i} points at byte {int(pointers[i])}; the previous sequence ends at "
                f"{int(starts[bad[0]])}",
                offset=base_pointers + 8 * i,
                field=f"sequence_pointers[{i}]",
            )
            return
        expected = int(ends[-1]) if ends.size else expected
    base_docs = base_pointers + 8 * h.sequence_count
    if h.document_count == 0 or int(docs[0]) != 0:
        yield finding(
            megatron.MEGATRON_DOCUMENTS,
            "document indices do not start with 0",
            offset=base_docs,
            field="document_indices[0]",
        )
        return
    previous = 0
    for start in range(0, h.document_count, CHUNK):
        part = docs[start : start + CHUNK]
        steps = np.diff(np.concatenate([[previous], part]))
        if steps.size and int(steps.min()) < 0:
            i = start + int(np.argmax(steps < 0))
            yield finding(
                megatron.MEGATRON_DOCUMENTS,
                f"document index {i} ({int(docs[i])}) is below the one before it",
                offset=base_docs + 8 * i,
                field=f"document_indices[{i}]",
            )
            return
        previous = int(part[-1])
    if previous != h.sequence_count:
        yield finding(
            megatron.MEGATRON_DOCUMENTS,
            f"the last document index is {previous}, the sequence count {h.sequence_count}",
            offset=base_docs + 8 * (h.document_count - 1),
            field=f"document_indices[{h.document_count - 1}]",
        )
