"""Golden EMBD and STB files, typed field by field from the specs' byte tables (not produced by
the code under test).

EMBD (embd-weights-v1.md, with the layout decisions of docs/formats/embd.md): the ten required
metadata keys, a 7-token vocabulary, and two tensors named "a" and "foobar", whose FNV-1a 32
hashes are the published test vectors of the FNV reference code (0xe40c292c, 0xbf9cf968). The
only computed values are the CRC-32s, taken from Python's own `zlib.crc32` (an independent
implementation) over the bytes the docs say each covers.

STB (stb-v0.1.md): three tensors, one of rank 4 (its dims[0] is an index into the sidecar's
shape table). `python tests/helpers/golden_embd.py` rewrites tests/golden/*.weights and *.stb.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path


def u16(n: int) -> bytes:
    return struct.pack("<H", n)


def u32(n: int) -> bytes:
    return struct.pack("<I", n)


def u64(n: int) -> bytes:
    return struct.pack("<Q", n)


def entry(key: bytes, value: bytes) -> bytes:
    return u16(len(key)) + u16(len(value)) + key + value


# Metadata section at 64: entry_count 10, total_size 205 (the entries, not the 8-byte header).
METADATA = (
    u32(10)  # 64 entry_count
    + u32(205)  # 68 total_size
    + entry(b"model_name", b"tiny")  # 72  4+10+4  = 18
    + entry(b"model_version", b"1.0.0")  # 90  4+13+5  = 22
    + entry(b"embedding_dim", b"2")  # 112 4+13+1  = 18
    + entry(b"vocab_size", b"7")  # 130 4+10+1  = 15
    + entry(b"num_layers", b"1")  # 145 4+10+1  = 15
    + entry(b"num_attention_heads", b"1")  # 160 4+19+1  = 24
    + entry(b"hidden_size", b"2")  # 184 4+11+1  = 16
    + entry(b"intermediate_size", b"4")  # 200 4+17+1  = 22
    + entry(b"max_position_emb", b"8")  # 222 4+16+1  = 21
    + entry(b"created_at", b"2025-01-16T12:00:00Z")  # 243 4+10+20 = 34 -> ends at 277
)
assert len(METADATA) == 213

TOKENS = [b"[PAD]", b"[UNK]", b"[CLS]", b"[SEP]", b"[MASK]", b"hi", b"##s"]
# Vocabulary section at 280 (277 rounded up to 8): header, the five ids at 292, tokens at 312.
VOCAB = (
    u32(7)  # 280 token_count
    + u32(45)  # 284 total_size: 5+5+5+5+6+2+3 bytes of text + 7 length prefixes
    + u32(292)  # 288 special_tokens: absolute offset of the ids (280 + 12)
    + u32(0)  # 292 pad_id   [PAD]
    + u32(1)  # 296 unk_id   [UNK]
    + u32(2)  # 300 cls_id   [CLS]
    + u32(3)  # 304 sep_id   [SEP]
    + u32(4)  # 308 mask_id  [MASK]
    + b"".join(u16(len(t)) + t for t in TOKENS)  # 312 .. 357
)
assert len(VOCAB) == 77

# Tensor index at 360 (357 rounded up to 8): two 32-byte descriptors, then the names.
INDEX = (
    u32(0xE40C292C)  # 360 name_hash: FNV-1a 32 of "a" (published test vector)
    + bytes([0])  # 364 dtype FLOAT32
    + bytes([1])  # 365 ndim 1
    + u16(1)  # 366 name_length
    + u32(2)  # 368 shape[0]
    + u32(0)  # 372 shape[1]
    + u32(0)  # 376 shape[2]
    + u32(0)  # 380 shape[3]
    + u64(0)  # 384 data_offset (relative to tensor_data_offset)
    + u32(0xBF9CF968)  # 392 name_hash: FNV-1a 32 of "foobar" (published test vector)
    + bytes([5])  # 396 dtype INT8
    + bytes([2])  # 397 ndim 2
    + u16(6)  # 398 name_length
    + u32(1)  # 400 shape[0]
    + u32(3)  # 404 shape[1]
    + u32(0)  # 408 shape[2]
    + u32(0)  # 412 shape[3]
    + u64(64)  # 416 data_offset: the next multiple of 64 after "a"'s 8 bytes
    + b"a"  # 424 names, in descriptor order
    + b"foobar"  # 425 .. 431
)
assert len(INDEX) == 71

# Tensor data at 448 (431 rounded up to 64): "a" = [1.0, 2.0], 56 zero bytes, "foobar" =
# [[1, -2, 3]]; tensor_data_size 67 ends at the last tensor's last byte.
DATA = bytes.fromhex("0000803f00000040") + bytes(56) + bytes.fromhex("01fe03")
assert len(DATA) == 67


def embd_header(checksum: int | None = None, *, flags: int = 0b0111) -> bytes:
    body = (
        b"EMBD"  # 0 magic
        + u16(1)  # 4 version_major
        + u16(0)  # 6 version_minor
        + u32(flags)  # 8 flags: VOCAB_EMBEDDED | TENSORS_ALIGNED | CHECKSUM_ENABLED
        + u32(64)  # 12 metadata_offset
        + u32(213)  # 16 metadata_size (8 + total_size)
        + u32(280)  # 20 vocab_offset
        + u32(77)  # 24 vocab_size (12 + 20 + total_size)
        + u32(360)  # 28 tensor_index_offset
        + u32(2)  # 32 tensor_index_count
        + u32(448)  # 36 tensor_data_offset
        + u64(67)  # 40 tensor_data_size
        + u64(531)  # 48 total_file_size: 448 + 67 + 16
    )
    crc = zlib.crc32(body) if checksum is None else checksum
    return body + u32(crc) + u32(0)  # 56 header_checksum (CRC-32 of bytes 0..55), 60 reserved


BEFORE_FOOTER = (
    embd_header()
    + METADATA  # 64 .. 277
    + bytes(3)  # 277 padding to 280
    + VOCAB  # 280 .. 357
    + bytes(3)  # 357 padding to 360
    + INDEX  # 360 .. 431
    + bytes(17)  # 431 padding to 448
    + DATA  # 448 .. 515
)
assert len(BEFORE_FOOTER) == 515
EMBD = (
    BEFORE_FOOTER
    + u32(zlib.crc32(DATA))  # 515 data_checksum: the tensor data section, padding included
    + u32(zlib.crc32(BEFORE_FOOTER))  # 519 file_checksum: bytes 0 .. 514
    + b"DBME"  # 523 magic_end
    + u32(0)  # 527 reserved
)
assert len(EMBD) == 531

# STB: 3 tensors; table at 32..128; data_offset 128.
STB = (
    b"STB0"  # 0 magic
    + bytes([1])  # 4 version
    + bytes([0])  # 5 flags
    + u16(3)  # 6 tensor_count
    + u32(0)  # 8 reserved0
    + u32(0)  # 12 reserved1
    + u64(128)  # 16 data_offset (32 + 3 * 32 = 128, a multiple of 64)
    + u64(260)  # 24 file_size
    # tensor 0: float32 [2] ROW_MAJOR at 128, 8 bytes
    + bytes([0, 0, 1, 0])  # 32 tensor_id 0, dtype float32, rank 1, layout ROW_MAJOR
    + u64(128)  # 36 offset
    + u64(8)  # 44 size_bytes
    + u32(2)
    + u32(0)
    + u32(0)  # 52 dims
    # tensor 1: int8 [1, 3] at 192, 3 bytes
    + bytes([1, 2, 2, 0])  # 64 tensor_id 1, dtype int8, rank 2, ROW_MAJOR
    + u64(192)  # 68 offset
    + u64(3)  # 76 size_bytes
    + u32(1)
    + u32(3)
    + u32(0)  # 84 dims
    # tensor 2: int32 [1, 1, 1, 1] (rank 4: dims[0] = shape table index 0) at 256, 4 bytes
    + bytes([2, 3, 4, 0])  # 96 tensor_id 2, dtype int32, rank 4, ROW_MAJOR
    + u64(256)  # 100 offset
    + u64(4)  # 108 size_bytes
    + u32(0)
    + u32(0)
    + u32(0)  # 116 dims: shape_id 0
    + bytes.fromhex("0000803f00000040")  # 128 tensor 0: 1.0, 2.0
    + bytes(56)  # 136 padding to 192
    + bytes.fromhex("01fe03")  # 192 tensor 1: 1, -2, 3
    + bytes(61)  # 195 padding to 256
    + u32(7)  # 256 tensor 2: 7
)
assert len(STB) == 260

# The sidecar of STB as a document (tests compare parsed JSON: whitespace is the writer's).
STB_SIDECAR = {
    "format": "matrixctl-stb-sidecar",
    "version": 1,
    "bin_files": [
        {
            "bin_file_id": 0,
            "path": "tiny.stb",
            "mmap_required": True,
            "tensor_count": 3,
            "file_size": 260,
            "crc32": f"0x{zlib.crc32(STB):08x}",
        }
    ],
    "tensors": [
        {
            "name": "a",
            "bin_file_id": 0,
            "tensor_id": 0,
            "dtype": "float32",
            "shape": [2],
            "layout": "ROW_MAJOR",
        },
        {
            "name": "foobar",
            "bin_file_id": 0,
            "tensor_id": 1,
            "dtype": "int8",
            "shape": [1, 3],
            "layout": "ROW_MAJOR",
        },
        {
            "name": "q",
            "bin_file_id": 0,
            "tensor_id": 2,
            "dtype": "int32",
            "shape": [1, 1, 1, 1],
            "layout": "ROW_MAJOR",
            "shape_id": 0,
        },
    ],
    "shape_table": [[1, 1, 1, 1]],
    "metadata": {},
}

FILES = {"embd_v1_tiny.weights": EMBD, "stb_v01_tiny.stb": STB}

if __name__ == "__main__":
    here = Path(__file__).resolve().parents[1] / "golden"
    for name, data in FILES.items():
        (here / name).write_bytes(data)
