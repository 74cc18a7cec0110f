"""The Megatron-LM / NeMo indexed dataset (`PREFIX.bin` + `PREFIX.idx`, the "mmap" format of
`megatron.core.datasets.indexed_dataset`; docs/formats/megatron.md). Bytes only.

`PREFIX.bin` is the token ids of every sequence, back to back, in the index's dtype, no header.
`PREFIX.idx`, all integers little-endian:

    0x00  9  magic             b"MMIDIDX\\x00\\x00"
    0x09  8  version           1 (u64)
    0x11  1  dtype code        DTYPES below (u8)
    0x12  8  sequence_count    S (u64)
    0x1A  8  document_count    D (u64): entries of document_indices, S+1 for one sequence per
                                document (0, 1, ..., S)
    0x22     sequence_lengths  S x int32: tokens of each sequence
             sequence_pointers S x int64: byte offset of each sequence in .bin
             document_indices  D x int64: the sequence index where each document starts, then S

A multimodal index adds S int8 sequence modes after the document indices; matrixctl neither
writes nor reads that variant (the extra bytes are reported as a size mismatch).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from matrixctl import codes
from matrixctl.errors import FormatError

FORMAT = "megatron"
MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER = struct.Struct("<9sQBQQ")
HEADER_SIZE = HEADER.size
assert HEADER_SIZE == 34
# Megatron's DType enum: code -> numpy dtype (little-endian).
DTYPES: dict[int, str] = {
    1: "uint8",
    2: "int8",
    3: "int16",
    4: "int32",
    5: "int64",
    6: "float64",
    7: "float32",
    8: "uint16",
}
CODES = {name: code for code, name in DTYPES.items()}
MAX_SEQUENCE = (1 << 31) - 1  # sequence_lengths are int32

G = FORMAT
MEGATRON_HEADER = codes.define(
    "MEGATRON_HEADER",
    "A Megatron .idx whose header is cut short, has another magic or an unsupported version.",
    group=G,
)
MEGATRON_DTYPE = codes.define(
    "MEGATRON_DTYPE", "A Megatron .idx dtype code that is not one of 1-8.", group=G
)
MEGATRON_SIZE = codes.define(
    "MEGATRON_SIZE",
    "A Megatron .idx whose size is not what its counts need, or a .bin shorter or longer than "
    "the sequences the index points at.",
    group=G,
)
MEGATRON_POINTERS = codes.define(
    "MEGATRON_POINTERS",
    "Megatron sequence pointers or lengths that do not tile the .bin (a negative length, a "
    "pointer that is not the previous sequence's end).",
    group=G,
)
MEGATRON_DOCUMENTS = codes.define(
    "MEGATRON_DOCUMENTS",
    "Megatron document indices that do not start at 0, decrease, or do not end at the sequence "
    "count.",
    group=G,
)
MEGATRON_MISSING = codes.define(
    "MEGATRON_MISSING", "The .bin beside a Megatron .idx is missing.", group=G
)


@dataclass(frozen=True)
class IdxHeader:
    magic: bytes
    version: int
    dtype_code: int
    sequence_count: int
    document_count: int

    @classmethod
    def parse(cls, data: bytes) -> IdxHeader:
        if len(data) < HEADER_SIZE:
            raise FormatError(
                MEGATRON_HEADER,
                f"file is {len(data)} bytes; the .idx header needs {HEADER_SIZE}",
                offset=len(data),
            )
        return cls(*HEADER.unpack_from(data))

    @property
    def dtype(self) -> str | None:
        return DTYPES.get(self.dtype_code)

    @property
    def itemsize(self) -> int | None:
        import numpy as np

        name = self.dtype
        return None if name is None else np.dtype(name).itemsize

    def expected_size(self) -> int:
        """The .idx bytes the counts need (no sequence modes)."""
        return HEADER_SIZE + self.sequence_count * 12 + self.document_count * 8

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "dtype_code": self.dtype_code,
            "dtype": self.dtype,
            "sequence_count": self.sequence_count,
            "document_count": self.document_count,
        }


def header_bytes(dtype: str, sequences: int, documents: int) -> bytes:
    return HEADER.pack(MAGIC, VERSION, CODES[dtype], sequences, documents)


def arrays(buf: Any, h: IdxHeader) -> tuple[Any, Any, Any]:
    """Zero-copy views of (sequence_lengths, sequence_pointers, document_indices); the caller
    has checked the file size against `h.expected_size()`."""
    import numpy as np

    s, d = h.sequence_count, h.document_count
    lengths = np.frombuffer(buf, dtype="<i4", count=s, offset=HEADER_SIZE)
    pointers = np.frombuffer(buf, dtype="<i8", count=s, offset=HEADER_SIZE + 4 * s)
    docs = np.frombuffer(buf, dtype="<i8", count=d, offset=HEADER_SIZE + 12 * s)
    return lengths, pointers, docs


def bin_path(idx_path: str) -> str:
    """`PREFIX.bin` beside `PREFIX.idx`."""
    base = idx_path[:-4] if idx_path.endswith(".idx") else idx_path
    return base + ".bin"
