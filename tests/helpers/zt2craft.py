"""Hand-built zTensor 2 files for tests: the byte layout typed from the spec (section 2), not
produced by matrixctl's writer. `make` places blobs at the offsets it is given and appends a
manifest (a dict, encoded deterministically, or raw CBOR bytes) and the 40-byte footer;
`CASES` is the conformance set of docs/formats/ztensor2.md, one file per MUST / MUST NOT."""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import xxhash
import zstandard

from matrixctl import cbor

MAGIC = b"\x89ZT2\r\n\x1a\n"
A = 4096


def xxh(data: bytes) -> str:
    return f"xxh3:{xxhash.xxh3_64_hexdigest(data)}"


def make(
    blobs: dict[int, bytes],
    manifest: dict[str, Any] | bytes,
    *,
    manifest_offset: int | None = None,
    version: int = 2,
    reserved: int = 0,
    hash_value: int | None = None,
    length: int | None = None,
    head: bytes = MAGIC,
    tail_magic: bytes = MAGIC,
) -> bytes:
    out = bytearray(head)
    for off in sorted(blobs):
        if len(out) < off:
            out += bytes(off - len(out))
        out[off : off + len(blobs[off])] = blobs[off]
    raw = manifest if isinstance(manifest, bytes) else cbor.dumps(manifest)
    moff = manifest_offset if manifest_offset is not None else -(-max(len(out), A) // A) * A
    if len(out) < moff:
        out += bytes(moff - len(out))
    out[moff : moff + len(raw)] = raw
    h = xxhash.xxh3_64_intdigest(raw) if hash_value is None else hash_value
    n = len(raw) if length is None else length
    out += struct.pack("<QQQII", moff, n, h, version, reserved) + tail_magic
    return bytes(out)


def part(data: bytes, offset: int, dtype: str = "f32", **extra: Any) -> dict[str, Any]:
    p: dict[str, Any] = {"dtype": dtype, "blob": [offset, len(data)], "digest": xxh(data)}
    p.update(extra)
    return {k: v for k, v in p.items() if v is not None}


def dense(shape: list[int], p: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"shape": shape, "layout": "dense", "parts": {"data": p}, **extra}


F32 = np.arange(6, dtype="<f4").tobytes()  # 24 bytes: a [2, 3] f32 tensor


def base(obj_extra: dict[str, Any] | None = None, **root: Any) -> bytes:
    """The minimal valid file: one dense f32 [2, 3] tensor 'w' at 4096 with its xxh3."""
    obj = dense([2, 3], part(F32, A), **(obj_extra or {}))
    return make({A: F32}, {"objects": {"w": obj}, **root})


def with_part(**changes: Any) -> bytes:
    p = part(F32, A)
    p.update(changes)
    return make(
        {A: F32}, {"objects": {"w": dense([2, 3], {k: v for k, v in p.items() if v is not None})}}
    )


def seekable(
    data: bytes, frame: int = 1 << 20, checksum: bool = True, table_d: Any = None
) -> bytes:
    """A zstd seekable stream: frames of `frame` bytes and the seek table."""
    cctx = zstandard.ZstdCompressor(level=3, write_checksum=checksum, write_content_size=False)
    frames = [cctx.compress(data[i : i + frame]) for i in range(0, max(len(data), 1), frame)]
    sizes = [len(data[i : i + frame]) for i in range(0, max(len(data), 1), frame)]
    if table_d is not None:
        sizes = table_d
    entries = b"".join(struct.pack("<II", len(f), d) for f, d in zip(frames, sizes, strict=True))
    seek = entries + struct.pack("<IBI", len(frames), 0, 0x8F92EAB1)
    return b"".join(frames) + struct.pack("<II", 0x184D2A5E, len(seek)) + seek


def zstd_file(data: bytes, decoded: int | None = None, **kw: Any) -> bytes:
    blob = seekable(data, **kw)
    p = {
        "dtype": "u8",
        "blob": [A, len(blob)],
        "encoding": "zt.zstd-seekable/1",
        "decoded_length": len(data) if decoded is None else decoded,
        "digest": xxh(data),
    }
    return make({A: blob}, {"objects": {"z": dense([len(data)], p)}})


def multi(
    layout: str,
    shape: list[int],
    parts: dict[str, tuple[bytes, str, str | None]],
    attrs: dict[str, Any] | None = None,
) -> bytes:
    """An object of several parts, each (bytes, dtype, type) in its own 4096 block."""
    blobs: dict[int, bytes] = {}
    pm: dict[str, Any] = {}
    for i, (role, (data, dtype, ltype)) in enumerate(sorted(parts.items())):
        off = A * (i + 1)
        blobs[off] = data
        pm[role] = part(data, off, dtype, type=ltype)
    obj: dict[str, Any] = {"shape": shape, "layout": layout, "parts": pm}
    if attrs is not None:
        obj["attributes"] = attrs
    return make(blobs, {"objects": {"t": obj}})


def u32(*v: int) -> bytes:
    return np.array(v, dtype="<u4").tobytes()


def f32(*v: float) -> bytes:
    return np.array(v, dtype="<f4").tobytes()


def csr(
    indptr: tuple[int, ...] = (0, 1, 2, 2),
    indices: tuple[int, ...] = (0, 2),
    shape: list[int] | None = None,
) -> bytes:
    vals = f32(*range(1, len(indices) + 1))
    return multi(
        "zt.sparse_csr/1",
        shape or [3, 4],
        {
            "values": (vals, "f32", None),
            "indices": (u32(*indices), "u32", None),
            "indptr": (u32(*indptr), "u32", None),
        },
    )


def coo(coords: tuple[int, ...] = (0, 2, 1, 3), shape: list[int] | None = None) -> bytes:
    nnz = len(coords) // len(shape or [3, 4])
    return multi(
        "zt.sparse_coo/1",
        shape or [3, 4],
        {"values": (f32(*range(nnz)), "f32", None), "coords": (u32(*coords), "u32", None)},
    )


QUANT_ATTRS = {
    "bits": 4, "group_size": 32, "axis": 1,
    "packing": {"word": "u32", "order": "lsb_first", "per_word": 8},
    "scale_form": "f32_factors",
    "zero_point": {"form": "implied", "value": 8},
}  # fmt: skip


def quant(**changes: Any) -> bytes:
    attrs = {**QUANT_ATTRS, **changes}
    # shape [2, 64]: 128 codes = 16 u32 words; 2 groups x 2 lanes of f32 scales
    return multi(
        "zt.quant_group/1",
        [2, 64],
        {"data": (bytes(64), "u32", None), "scales": (f32(1, 1, 1, 1), "f32", None)},
        attrs,
    )


def mx(scale_type: str | None = "f8_e8m0", block_size: int = 32) -> bytes:
    # shape [2, 64] MXFP4: 128 nibbles = 64 bytes; 4 blocks of 32
    return multi(
        "zt.mx/1",
        [2, 64],
        {"data": (bytes(64), "u8", "f4_e2m1"), "scales": (bytes([127] * 4), "u8", scale_type)},
        {"block_size": block_size, "scale_form": "e8m0_exponent"},
    )


def gguf_q8(epb: int = 32, shape: list[int] | None = None) -> bytes:
    # [2, 64] Q8_0: 4 blocks of 34 bytes
    return multi(
        "gguf.q8_0/1",
        shape or [2, 64],
        {"data": (bytes(136), "u8", None)},
        {"elems_per_block": epb, "block_bytes": 34},
    )


def appended() -> bytes:
    """A file amended once (spec 2.5): the first generation stays, a new blob, manifest and
    footer follow; the new manifest references the old blob and the new one."""
    first = base()
    new_off = -(-len(first) // A) * A
    extra = f32(7, 8)
    objs = {"w": dense([2, 3], part(F32, A)), "z": dense([2], part(extra, new_off))}
    blobs = {new_off: extra}
    body = bytearray(first)
    for off, data in blobs.items():
        body += bytes(off - len(body)) + data
    raw = cbor.dumps({"objects": objs})
    moff = -(-len(body) // A) * A
    body += bytes(moff - len(body)) + raw
    body += struct.pack("<QQQII", moff, len(raw), xxhash.xxh3_64_intdigest(raw), 2, 0) + MAGIC
    return bytes(body)


def deep_attributes(depth: int) -> bytes:
    """Attributes nested so the deepest array sits `depth` levels below the root map."""
    value: bytes = b"\x00"
    for _ in range(depth - 2):  # root map (1) + attributes map (2) + arrays
        value = b"\x81" + value
    obj = cbor.dumps({"w": dense([2, 3], part(F32, A))})
    # {"objects": ..., "attributes": {"a": value}}: keys sorted: "objects" < "attributes"
    raw = b"\xa2" + cbor.dumps("objects") + obj + cbor.dumps("attributes") + b"\xa1\x61a" + value
    return make({A: F32}, raw)


def manifest_bytes(tamper: Callable[[bytes], bytes]) -> bytes:
    raw = cbor.dumps({"objects": {"w": dense([2, 3], part(F32, A))}})
    return make({A: F32}, tamper(raw))


def into_footer() -> bytes:
    """The manifest at 4096 and a part [4096, L] ending inside the footer."""
    n = 200
    for _ in range(3):
        obj = {"w": dense([n], {"dtype": "u8", "blob": [A, n]})}
        m = cbor.dumps({"objects": obj})
        n = len(m) + 20
    return make({}, m, manifest_offset=A)


def partial_overlap() -> bytes:
    big = bytes(8192)
    objs = {"a": dense([2048], part(big, A)), "b": dense([6], part(bytes(24), 2 * A))}
    return make({A: big}, {"objects": objs})


@dataclass(frozen=True)
class Case:
    id: str
    rule: str  # the spec statement
    build: Callable[[], bytes]
    code: str | None  # None: valid (no error finding)
    scan: bool = False  # found by verify only (reads the data)


ROOT_OBJ = {"w": dense([2, 3], part(F32, A))}
CASES: list[Case] = [
    # Valid files: what the spec allows must be read.
    Case("valid-minimal", "8: a file passing every check is read", base, None),
    Case(
        "valid-reserved",
        "2.3: readers MUST ignore the reserved field",
        lambda: make({A: F32}, {"objects": ROOT_OBJ}, reserved=7),
        None,
    ),
    Case(
        "valid-unknown-keys",
        "3.1: readers MUST ignore unknown map keys at every level",
        lambda: make(
            {A: F32},
            {
                "objects": {"w": {**dense([2, 3], {**part(F32, A), "zz": 1}), "zz": [1]}},
                "zz": {"q": 1},
            },
        ),
        None,
    ),
    Case(
        "valid-tied",
        "2.4: identical references are allowed (weight tying)",
        lambda: make(
            {A: F32},
            {"objects": {"a": dense([2, 3], part(F32, A)), "b": dense([2, 3], part(F32, A))}},
        ),
        None,
    ),
    Case(
        "valid-zero-length",
        "2.4: zero-length blobs are exempt from the overlap check",
        lambda: make(
            {A: F32},
            {"objects": {"w": dense([2, 3], part(F32, A)), "e": dense([0], part(b"", A + 4096))}},
        ),
        None,
    ),
    Case(
        "valid-coarse-align",
        "2.4: 4096 is a floor; coarser alignment is valid",
        lambda: make({65536: F32}, {"objects": {"w": dense([2, 3], part(F32, 65536))}}),
        None,
    ),
    Case(
        "valid-data-shard",
        "7.2: a data shard has an all-zero manifest footer",
        lambda: (
            MAGIC + bytes(A - 8) + F32 + bytes(8) + struct.pack("<QQQII", 0, 0, 0, 2, 0) + MAGIC
        ),
        None,
    ),
    Case(
        "valid-appended",
        "2.5: the last footer wins; earlier generations stay",
        appended,
        None,
        True,
    ),
    Case(
        "valid-unknown-layout",
        "5.2: an unknown layout MAY be exposed structurally",
        lambda: multi("acme.thing/1", [4], {"x": (f32(1), "f32", None)}),
        None,
    ),
    Case(
        "valid-unknown-type",
        "4.2: an unknown logical type is refused for decoding only",
        lambda: with_part(type="acme_f3"),
        None,
    ),
    Case(
        "valid-unknown-encoding",
        "5.3: an unknown encoding is not decoded",
        lambda: with_part(encoding="acme.lz/1", decoded_length=24),
        None,
    ),
    Case(
        "valid-zstd",
        "zt.zstd-seekable/1: a seekable stream decodes to decoded_length",
        lambda: zstd_file(bytes(range(256)) * 20000),
        None,
        True,
    ),
    Case("valid-csr", "zt.sparse_csr/1", csr, None, True),
    Case("valid-coo", "zt.sparse_coo/1", coo, None, True),
    Case("valid-quant-group", "zt.quant_group/1", quant, None, True),
    Case("valid-mx", "zt.mx/1", mx, None, True),
    Case("valid-gguf", "gguf.<type>/1", gguf_q8, None, True),
    Case(
        "valid-shard-ref",
        "7.1: a part may live in a declared shard",
        lambda: make(
            {A: F32},
            {
                "objects": {
                    "w": dense([2, 3], part(F32, A)),
                    "s": dense([2], {"dtype": "f32", "blob": [A, 8], "shard": "00001"}),
                },
                "shards": {"00001": {"size": 8192, "digest": "xxh3:0000000000000000"}},
            },
        ),
        None,
    ),
    Case(
        "valid-attribute-types",
        "3.1: attribute values: ints, text, bytes, bools, null, floats, arrays, maps",
        lambda: base(
            attributes={
                "i": -3,
                "t": "x",
                "b": b"\x01",
                "o": True,
                "n": None,
                "f": 1.5,
                "a": [1],
                "m": {"k": 0.1},
            }
        ),
        None,
    ),
    Case(
        "valid-depth-32",
        "3.1: nesting up to 32 levels from the root",
        lambda: deep_attributes(32),
        None,
    ),
    # Must reject: footer and manifest (L0, 3.1).
    Case(
        "short-file",
        "2.1: a file MUST be at least 48 bytes",
        lambda: MAGIC + bytes(39),
        "ZT2_TRUNCATED",
    ),
    Case(
        "head-magic",
        "2.2: magic at offset 0 (sniffed by it: not a zTensor 2 file)",
        lambda: b"\x89ZT3" + base()[4:],
        "UNKNOWN_FORMAT",
    ),
    Case(
        "footer-not-at-eof",
        "2.5/10: a footer not at EOF is invalid",
        lambda: base() + bytes(16),
        "ZT2_MAGIC",
    ),
    Case(
        "version-3",
        "3.6.1: version supported",
        lambda: make({A: F32}, {"objects": ROOT_OBJ}, version=3),
        "ZT2_VERSION",
    ),
    Case(
        "manifest-over-footer",
        "3.6.2: manifest inside the file, off the footer",
        lambda: make({A: F32}, {"objects": ROOT_OBJ}, length=10_000),
        "ZT2_MANIFEST_BOUNDS",
    ),
    Case(
        "manifest-over-1gib",
        "3.1: reject manifest_length above 1 GiB before parsing",
        lambda: make({A: F32}, {"objects": ROOT_OBJ}, length=(1 << 30) + 1),
        "ZT2_MANIFEST_BOUNDS",
    ),
    Case(
        "manifest-unaligned",
        "2.4: the manifest blob is a blob: offset % 4096 == 0",
        lambda: make({A: F32}, {"objects": ROOT_OBJ}, manifest_offset=A + 100),
        "ZT2_MANIFEST_BOUNDS",
    ),
    Case(
        "data-shard-nonzero",
        "7.2: a data shard's footer fields are all 0",
        lambda: make({A: F32}, {"objects": ROOT_OBJ}, length=0),
        "ZT2_MANIFEST_BOUNDS",
    ),
    Case(
        "manifest-hash",
        "3.6.2: XXH3-64 match",
        lambda: make({A: F32}, {"objects": ROOT_OBJ}, hash_value=1),
        "ZT2_MANIFEST_HASH",
    ),
    Case(
        "cbor-long-head",
        "3.1: non-shortest heads",
        lambda: manifest_bytes(lambda r: b"\xb8\x01" + r[1:]),
        "ZT2_CBOR",
    ),
    Case(
        "cbor-indefinite",
        "3.1: indefinite lengths",
        lambda: manifest_bytes(lambda r: b"\xbf" + r[1:] + b"\xff"),
        "ZT2_CBOR",
    ),
    Case(
        "cbor-key-order",
        "3.1: unsorted map keys",
        lambda: make(
            {A: F32},
            b"\xa2"
            + cbor.dumps("zzzzzzzz")
            + b"\x01"
            + cbor.dumps("objects")
            + cbor.dumps(ROOT_OBJ),
        ),
        "ZT2_CBOR",
    ),
    Case(
        "cbor-duplicate",
        "3.1/3.6.2: duplicate keys",
        lambda: make(
            {A: F32},
            b"\xa2"
            + cbor.dumps("objects")
            + cbor.dumps(ROOT_OBJ)
            + cbor.dumps("objects")
            + cbor.dumps(ROOT_OBJ),
        ),
        "ZT2_CBOR",
    ),
    Case(
        "cbor-wide-float",
        "3.1: a float wider than the value requires",
        lambda: make(
            {A: F32},
            b"\xa2"
            + cbor.dumps("objects")
            + cbor.dumps(ROOT_OBJ)
            + cbor.dumps("attributes")
            + b"\xa1\x61f\xfb"
            + struct.pack(">d", 1.5),
        ),
        "ZT2_CBOR",
    ),
    Case(
        "cbor-nan-payload",
        "3.1: NaN other than f9 7e00",
        lambda: make(
            {A: F32},
            b"\xa2"
            + cbor.dumps("objects")
            + cbor.dumps(ROOT_OBJ)
            + cbor.dumps("attributes")
            + b"\xa1\x61f\xf9\x7e\x01",
        ),
        "ZT2_CBOR",
    ),
    Case(
        "cbor-tag",
        "3.1: attribute values MUST NOT use tags",
        lambda: make(
            {A: F32},
            b"\xa2"
            + cbor.dumps("objects")
            + cbor.dumps(ROOT_OBJ)
            + cbor.dumps("attributes")
            + b"\xa1\x61t\xc1\x01",
        ),
        "ZT2_CBOR",
    ),
    Case(
        "cbor-depth-33",
        "3.1: nesting limited to 32 levels from the root",
        lambda: deep_attributes(33),
        "ZT2_CBOR",
    ),
    Case(
        "cbor-depth-10000",
        "3.1 (hostile): nested CBOR 10,000 deep",
        lambda: deep_attributes(10_000),
        "ZT2_CBOR",
    ),
    Case(
        "cbor-int-key",
        "3.1 (decision): map keys are text",
        lambda: make(
            {A: F32}, b"\xa2" + b"\x01\x01" + cbor.dumps("objects") + cbor.dumps(ROOT_OBJ)
        ),
        "ZT2_CBOR",
    ),
    # Must reject: schema (3.2-3.5).
    Case(
        "no-objects",
        "3.2: objects is required",
        lambda: make({A: F32}, {"attributes": {}}),
        "ZT2_SCHEMA",
    ),
    Case(
        "attributes-not-map",
        "3.1: attributes MUST be a map",
        lambda: base(attributes=[1]),
        "ZT2_SCHEMA",
    ),
    Case(
        "blob-three",
        "3.4: reject a blob array of any other length",
        lambda: with_part(blob=[A, 24, 0]),
        "ZT2_SCHEMA",
    ),
    Case(
        "parts-empty",
        "3.3: parts MUST be non-empty",
        lambda: make({A: F32}, {"objects": {"w": {"shape": [1], "layout": "dense", "parts": {}}}}),
        "ZT2_PARTS",
    ),
    Case(
        "rank-65",
        "3.3: rank MUST be <= 64",
        lambda: make({A: F32}, {"objects": {"w": dense([1] * 65, part(F32, A))}}),
        "ZT2_SHAPE",
    ),
    Case(
        "shape-overflow",
        "3.3: the element count MUST NOT overflow u64",
        lambda: make({A: F32}, {"objects": {"w": dense([1 << 32, 1 << 32], part(F32, A))}}),
        "ZT2_SHAPE",
    ),
    Case(
        "name-empty",
        "3.5: names are non-empty",
        lambda: make({A: F32}, {"objects": {"": dense([2, 3], part(F32, A))}}),
        "ZT2_NAME",
    ),
    Case(
        "name-nul",
        "3.5: names contain no U+0000",
        lambda: make({A: F32}, {"objects": {"a\x00b": dense([2, 3], part(F32, A))}}),
        "ZT2_NAME",
    ),
    Case(
        "name-long",
        "3.5: names are at most 1024 bytes",
        lambda: make({A: F32}, {"objects": {"é" * 513: dense([2, 3], part(F32, A))}}),
        "ZT2_NAME",
    ),
    Case(
        "attribute-key-empty",
        "3.1/3.5: attribute keys obey the name rules",
        lambda: base(attributes={"": 1}),
        "ZT2_NAME",
    ),
    Case(
        "dtype-unknown",
        "4.1: dtype is one of the 12 primitives",
        lambda: with_part(dtype="bool"),
        "ZT2_DTYPE",
    ),
    Case(
        "type-wrong-dtype",
        "4.2/A: a logical type requires its dtype",
        lambda: with_part(type="bool"),
        "ZT2_DTYPE",
    ),
    Case(
        "decoded-length-no-encoding",
        "3.4: decoded_length present iff encoding",
        lambda: with_part(decoded_length=24),
        "ZT2_DECODED_LENGTH",
    ),
    Case(
        "encoding-no-decoded-length",
        "3.4: decoded_length present iff encoding",
        lambda: with_part(encoding="zt.zstd-seekable/1"),
        "ZT2_DECODED_LENGTH",
    ),
    Case(
        "digest-uppercase",
        "3.4: digest is <algorithm>:<lowercase hex>",
        lambda: with_part(digest=xxh(F32).upper().replace("XXH3", "xxh3")),
        "ZT2_DIGEST_FORMAT",
    ),
    # Must reject: blob references (2.4, 3.6.3-4).
    Case(
        "blob-unaligned",
        "2.4: offset % 4096 == 0",
        lambda: make({A + 64: F32}, {"objects": {"w": dense([2, 3], part(F32, A + 64))}}),
        "ZT2_ALIGN",
    ),
    Case("blob-below-4096", "2.4: offset >= 4096", lambda: with_part(blob=[0, 24]), "ZT2_ALIGN"),
    Case("blob-into-footer", "2.4: offset + length <= file_size - 40", into_footer, "ZT2_BOUNDS"),
    Case(
        "blob-2-62",
        "2.4 (hostile): a part claiming 2^62 bytes",
        lambda: with_part(blob=[A, 1 << 62]),
        "ZT2_BOUNDS",
    ),
    Case(
        "blob-escapes",
        "2.4 (hostile): hash matches, a part escapes the file",
        lambda: with_part(blob=[1 << 40, 24]),
        "ZT2_BOUNDS",
    ),
    Case(
        "blob-partial-overlap",
        "2.4: partial overlap MUST be rejected",
        partial_overlap,
        "ZT2_OVERLAP",
    ),
    Case(
        "blob-over-manifest",
        "3.6.4: references plus the manifest blob are disjoint",
        lambda: make(
            {A: F32},
            {
                "objects": {
                    "w": dense([6], part(F32, A)),
                    "m": dense([1], {"dtype": "f32", "blob": [2 * A, 4]}),
                }
            },
        ),
        "ZT2_OVERLAP",
    ),
    Case(
        "shard-undeclared",
        "3.4/7.1: reject a shard name the table does not declare",
        lambda: with_part(shard="00002"),
        "ZT2_SHARD",
    ),
    Case(
        "shard-bad-name",
        "7.1: shard names are [A-Za-z0-9._-], not starting with '.'",
        lambda: base(shards={"../etc": {"size": 1, "digest": "xxh3:0000000000000000"}}),
        "ZT2_NAME",
    ),
    Case(
        "shard-no-digest",
        "7.1: every shard entry carries size and digest",
        lambda: base(shards={"00001": {"size": 1}}),
        "ZT2_SHARD",
    ),
    Case(
        "shard-bad-digest",
        "7.1/3.4: a shard digest is <algorithm>:<lowercase hex>",
        lambda: base(shards={"00001": {"size": 1, "digest": "xxh3:XYZ"}}),
        "ZT2_DIGEST_FORMAT",
    ),
    # Must reject: layouts (5.1, profiles).
    Case(
        "dense-size",
        "5.1: decoded size == size function(num_elements)",
        lambda: make({A: F32}, {"objects": {"w": dense([2, 2], part(F32, A))}}),
        "ZT2_SIZE",
    ),
    Case(
        "dense-two-parts",
        "5.1: exactly one part named data",
        lambda: multi("dense", [6], {"data": (F32, "f32", None), "x": (F32, "f32", None)}),
        "ZT2_PARTS",
    ),
    Case(
        "csr-rank-3", "zt.sparse_csr/1: rank exactly 2", lambda: csr(shape=[3, 4, 1]), "ZT2_PROFILE"
    ),
    Case(
        "csr-indptr-size",
        "zt.sparse_csr/1: indptr is R + 1 elements",
        lambda: csr(indptr=(0, 1, 2)),
        "ZT2_SIZE",
    ),
    Case(
        "csr-indptr-start",
        "zt.sparse_csr/1: indptr[0] == 0, indptr[R] == nnz",
        lambda: csr(indptr=(1, 1, 2, 2)),
        "ZT2_SPARSE",
        True,
    ),
    Case(
        "csr-indices-order",
        "zt.sparse_csr/1: indices strictly increasing in a row",
        lambda: csr(indptr=(0, 2, 2, 2), indices=(2, 0)),
        "ZT2_SPARSE",
        True,
    ),
    Case(
        "csr-index-range",
        "zt.sparse_csr/1: every index < C",
        lambda: csr(indices=(0, 4)),
        "ZT2_SPARSE",
        True,
    ),
    Case(
        "coo-rank-0",
        "zt.sparse_coo/1: rank >= 1",
        lambda: multi(
            "zt.sparse_coo/1",
            [],
            {"values": (f32(1), "f32", None), "coords": (u32(0), "u32", None)},
        ),
        "ZT2_PROFILE",
    ),
    Case(
        "coo-range",
        "zt.sparse_coo/1: coordinates < shape[d]",
        lambda: coo(coords=(0, 3, 1, 3)),
        "ZT2_SPARSE",
        True,
    ),
    Case(
        "coo-unique",
        "zt.sparse_coo/1: coordinates unique",
        lambda: coo(coords=(1, 1, 2, 2)),
        "ZT2_SPARSE",
        True,
    ),
    Case(
        "quant-bits",
        "zt.quant_group/1: bits in {2,3,4,5,6,8}, dividing the word",
        lambda: quant(bits=7),
        "ZT2_PROFILE",
    ),
    Case(
        "quant-zeros-missing",
        "zt.quant_group/1: zeros iff zero_point.form is tensor",
        lambda: quant(zero_point={"form": "tensor", "packing": "plain"}),
        "ZT2_PARTS",
    ),
    Case(
        "mx-scale-type",
        "zt.mx/1: scales are u8 f8_e8m0",
        lambda: mx(scale_type=None),
        "ZT2_PROFILE",
    ),
    Case(
        "mx-block",
        "zt.mx/1: block_size >= 2 divides shape[axis]",
        lambda: mx(block_size=3),
        "ZT2_PROFILE",
    ),
    Case(
        "gguf-block",
        "gguf.<type>/1: elems_per_block divides the fastest dimension",
        lambda: gguf_q8(shape=[4, 32], epb=64),
        "ZT2_PROFILE",
    ),
    # Must reject: data (verify).
    Case(
        "digest-mismatch",
        "3.4/8: digest over decoded bytes",
        lambda: with_part(digest=xxh(b"x")),
        "ZT2_DIGEST",
        True,
    ),
    Case(
        "bool-byte",
        "A: bool values are 0x00 or 0x01",
        lambda: make(
            {A: bytes([0, 1, 2])},
            {"objects": {"b": dense([3], part(bytes([0, 1, 2]), A, "u8", type="bool"))}},
        ),
        "ZT2_VALUES",
        True,
    ),
    Case(
        "f4-nibble",
        "A: the final odd nibble of f4_e2m1 is zero",
        lambda: make(
            {A: b"\x21\x43\x65\xf7"},
            {"objects": {"q": dense([7], part(b"\x21\x43\x65\xf7", A, "u8", type="f4_e2m1"))}},
        ),
        "ZT2_VALUES",
        True,
    ),
    Case(
        "zstd-no-checksum",
        "zt.zstd-seekable/1: every frame carries a checksum",
        lambda: zstd_file(bytes(1000), checksum=False),
        "ZT2_ZSTD",
        True,
    ),
    Case(
        "zstd-length",
        "3.4/8.1: decoded output exactly decoded_length",
        lambda: zstd_file(bytes(1000), decoded=999),
        "ZT2_SIZE",
    ),
    Case(
        "zstd-table-length",
        "3.4/8.1: decoded output exactly decoded_length",
        lambda: zstd_file(bytes(1000), table_d=[1001]),
        "ZT2_DECODED_LENGTH",
        True,
    ),
    Case(
        "zstd-unequal",
        "zt.zstd-seekable/1: all frames but the last equal",
        lambda: zstd_file(bytes(3000), frame=1000, table_d=[1000, 900, 1100]),
        "ZT2_ZSTD",
        True,
    ),
    Case(
        "zstd-frame-16mib",
        "zt.zstd-seekable/1: frame content <= 16 MiB",
        lambda: zstd_file(bytes(1000), table_d=[(16 << 20) + 1]),
        "ZT2_ZSTD",
        True,
    ),
]
