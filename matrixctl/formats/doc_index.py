"""The document index of an ingest pack (`doc_index.bin`, magic `MXDOCIDX`).

Where each document's tokens are in `matrix_atoms.bin`, and which source it came from, so a
trainer can find documents with one mmap (docs/formats/doc-index.md). All integers
little-endian.

    header (48 bytes)
      0x00  8  magic          b"MXDOCIDX"
      0x08  2  version        1
      0x0A  2  header_bytes   48
      0x0C  4  flags          0
      0x10  8  doc_count      records that follow
      0x18  8  token_count    sum of the records' token_length (the unpadded tokens)
      0x20  4  eos_id         the end-of-document id closing every document, 0xFFFFFFFF = none
      0x24  4  records_crc32  CRC-32 of the record bytes
      0x28  4  header_crc32   CRC-32 of bytes 0x00..0x2F with this field zeroed
      0x2C  4  reserved       0
    records (doc_count x 32 bytes, from 0x30)
      0   8  token_offset     first token of the document in the atom payload
      8   8  token_length     its tokens, the end-of-document token included
      16  4  source           index into the manifest's "sources" list
      20  4  reserved         0
      24  8  item             where in the source: JSON Lines line number (1-based), JSON array
                              element index (0-based), 0 for a single-document file

Records are in payload order and tile the tokens: record 0 starts at 0 and each starts where the
previous ends; the last ends at token_count.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, BinaryIO

from matrixctl import codes
from matrixctl.crc import crc32
from matrixctl.errors import FormatError

if TYPE_CHECKING:
    import numpy as np

FORMAT = "doc-index"
MAGIC = b"MXDOCIDX"
VERSION = 1
HEADER = struct.Struct("<8sHHIQQIIII")
HEADER_SIZE = HEADER.size
assert HEADER_SIZE == 48
RECORD = struct.Struct("<QQIIQ")
RECORD_SIZE = RECORD.size
assert RECORD_SIZE == 32
RECORD_DTYPE = [
    ("token_offset", "<u8"),
    ("token_length", "<u8"),
    ("source", "<u4"),
    ("reserved", "<u4"),
    ("item", "<u8"),
]
NO_EOS = 0xFFFFFFFF
FIELDS: dict[str, tuple[int, int]] = {
    "magic": (0x00, 8),
    "version": (0x08, 2),
    "header_bytes": (0x0A, 2),
    "flags": (0x0C, 4),
    "doc_count": (0x10, 8),
    "token_count": (0x18, 8),
    "eos_id": (0x20, 4),
    "records_crc32": (0x24, 4),
    "header_crc32": (0x28, 4),
    "reserved": (0x2C, 4),
}

G = FORMAT
DIDX_TRUNCATED_HEADER = codes.define(
    "DIDX_TRUNCATED_HEADER", "The file is shorter than the 48-byte document index header.", group=G
)
DIDX_VERSION = codes.define("DIDX_VERSION", "Unsupported document index version.", group=G)
DIDX_HEADER_BYTES = codes.define("DIDX_HEADER_BYTES", "header_bytes is not 48.", group=G)
DIDX_RESERVED = codes.define(
    "DIDX_RESERVED", "flags or a reserved field of the document index is not zero.", group=G
)
DIDX_HEADER_CRC = codes.define(
    "DIDX_HEADER_CRC", "header_crc32 does not match the document index header.", group=G
)
DIDX_SIZE = codes.define("DIDX_SIZE", "The file size is not 48 + 32 * doc_count bytes.", group=G)
DIDX_CRC = codes.define("DIDX_CRC", "records_crc32 does not match the records.", group=G)
DIDX_TILING = codes.define(
    "DIDX_TILING",
    "The records do not tile the tokens (a gap, an overlap, or a total other than token_count).",
    group=G,
)


@dataclass(frozen=True)
class IndexHeader:
    doc_count: int = 0
    token_count: int = 0
    eos_id: int = NO_EOS
    records_crc32: int = 0
    header_crc32: int = 0
    magic: bytes = MAGIC
    version: int = VERSION
    header_bytes: int = HEADER_SIZE
    flags: int = 0
    reserved: int = 0

    @classmethod
    def parse(cls, raw: bytes) -> IndexHeader:
        if len(raw) < HEADER_SIZE:
            raise FormatError(
                DIDX_TRUNCATED_HEADER,
                f"file has {len(raw)} bytes, the header alone needs {HEADER_SIZE}",
                offset=len(raw),
                field="header",
            )
        magic, version, hbytes, flags, docs, tokens, eos, rcrc, hcrc, res = HEADER.unpack_from(
            raw, 0
        )
        return cls(docs, tokens, eos, rcrc, hcrc, magic, version, hbytes, flags, res)

    def to_bytes(self) -> bytes:
        return HEADER.pack(
            self.magic,
            self.version,
            self.header_bytes,
            self.flags,
            self.doc_count,
            self.token_count,
            self.eos_id,
            self.records_crc32,
            self.header_crc32,
            self.reserved,
        )

    def with_crc(self) -> IndexHeader:
        return replace(self, header_crc32=header_crc(self.to_bytes()))

    def to_json(self) -> dict[str, Any]:
        return {
            "magic": self.magic.decode("latin-1"),
            "version": self.version,
            "header_bytes": self.header_bytes,
            "flags": self.flags,
            "doc_count": self.doc_count,
            "token_count": self.token_count,
            "eos_id": None if self.eos_id == NO_EOS else self.eos_id,
            "records_crc32": f"0x{self.records_crc32:08x}",
            "header_crc32": f"0x{self.header_crc32:08x}",
        }


def header_crc(raw: bytes) -> int:
    buf = bytearray(raw[:HEADER_SIZE])
    buf[0x28:0x2C] = bytes(4)
    return crc32(bytes(buf))


class IndexWriter:
    """Stream records to a seekable file; the header is written by `finish`."""

    def __init__(self, fp: BinaryIO, *, eos_id: int | None) -> None:
        self.fp = fp
        self.eos_id = NO_EOS if eos_id is None else eos_id
        self.docs = 0
        self.tokens = 0
        self.crc = 0
        fp.seek(0)
        fp.write(bytes(HEADER_SIZE))

    def add(self, length: int, source: int, item: int) -> None:
        rec = RECORD.pack(self.tokens, length, source, 0, item)
        self.fp.write(rec)
        self.crc = crc32(rec, self.crc)
        self.docs += 1
        self.tokens += length

    def add_many(self, pairs: np.ndarray, source: int, item_base: int = 0) -> None:
        """Records of one source at once, the same bytes as `add` for each: `pairs` holds
        rows of (token length, item) as uint64; `item_base` is added to every item."""
        import numpy as np

        if not len(pairs):
            return
        lengths = pairs[:, 0]
        ends = np.cumsum(lengths, dtype=np.uint64) + np.uint64(self.tokens)
        recs = np.zeros(len(pairs), dtype=np.dtype(RECORD_DTYPE))
        recs["token_offset"] = ends - lengths
        recs["token_length"] = lengths
        recs["source"] = source
        recs["item"] = pairs[:, 1] + np.uint64(item_base)
        data = recs.data.cast("B")
        self.fp.write(data)
        self.crc = crc32(data, self.crc)
        self.docs += len(pairs)
        self.tokens = int(ends[-1])

    def finish(self) -> IndexHeader:
        header = IndexHeader(self.docs, self.tokens, self.eos_id, self.crc).with_crc()
        self.fp.seek(0)
        self.fp.write(header.to_bytes())
        self.fp.seek(0, 2)
        return header


def records_view(buf: Any, header: IndexHeader) -> np.ndarray:
    """Zero-copy structured view of the records; the caller has checked the size."""
    import numpy as np

    return np.frombuffer(
        buf, dtype=np.dtype(RECORD_DTYPE), count=header.doc_count, offset=HEADER_SIZE
    )
