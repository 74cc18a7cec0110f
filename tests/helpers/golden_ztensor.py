"""zTensor golden files, typed by hand from ztensor-v1.1.md (not produced by the code under test).

Every byte below was written from the spec's container diagram (part I) and the manifest tables
(part II), with the CBOR items spelled out per RFC 8949 (major type in the top 3 bits, text
strings 0x60 + length, maps 0xa0 + entries, arrays 0x80 + items). Map keys are in
deterministic order (RFC 8949 4.2.1: shorter keys first, then bytewise), which is what
docs/formats/ztensor.md says matrixctl writes. The only computed values are the CRC-32C digests,
taken from `crc32c_reference` below: a bit-by-bit implementation of the Castagnoli polynomial
written for these tests, independent of the library the codec uses.

`python tests/helpers/golden_ztensor.py` rewrites tests/golden/ztensor_*.zt from these bytes.
"""

from __future__ import annotations

import struct
from pathlib import Path


def crc32c_reference(data: bytes) -> int:
    """CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), one bit at a time."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def text(s: str) -> bytes:
    """A CBOR text string head + bytes, for strings shorter than 24 bytes."""
    raw = s.encode()
    assert len(raw) < 24
    return bytes([0x60 + len(raw)]) + raw


# Golden 1: one dense f32 tensor "w" = [1.0, 2.0], raw, with a crc32c digest. ----------------
DENSE_DATA = bytes.fromhex("0000803f00000040")  # 1.0f, 2.0f little-endian
DENSE_DIGEST = f"crc32c:0x{crc32c_reference(DENSE_DATA):08X}"
assert len(DENSE_DIGEST) == 17

DENSE_MANIFEST = (
    bytes.fromhex("a2")  # map, 2 entries
    + text("objects")
    + bytes.fromhex("a1")  # objects: map, 1 entry
    + text("w")
    + bytes.fromhex("a3")  # object: map, 3 entries
    + text("shape")
    + bytes.fromhex("8102")  # [2]
    + text("format")
    + text("dense")
    + bytes.fromhex("6a")
    + b"components"  # 10-byte text
    + bytes.fromhex("a1")  # components: 1 entry
    + text("data")
    + bytes.fromhex("a4")  # component: 4 entries, keys in deterministic order
    + text("dtype")
    + text("f32")
    + text("digest")
    + bytes.fromhex("71")
    + DENSE_DIGEST.encode()  # 17-byte text
    + text("length")
    + bytes.fromhex("08")  # 8
    + text("offset")
    + bytes.fromhex("1840")  # 64 (uint8 follows)
    + text("version")
    + text("1.1.0")
)

DENSE = (
    b"ZTEN1000"  # 0: magic
    + bytes(56)  # 8: zero padding to the first 64-byte boundary
    + DENSE_DATA  # 64: component w/data
    + DENSE_MANIFEST  # 72: the manifest follows the last blob directly
    + struct.pack("<Q", len(DENSE_MANIFEST))  # manifest size, u64 LE
    + b"ZTEN1000"  # footer magic
)

# Golden 2: three tensors, root attributes, no digests. ---------------------------------------
#   "b" bool [3] = [1, 0, 1]   at 64   (3 bytes, then 61 bytes of padding)
#   "i" i8 scalar [] = -2      at 128  (1 byte, then 63 bytes of padding)
#   "h" u16 [2] = [1, 513]     at 192  (4 bytes)
MULTI_MANIFEST = (
    bytes.fromhex("a3")  # map, 3 entries: "objects", "version", "attributes" (by length)
    + text("objects")
    + bytes.fromhex("a3")  # 3 objects, keys "b" < "h" < "i"
    + text("b")
    + bytes.fromhex("a3")
    + text("shape")
    + bytes.fromhex("8103")  # [3]
    + text("format")
    + text("dense")
    + bytes.fromhex("6a")
    + b"components"
    + bytes.fromhex("a1")
    + text("data")
    + bytes.fromhex("a3")
    + text("dtype")
    + text("bool")
    + text("length")
    + bytes.fromhex("03")
    + text("offset")
    + bytes.fromhex("1840")  # 64
    + text("h")
    + bytes.fromhex("a3")
    + text("shape")
    + bytes.fromhex("8102")  # [2]
    + text("format")
    + text("dense")
    + bytes.fromhex("6a")
    + b"components"
    + bytes.fromhex("a1")
    + text("data")
    + bytes.fromhex("a3")
    + text("dtype")
    + text("u16")
    + text("length")
    + bytes.fromhex("04")
    + text("offset")
    + bytes.fromhex("18c0")  # 192
    + text("i")
    + bytes.fromhex("a3")
    + text("shape")
    + bytes.fromhex("80")  # []: a scalar
    + text("format")
    + text("dense")
    + bytes.fromhex("6a")
    + b"components"
    + bytes.fromhex("a1")
    + text("data")
    + bytes.fromhex("a3")
    + text("dtype")
    + text("i8")
    + text("length")
    + bytes.fromhex("01")
    + text("offset")
    + bytes.fromhex("1880")  # 128
    + text("version")
    + text("1.1.0")
    + bytes.fromhex("6a")
    + b"attributes"
    + bytes.fromhex("a1")
    + text("framework")
    + text("numpy")
)

MULTI = (
    b"ZTEN1000"
    + bytes(56)
    + bytes.fromhex("010001")  # 64: b = [True, False, True]
    + bytes(61)  # 67: padding
    + bytes.fromhex("fe")  # 128: i = -2
    + bytes(63)  # 129: padding
    + bytes.fromhex("01000102")  # 192: h = [1, 513]
    + MULTI_MANIFEST  # 196
    + struct.pack("<Q", len(MULTI_MANIFEST))
    + b"ZTEN1000"
)

FILES = {"ztensor_v1_dense.zt": DENSE, "ztensor_v1_multi.zt": MULTI}

if __name__ == "__main__":
    here = Path(__file__).resolve().parents[1] / "golden"
    for name, data in FILES.items():
        (here / name).write_bytes(data)
