"""Load, describe and validate safetensors files (rules for `inspect` and `verify`).

The structural rules are the package's own acceptance rules (header limit, known dtypes,
lengths that match shapes, byte ranges that tile the buffer); the scan rule reads BOOL tensors,
since safetensors has no checksum to verify.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from matrixctl import codes
from matrixctl.findings import Finding, finding, findings_of, has_error
from matrixctl.formats import st_container
from matrixctl.io import Source
from matrixctl.tensors import human_bytes, tensor_row
from matrixctl.validate.engine import rule

FMT = st_container.FORMAT
SCAN_CHUNK = 8 << 20

ST_TRUNCATED = codes.define(
    "ST_TRUNCATED",
    "The file ends before the byte buffer its header's data_offsets describe.",
    group=FMT,
)


class StSubject:
    def __init__(self, src: Source, parsed: st_container.StFile) -> None:
        self.src = src
        self.st = parsed


def load(src: Source) -> StSubject:
    return StSubject(src, st_container.parse(src.buf, src.size))


def describe(s: StSubject) -> dict[str, Any]:
    f = s.st
    out: dict[str, Any] = {
        "size": f.size,
        "header_size": f.header_size,
        "data_start": f.data_start,
        "tensor_count": len(f.tensors),
        "data": human_bytes(f.size - f.data_start),
    }
    if f.metadata:
        out["metadata"] = dict(f.metadata)
    out["tensors"] = [
        tensor_row(
            t.name, t.dtype or t.st_dtype, t.shape, t.offset, t.nbytes, {"st_dtype": t.st_dtype}
        )
        for t in f.tensors
    ]
    return out


@rule(FMT, "header schema and dtypes")
def check_schema(s: StSubject) -> Iterator[Finding]:
    yield from findings_of(s.st.problems)


@rule(FMT, "dtypes are tensor dtypes", header=True)
def check_tensor_dtypes(s: StSubject) -> Iterator[Finding]:
    foreign = [t for t in s.st.tensors if not t.dtype]
    if foreign:
        names = ", ".join(f"{t.name!r} ({t.st_dtype})" for t in foreign[:4])
        more = f" and {len(foreign) - 4} more" if len(foreign) > 4 else ""
        yield finding(
            st_container.ST_NOT_TENSOR,
            f"intact, but tensor{'s' * (len(foreign) > 1)} {names}{more} of a dtype matrixctl "
            "has no type for; convert does not take it",
            offset=st_container.PREFIX,
            field=f"{foreign[0].field}/dtype",
        )


@rule(FMT, "file size", cause=True)
def check_size(s: StSubject) -> Iterator[Finding]:
    """A cut file: the tensors tile the buffer from 0 (so their ends can be trusted: a single
    hostile offset is the range rule's ST_OFFSETS) and the file ends before the last one."""
    f = s.st
    pos = 0
    for t in f.tensors:  # sorted by begin
        if t.begin != pos or t.end < t.begin:
            return
        pos = t.end
    expected = f.data_start + pos
    if f.size < expected:
        yield finding(
            ST_TRUNCATED,
            f"file is {f.size:,} bytes; the header's data_offsets need {expected:,} (cut at "
            f"byte {f.size:,})",
            offset=f.size,
            field="data_offsets",
        )


@rule(FMT, "tensor ranges: lengths and tiling")
def check_ranges(s: StSubject) -> Iterator[Finding]:
    f = s.st
    buffer = f.size - f.data_start
    pos = 0
    for t in f.tensors:
        if t.begin > t.end or t.end > buffer:
            yield finding(
                st_container.ST_OFFSETS,
                f"{t.name}: data_offsets [{t.begin:,}, {t.end:,}] do not fit the {buffer:,}-byte "
                "buffer",
                offset=st_container.PREFIX,
                field=f"{t.field}/data_offsets",
            )
            continue
        if t.expected < 0:
            yield finding(
                st_container.ST_LENGTH,
                f"{t.name}: shape {list(t.shape)} of {t.st_dtype} does not end on a byte boundary",
                offset=t.offset,
                field=f"{t.field}/shape",
            )
        elif t.nbytes != t.expected:
            yield finding(
                st_container.ST_LENGTH,
                f"{t.name}: {t.nbytes:,} bytes, but shape {list(t.shape)} of {t.st_dtype} needs "
                f"{t.expected:,}",
                offset=t.offset,
                field=f"{t.field}/data_offsets",
            )
        if t.begin > pos:
            yield finding(
                st_container.ST_LAYOUT,
                f"buffer bytes {pos:,}..{t.begin:,} belong to no tensor (before {t.name})",
                offset=f.data_start + pos,
                field=f"{t.field}/data_offsets",
            )
        elif t.begin < pos:
            yield finding(
                st_container.ST_LAYOUT,
                f"{t.name}: bytes {t.begin:,}..{t.end:,} overlap the tensor before it (ends at "
                f"{pos:,})",
                offset=t.offset,
                field=f"{t.field}/data_offsets",
            )
        pos = max(pos, t.end)
    if pos < buffer and not has_error(s.st.problems):
        yield finding(
            st_container.ST_LAYOUT,
            f"{buffer - pos:,} bytes follow the last tensor",
            offset=f.data_start + pos,
            field="buffer",
        )


@rule(FMT, "BOOL elements are 0 or 1", scan=True)
def check_bools(s: StSubject) -> Iterator[Finding]:
    import numpy as np

    for t in s.st.tensors:
        if t.dtype != "bool" or not st_container.sound(s.st, t):
            continue
        for pos in range(0, t.nbytes, SCAN_CHUNK):
            n = min(SCAN_CHUNK, t.nbytes - pos)
            arr = np.frombuffer(s.src.buf, dtype=np.uint8, count=n, offset=t.offset + pos)
            bad = np.flatnonzero(arr > 1)
            if bad.size:
                index = pos + int(bad[0])
                yield finding(
                    st_container.ST_BOOL,
                    f"{t.name}: element {index:,} is 0x{int(arr[bad[0]]):02x}; BOOL is 0 or 1",
                    offset=t.offset + index,
                    field=f"{t.name}[{index}]",
                )
                break
