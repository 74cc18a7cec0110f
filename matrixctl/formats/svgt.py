"""SVG-Tensor v1: the grid projection of MATRIX-ATOM atoms (matrix-ingest-v1.md section 4).

Byte layout (little-endian), resolved as docs/formats/svgt.md explains:

    off  size field         value
    0x00  8   magic         b"SVGTENSR"
    0x08  2   version       1
    0x0A  2   header_bytes  32
    0x0C  2   rows          grid rows, >= 1
    0x0E  2   cols          grid cols, >= 1 (rows * cols = the source's atom_size)
    0x10  8   atom_count    atoms in the payload
    0x18  8   data_offset   32
    0x20  ..  payload       atom_count * rows * cols uint16 ids, atom by atom, row-major

The payload is uint16 only: an id above 65535 cannot be projected, and packing such a file is an
error (the spec's reference tool masks ids with `& 0xFFFF`; matrixctl never does).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO

from matrixctl import codes
from matrixctl.errors import FormatError, UsageError

if TYPE_CHECKING:
    import numpy as np

FORMAT = "svgt"
MAGIC = b"SVGTENSR"
VERSION = 1
HEADER_SIZE = 32
HEADER = struct.Struct("<8sHHHHQQ")
assert HEADER.size == HEADER_SIZE
ITEM = "<u2"
MAX_DIM = (1 << 16) - 1

FIELDS: dict[str, tuple[int, int]] = {
    "magic": (0x00, 8),
    "version": (0x08, 2),
    "header_bytes": (0x0A, 2),
    "rows": (0x0C, 2),
    "cols": (0x0E, 2),
    "atom_count": (0x10, 8),
    "data_offset": (0x18, 8),
}

G = FORMAT
SVGT_TRUNCATED_HEADER = codes.define(
    "SVGT_TRUNCATED_HEADER", "The file is shorter than the 32-byte SVG-Tensor header.", group=G
)
SVGT_VERSION = codes.define("SVGT_VERSION", "Unsupported SVG-Tensor version (v1 only).", group=G)
SVGT_HEADER_BYTES = codes.define("SVGT_HEADER_BYTES", "header_bytes is not 32.", group=G)
SVGT_GRID = codes.define("SVGT_GRID", "rows or cols is 0.", group=G)
SVGT_DATA_OFFSET = codes.define("SVGT_DATA_OFFSET", "data_offset is not 32.", group=G)
SVGT_TRUNCATED = codes.define(
    "SVGT_TRUNCATED", "The file ends before atom_count * rows * cols ids.", group=G
)
SVGT_TRAILING = codes.define("SVGT_TRAILING", "Bytes follow the last declared atom.", group=G)
SVGT_ID_OVERFLOW = codes.define(
    "SVGT_ID_OVERFLOW", "A token id above 65535 cannot be stored in an SVG-Tensor.", group=G
)
SVGT_MISMATCH = codes.define(
    "SVGT_MISMATCH", "The SVG-Tensor does not match the MATRIX-ATOM file it projects.", group=G
)


@dataclass(frozen=True)
class SvgtHeader:
    rows: int
    cols: int
    atom_count: int
    magic: bytes = MAGIC
    version: int = VERSION
    header_bytes: int = HEADER_SIZE
    data_offset: int = HEADER_SIZE

    @classmethod
    def parse(cls, raw: bytes) -> SvgtHeader:
        if len(raw) < HEADER_SIZE:
            raise FormatError(
                SVGT_TRUNCATED_HEADER,
                f"file has {len(raw)} bytes, the header alone needs {HEADER_SIZE}",
                offset=len(raw),
                field="header",
            )
        magic, version, hbytes, rows, cols, atoms, offset = HEADER.unpack_from(raw, 0)
        return cls(rows, cols, atoms, magic, version, hbytes, offset)

    def to_bytes(self) -> bytes:
        return HEADER.pack(
            self.magic,
            self.version,
            self.header_bytes,
            self.rows,
            self.cols,
            self.atom_count,
            self.data_offset,
        )

    @property
    def atom_size(self) -> int:
        return self.rows * self.cols

    @property
    def payload_bytes(self) -> int:
        return self.atom_count * self.atom_size * 2

    def to_json(self) -> dict[str, Any]:
        return {
            "magic": self.magic.decode("latin-1"),
            "version": self.version,
            "header_bytes": self.header_bytes,
            "rows": self.rows,
            "cols": self.cols,
            "atom_count": self.atom_count,
            "data_offset": self.data_offset,
        }


def parse_grid(text: str, atom_size: int | None = None) -> tuple[int, int]:
    """`RxC` -> (rows, cols); checks the range and, when given, rows * cols == atom_size."""
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise UsageError(f"--grid must look like ROWSxCOLS (for example 16x16), got {text!r}")
    rows, cols = (int(p) for p in parts)
    if not (1 <= rows <= MAX_DIM and 1 <= cols <= MAX_DIM):
        raise UsageError(f"--grid rows and cols must be between 1 and {MAX_DIM}, got {text!r}")
    if atom_size is not None and rows * cols != atom_size:
        raise UsageError(
            f"--grid {rows}x{cols} holds {rows * cols} tokens but the atoms have {atom_size}",
            hint=f"pick ROWSxCOLS with ROWS * COLS = {atom_size}",
        )
    return rows, cols


def atoms_view(buf: Any, header: SvgtHeader) -> np.ndarray:
    """Zero-copy (atom_count, rows, cols) view; the caller has checked the size."""
    import numpy as np

    flat = np.frombuffer(
        buf, dtype=ITEM, count=header.atom_count * header.atom_size, offset=header.data_offset
    )
    return flat.reshape(header.atom_count, header.rows, header.cols)


def write_svgt(
    fp: BinaryIO, chunks: Iterator[np.ndarray], *, rows: int, cols: int, atom_count: int
) -> SvgtHeader:
    """Write the header and the ids from `chunks`; every id must fit uint16 (never masked)."""
    import numpy as np

    header = SvgtHeader(rows, cols, atom_count)
    fp.write(header.to_bytes())
    written = 0
    for chunk in chunks:
        if chunk.size and int(chunk.max()) > MAX_DIM:
            bad = int(np.argmax(chunk > MAX_DIM))
            index = written + bad
            raise FormatError(
                SVGT_ID_OVERFLOW,
                f"token {index} (id {int(chunk[bad])}) is above 65535 and cannot be projected "
                "(SVG-Tensor stores uint16; ids are never truncated)",
                field=f"token[{index}]",
            )
        fp.write(np.ascontiguousarray(chunk, dtype=ITEM).data.cast("B"))
        written += chunk.size
    if written != atom_count * rows * cols:
        raise FormatError(
            SVGT_MISMATCH, f"wrote {written} ids, the header declares {atom_count * rows * cols}"
        )
    return header
