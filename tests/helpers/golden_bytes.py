"""Golden files, written out by hand from the spec's byte tables (not by the code under test).

Each byte string below was typed field by field from matrix-ingest-v1.md section 2.1 (MATRIX-ATOM)
and 4.2 (SVG-Tensor), and from docs/formats/token-stream.md; the comments give the offset and the
field. The only computed values are the CRC-32s, taken from Python's own `zlib.crc32` (an
independent implementation) over the bytes the docs say each CRC covers.
tests/golden/*.bin are these bytes; `python tests/helpers/golden_bytes.py` rewrites them.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

# Five ids, vocab_size 100, atom_size 4: padded with pad_id 0 to 8 tokens = 2 atoms, uint16.
IDS = [5, 17, 99, 0, 42]
ATOM_PAYLOAD = bytes.fromhex(
    "0500"  # token 0: 5
    "1100"  # token 1: 17
    "6300"  # token 2: 99
    "0000"  # token 3: 0
    "2a00"  # token 4: 42
    "0000"  # token 5: padding (pad_id 0)
    "0000"  # token 6: padding
    "0000"  # token 7: padding
)


def atom_header(header_crc: bytes, payload_crc: bytes) -> bytes:
    return (
        b"MTRXATOM"  # 0x00 magic
        + bytes.fromhex("0100")  # 0x08 version 1
        + bytes.fromhex("4000")  # 0x0A header_bytes 64
        + bytes.fromhex("01")  # 0x0C dtype_id 1 = uint16
        + bytes.fromhex("00")  # 0x0D flags
        + bytes.fromhex("0000")  # 0x0E reserved
        + bytes.fromhex("64000000")  # 0x10 vocab_size 100
        + bytes.fromhex("04000000")  # 0x14 atom_size 4
        + bytes.fromhex("0200000000000000")  # 0x18 atom_count 2
        + bytes.fromhex("0800000000000000")  # 0x20 token_count 8 (padding included)
        + bytes.fromhex("4000000000000000")  # 0x28 data_offset 64
        + header_crc  # 0x30 header_crc32
        + payload_crc  # 0x34 payload_crc32
        + bytes(8)  # 0x38 reserved
    )


PAYLOAD_CRC = struct.pack("<I", zlib.crc32(ATOM_PAYLOAD))
# header_crc32: CRC-32 of the 64 header bytes with bytes 0x30..0x33 zeroed (payload CRC kept).
HEADER_CRC = struct.pack("<I", zlib.crc32(atom_header(bytes(4), PAYLOAD_CRC)))
MATRIX_ATOM = atom_header(HEADER_CRC, PAYLOAD_CRC) + ATOM_PAYLOAD
# binary_pack.py's variant: header_crc32 computed with payload_crc32 zeroed as well.
LEGACY_HEADER_CRC = struct.pack("<I", zlib.crc32(atom_header(bytes(4), bytes(4))))
MATRIX_ATOM_LEGACY = atom_header(LEGACY_HEADER_CRC, PAYLOAD_CRC) + ATOM_PAYLOAD

# The same 2 atoms projected onto 2x2 grids.
SVGT = (
    b"SVGTENSR"  # 0x00 magic
    + bytes.fromhex("0100")  # 0x08 version 1
    + bytes.fromhex("2000")  # 0x0A header_bytes 32
    + bytes.fromhex("0200")  # 0x0C rows 2
    + bytes.fromhex("0200")  # 0x0E cols 2
    + bytes.fromhex("0200000000000000")  # 0x10 atom_count 2
    + bytes.fromhex("2000000000000000")  # 0x18 data_offset 32
    + ATOM_PAYLOAD  # 0x20 ids, atom by atom, row-major
)

# Token stream: ids 5 17 99 in document "a", then 0 42 in an unlabelled document.
STREAM_BEFORE_CRC = (
    b"MXTOKENS"  # 0 magic
    + bytes.fromhex("0100")  # 8 version 1
    + bytes.fromhex("01")  # 10 dtype_id uint16
    + bytes.fromhex("00")  # 11 flags
    + bytes.fromhex("64000000")  # 12 vocab_size 100
    + bytes.fromhex("0100000003000000")  # 16 TOKENS frame, 3 ids
    + bytes.fromhex("0500110063000000")  # 24 ids 5 17 99, 2 padding bytes
    + bytes.fromhex("0200000001000000")  # 32 DOC frame, label of 1 byte
    + b"a"
    + bytes(7)  # 40 label "a", 7 padding bytes
    + bytes.fromhex("0100000002000000")  # 48 TOKENS frame, 2 ids
    + bytes.fromhex("00002a0000000000")  # 56 ids 0 42, 4 padding bytes
    + bytes.fromhex("0200000000000000")  # 64 DOC frame, empty label
    + bytes.fromhex("0000000000000000")  # 72 END frame
    + bytes.fromhex("0500000000000000")  # 80 token_count 5
    + bytes.fromhex("0200000000000000")  # 88 doc_count 2
)
TOKEN_STREAM = (
    STREAM_BEFORE_CRC
    + struct.pack("<I", zlib.crc32(STREAM_BEFORE_CRC))  # 96 crc32 of bytes 0..95
    + bytes(4)  # 100 reserved
)

FILES = {
    "matrix_atom_v1.bin": MATRIX_ATOM,
    "matrix_atom_v1_legacy_crc.bin": MATRIX_ATOM_LEGACY,
    "svgt_v1.svgt": SVGT,
    "token_stream_v1.mxt": TOKEN_STREAM,
}

if __name__ == "__main__":
    here = Path(__file__).resolve().parents[1] / "golden"
    for name, data in FILES.items():
        (here / name).write_bytes(data)
