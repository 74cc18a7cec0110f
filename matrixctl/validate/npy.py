"""Load, describe and validate NumPy .npy files (one array)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from matrixctl.findings import Finding, finding
from matrixctl.formats import npy
from matrixctl.io import Source
from matrixctl.tensors import tensor_row
from matrixctl.validate.engine import rule

FMT = npy.NPY
SCAN_CHUNK = 8 << 20


class NpySubject:
    def __init__(self, src: Source, header: npy.NpyHeader) -> None:
        self.src = src
        self.header = header

    @property
    def complete(self) -> bool:
        return self.src.size >= self.header.data_offset + self.header.nbytes


def load(src: Source) -> NpySubject:
    head = src.head(12 + npy.MAX_HEADER)
    return NpySubject(src, npy.parse_header(head))


def describe(s: NpySubject) -> dict[str, Any]:
    h = s.header
    return {
        "size": s.src.size,
        "version": f"{h.version[0]}.{h.version[1]}",
        "descr": h.descr,
        "fortran_order": h.fortran,
        "tensors": [
            tensor_row(
                npy.tensor_name(s.src.path),
                h.dtype or None,
                h.shape,
                h.data_offset,
                h.nbytes,
                None if h.dtype else {"numpy_descr": str(h.descr)},
            )
        ],
    }


@rule(FMT, "dtype is a tensor dtype", header=True)
def check_tensor_dtype(s: NpySubject) -> Iterator[Finding]:
    yield from not_tensor(s.header, "dtype", 0)


def not_tensor(h: npy.NpyHeader, field: str, offset: int | None) -> Iterator[Finding]:
    """The third verdict's finding for an intact array whose dtype is no tensor dtype."""
    if h.unsupported is not None:
        yield finding(
            npy.NPY_NOT_TENSOR,
            f"intact, but {h.unsupported}; convert does not take it",
            offset=offset,
            field=field,
        )


@rule(FMT, "data size", cause=True)
def check_size(s: NpySubject) -> Iterator[Finding]:
    h = s.header
    end = h.data_offset + h.nbytes
    if s.src.size < end:
        yield finding(
            npy.NPY_SIZE,
            f"file is {s.src.size:,} bytes; shape {list(h.shape)} of {h.descr} needs {end:,}",
            offset=s.src.size,
            field="data",
        )
    elif s.src.size > end:
        yield finding(
            npy.NPY_TRAILING,
            f"{s.src.size - end:,} bytes follow the array data",
            offset=end,
            field="data",
        )


@rule(FMT, "bool elements are 0 or 1", scan=True)
def check_bools(s: NpySubject) -> Iterator[Finding]:
    import numpy as np

    h = s.header
    if h.dtype != "bool" or not s.complete:
        return
    arr = np.frombuffer(s.src.buf, dtype=np.uint8, count=h.nbytes, offset=h.data_offset)
    for pos in range(0, arr.size, SCAN_CHUNK):
        bad = np.flatnonzero(arr[pos : pos + SCAN_CHUNK] > 1)
        if bad.size:
            index = pos + int(bad[0])
            yield finding(
                npy.NPY_BOOL,
                f"element {index:,} is 0x{int(arr[index]):02x}; bool is 0 or 1",
                offset=h.data_offset + index,
                field=f"data[{index}]",
            )
            return
