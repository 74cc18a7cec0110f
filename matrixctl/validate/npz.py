"""Load, describe and validate NumPy .npz archives (a ZIP of .npy members)."""

from __future__ import annotations

import zipfile
import zlib
from collections.abc import Iterator
from typing import Any

from matrixctl.errors import FormatError
from matrixctl.findings import Finding, finding, from_error
from matrixctl.formats import npy
from matrixctl.io import Source
from matrixctl.tensors import tensor_row
from matrixctl.validate.engine import rule
from matrixctl.validate.npy import not_tensor

FMT = npy.NPZ


class NpzSubject:
    def __init__(self, src: Source) -> None:
        self.src = src
        self.zf: zipfile.ZipFile = npy.open_zip(src)
        self.members, self.others = npy.read_members(src, self.zf)

    def close(self) -> None:
        self.zf.close()


def load(src: Source) -> NpzSubject:
    return NpzSubject(src)


def describe(s: NpzSubject) -> dict[str, Any]:
    rows = []
    for m in s.members:
        h = m.header
        rows.append(
            tensor_row(
                m.name,
                (h.dtype or None) if h else None,
                h.shape if h else None,
                m.data_offset if m.stored else None,
                h.nbytes if h else None,
                {
                    "compression": "stored" if m.stored else "deflate",
                    "crc32": f"0x{m.info.CRC:08x}",
                },
            )
        )
    out: dict[str, Any] = {"size": s.src.size, "tensor_count": len(s.members), "tensors": rows}
    if s.others:
        out["other_members"] = ", ".join(s.others)
    return out


@rule(FMT, "members are .npy arrays with unique names")
def check_members(s: NpzSubject) -> Iterator[Finding]:
    seen: set[str] = set()
    for m in s.members:
        if m.problem is not None:
            yield from_error(m.problem)
        elif m.header is not None:
            yield from not_tensor(m.header, m.name, m.info.header_offset)
        if m.name in seen:
            yield finding(
                npy.NPZ_MEMBER,
                f"two members are named {m.info.filename!r}",
                offset=m.info.header_offset,
                field=m.info.filename,
            )
        seen.add(m.name)
    for name in s.others:
        yield finding(npy.NPZ_NON_NPY, f"member {name!r} is not an .npy array; ignored", field=name)


@rule(FMT, "member CRC-32s and bool elements", scan=True)
def check_data(s: NpzSubject) -> Iterator[Finding]:
    import numpy as np

    for m in s.members:
        if m.problem is not None or m.header is None:
            continue
        try:
            with s.zf.open(m.info) as fp:  # zipfile checks the CRC-32 at the end
                fp.read(m.header.data_offset)
                pos = 0
                flagged = False
                while True:
                    piece = fp.read(8 << 20)
                    if not piece:
                        break
                    if m.header.dtype == "bool" and not flagged:
                        arr = np.frombuffer(piece, dtype=np.uint8)
                        bad = np.flatnonzero(arr > 1)
                        if bad.size:
                            flagged = True
                            yield finding(
                                npy.NPY_BOOL,
                                f"{m.name}: element {pos + int(bad[0]):,} is "
                                f"0x{int(arr[bad[0]]):02x}; bool is 0 or 1",
                                offset=m.data_offset,
                                field=f"{m.name}[{pos + int(bad[0])}]",
                            )
                    pos += len(piece)
        except (zipfile.BadZipFile, OSError, EOFError, RuntimeError, zlib.error) as exc:
            yield from_error(
                FormatError(
                    npy.NPZ_ZIP,
                    f"{m.info.filename}: {exc}",
                    offset=m.info.header_offset,
                    field=m.info.filename,
                )
            )
