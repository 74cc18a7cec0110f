"""zTensor 2: the byte layout's constants, the dtype and layout tables, the codes, and the
parsed structures (`Footer`, `Part`, `Obj`, `Zt2File`)."""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field
from typing import Any

from matrixctl import codes
from matrixctl.codes import Severity
from matrixctl.findings import Problem
from matrixctl.tensors import (
    element_count,
)

FORMAT = "ztensor-v2"
MAGIC = b"\x89ZT2\r\n\x1a\n"
FOOTER = struct.Struct("<QQQII8s")  # 40 bytes
FOOTER_SIZE = FOOTER.size
MIN_SIZE = len(MAGIC) + FOOTER_SIZE
VERSION = 2
ALIGN = 4096
CANONICAL_ALIGN = 65536
MAX_MANIFEST = 1 << 30
MAX_NAME = 1024
MAX_SHARD_NAME = 64
MAX_RANK = 64
U64 = 1 << 64
ZSTD_SEEKABLE = "zt.zstd-seekable/1"
ZSTD_FRAME_MAX = 16 << 20
ZSTD_FRAME = 1 << 20  # what ztensor 2.1.2 writes, and so do we
ZSTD_LEVEL = 3
SEEK_MAGIC = 0x8F92EAB1
SEEK_SKIPPABLE = 0x184D2A5E

STORAGE: dict[str, int] = {
    "f64": 8, "f32": 4, "f16": 2, "bf16": 2,
    "i64": 8, "i32": 4, "i16": 2, "i8": 1,
    "u64": 8, "u32": 4, "u16": 2, "u8": 1,
}  # fmt: skip
# Registered logical types (Appendix A): required dtype and bytes per element (f4: half).
LOGICAL: dict[str, tuple[str, int]] = {
    "bool": ("u8", 1),
    "f8_e4m3fn": ("u8", 1),
    "f8_e5m2": ("u8", 1),
    "f8_e4m3fnuz": ("u8", 1),
    "f8_e5m2fnuz": ("u8", 1),
    "f8_e8m0": ("u8", 1),
    "f4_e2m1": ("u8", 0),  # packed: ceil(n / 2)
    "complex64": ("f32", 8),
    "complex128": ("f64", 16),
}
# (dtype, type) -> the matrixctl dtype a dense part reads as (the others have no numpy home).
MATRIX_DTYPE: dict[tuple[str, str | None], str] = {(d, None): d for d in STORAGE}
MATRIX_DTYPE |= {
    ("u8", "bool"): "bool",
    ("u8", "f8_e4m3fn"): "f8_e4m3",
    ("u8", "f8_e5m2"): "f8_e5m2",
    ("f32", "complex64"): "complex64",
    ("f64", "complex128"): "complex128",
}
TO_ZT2: dict[str, tuple[str, str | None]] = {v: k for k, v in MATRIX_DTYPE.items()}

DENSE = "dense"
CSR = "zt.sparse_csr/1"
COO = "zt.sparse_coo/1"
QUANT = "zt.quant_group/1"
MX = "zt.mx/1"
GGUF_TYPES = frozenset(
    {
        "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q8_1", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k",
        "q8_k", "iq1_s", "iq1_m", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq4_nl",
        "iq4_xs", "mxfp4",
    }
)  # fmt: skip
_GGUF_RE = re.compile(r"gguf\.([a-z0-9_]+)/1")
# matrixctl layout names of the profiles convert reads and writes.
TO_MATRIX_LAYOUT = {DENSE: "dense", CSR: "sparse_csr", COO: "sparse_coo"}
_SHARD_RE = re.compile(r"[A-Za-z0-9_\-][A-Za-z0-9._\-]{0,63}")
_DIGEST_RE = {"xxh3": re.compile(r"[0-9a-f]{16}"), "sha256": re.compile(r"[0-9a-f]{64}")}
DIGESTS = ("xxh3", "sha256")

G = FORMAT
_d = codes.define
ZT2_TRUNCATED = _d(
    "ZT2_TRUNCATED", "The file is shorter than the 48 bytes of magic and footer.", group=G
)
ZT2_MAGIC = _d(
    "ZT2_MAGIC",
    "The magic at offset 0 or at the end of the footer is not 89 5A 54 32 0D 0A 1A 0A (the "
    "footer is not at EOF: truncated or a crashed append).",
    group=G,
)
ZT2_VERSION = _d(
    "ZT2_VERSION", "The footer version is not 2, the only version this reader knows.", group=G
)
ZT2_MANIFEST_BOUNDS = _d(
    "ZT2_MANIFEST_BOUNDS",
    "The manifest blob is misplaced: outside the file, over the footer, not 4096-aligned, above "
    "1 GiB, or a data-shard footer that is not all zero.",
    group=G,
)
ZT2_MANIFEST_HASH = _d(
    "ZT2_MANIFEST_HASH",
    "The XXH3-64 of the manifest bytes differs from the footer's manifest_hash.",
    group=G,
)
ZT2_CBOR = _d(
    "ZT2_CBOR",
    "The manifest is not deterministic CBOR (RFC 8949 4.2.1): non-shortest head, indefinite "
    "length, unsorted or duplicate keys, non-canonical float, tag, non-text key, or nesting "
    "deeper than 32 levels.",
    group=G,
)
ZT2_SCHEMA = _d(
    "ZT2_SCHEMA",
    "A manifest field is missing or has the wrong type (objects, shape, layout, parts, dtype, "
    "blob, decoded_length, shards, attributes).",
    group=G,
)
ZT2_NAME = _d(
    "ZT2_NAME",
    "An object, part or attribute name is empty, longer than 1024 bytes or contains U+0000; or a "
    "shard name is outside [A-Za-z0-9._-], starts with '.', or exceeds 64 bytes.",
    group=G,
)
ZT2_SHAPE = _d(
    "ZT2_SHAPE", "A shape has rank above 64 or an element count that overflows u64.", group=G
)
ZT2_DTYPE = _d(
    "ZT2_DTYPE",
    "A part's dtype is not one of the 12 storage types, or its logical type requires another "
    "dtype.",
    group=G,
)
ZT2_TYPE_UNKNOWN = _d(
    "ZT2_TYPE_UNKNOWN",
    "A part has a logical type this reader does not know: the object is exposed structurally and "
    "never decoded.",
    group=G,
    severity=Severity.WARNING,
)
ZT2_ALIGN = _d("ZT2_ALIGN", "A blob offset is not a multiple of 4096 or is below 4096.", group=G)
ZT2_BOUNDS = _d(
    "ZT2_BOUNDS", "A blob runs past the data region (offset + length > file size - 40).", group=G
)
ZT2_OVERLAP = _d(
    "ZT2_OVERLAP",
    "Two blob references (or one and the manifest) partially overlap: they must be identical or "
    "disjoint.",
    group=G,
)
ZT2_SHARD = _d(
    "ZT2_SHARD",
    "A part names a shard the shard table does not declare (or there is no shard table), or a "
    "shard entry lacks size or digest.",
    group=G,
)
ZT2_SHARD_EXTERNAL = _d(
    "ZT2_SHARD_EXTERNAL",
    "Parts live in other shard files: checked from this manifest, but their bytes are not read.",
    group=G,
    severity=Severity.WARNING,
)
ZT2_LAYOUT_UNKNOWN = _d(
    "ZT2_LAYOUT_UNKNOWN",
    "An object's layout is not one this reader knows: it is exposed structurally and never "
    "interpreted.",
    group=G,
    severity=Severity.WARNING,
)
ZT2_PARTS = _d(
    "ZT2_PARTS",
    "An object's parts are not the set its layout requires (dense: exactly 'data'; profiles: "
    "their part tables), or parts is empty.",
    group=G,
)
ZT2_SIZE = _d(
    "ZT2_SIZE",
    "A part's decoded size disagrees with the size equation of its layout (shape, dtype, logical "
    "type, attributes).",
    group=G,
)
ZT2_PROFILE = _d(
    "ZT2_PROFILE",
    "A layout profile's attributes or part types break its rules (bits, group_size, axis, "
    "packing, scale_form, zero_point, block_size, elems_per_block...).",
    group=G,
)
ZT2_ENCODING_UNKNOWN = _d(
    "ZT2_ENCODING_UNKNOWN",
    "A part uses an encoding profile this reader does not know: it is not decoded.",
    group=G,
    severity=Severity.WARNING,
)
ZT2_DECODED_LENGTH = _d(
    "ZT2_DECODED_LENGTH",
    "decoded_length is present without an encoding or missing with one, or the encoded data "
    "decodes to another length.",
    group=G,
)
ZT2_ZSTD = _d(
    "ZT2_ZSTD",
    "A zt.zstd-seekable/1 part is invalid: bad seek table, a frame without checksum or above 16 "
    "MiB, unequal frames, a frame that fails to decode or its checksum.",
    group=G,
)
ZT2_DIGEST = _d("ZT2_DIGEST", "A part's digest does not match its decoded bytes.", group=G)
ZT2_DIGEST_FORMAT = _d(
    "ZT2_DIGEST_FORMAT",
    "A digest of a registered algorithm is malformed (xxh3: + 16 lowercase hex digits, sha256: + "
    "64).",
    group=G,
)
ZT2_DIGEST_UNKNOWN = _d(
    "ZT2_DIGEST_UNKNOWN",
    "A digest uses an algorithm that is not registered (xxh3, sha256): that part is not verified.",
    group=G,
    severity=Severity.WARNING,
)
ZT2_NO_DIGEST = _d(
    "ZT2_NO_DIGEST",
    "Parts without a digest: damage to their bytes cannot be detected.",
    group=G,
    severity=Severity.INFO,
)
ZT2_VALUES = _d(
    "ZT2_VALUES",
    "Element data breaks its type's rule: a bool byte other than 0x00/0x01, or a nonzero final "
    "odd nibble of f4_e2m1.",
    group=G,
)
ZT2_SPARSE = _d(
    "ZT2_SPARSE",
    "Sparse data breaks its profile: CSR indptr not starting at 0, decreasing or not ending at "
    "nnz, row indices not increasing or out of range; COO coordinates out of range or repeated.",
    group=G,
)
ZT2_GENERATION = _d(
    "ZT2_GENERATION",
    "An earlier generation (a superseded manifest and footer left by an append) is itself invalid.",
    group=G,
    severity=Severity.WARNING,
)
ZT2_PADDING = _d(
    "ZT2_PADDING",
    "A padding byte between blobs is not 0x00 (writers must write zeros; readers may ignore them).",
    group=G,
    severity=Severity.WARNING,
)
ZT2_NOT_READ = _d(
    "ZT2_NOT_READ",
    "An object cannot be converted: unknown layout, logical type or encoding, a profile convert "
    "does not map, or parts in another shard.",
    group=G,
)
ZT2_WRITE = _d(
    "ZT2_WRITE",
    "A tensor handed to the zTensor 2 writer is inconsistent (bytes streamed differ from the "
    "shape, duplicate name, a name that is not allowed).",
    group=G,
)
del _d


# Parsed structure ---------------------------------------------------------------------------


@dataclass(slots=True)
class Footer:
    offset: int  # of the footer itself
    manifest_offset: int
    manifest_length: int
    manifest_hash: int
    version: int
    reserved: int


@dataclass(slots=True)
class Part:
    obj: str
    role: str
    dtype: str
    type: str | None
    offset: int
    length: int
    shard: str | None
    encoding: str | None
    decoded_length: int | None
    digest: str | None
    field: str

    @property
    def end(self) -> int:
        return self.offset + self.length

    @property
    def decoded_size(self) -> int:
        return self.length if self.encoding is None else (self.decoded_length or 0)

    @property
    def local(self) -> bool:
        return self.shard is None


@dataclass(slots=True)
class Obj:
    name: str
    shape: tuple[int, ...]
    layout: str
    parts: dict[str, Part]
    attributes: dict[str, Any]

    @property
    def count(self) -> int:
        return element_count(self.shape)

    @property
    def field(self) -> str:
        return f"objects/{self.name}"


@dataclass(slots=True)
class Zt2File:
    size: int
    footer: Footer
    # The decoded manifest is not kept: the parse keeps what it checked (objects, parts,
    # attributes, shards), and the CBOR maps and arrays, about five per tensor, go with it.
    objects: dict[str, Obj]  # well-formed objects, in blob order
    attributes: dict[str, Any]
    shards: dict[str, dict[str, Any]]
    problems: list[Problem] = field(default_factory=list)

    @property
    def data_shard(self) -> bool:
        return self.footer.manifest_length == 0

    @property
    def data_end(self) -> int:
        return self.size - FOOTER_SIZE

    def parts(self) -> list[Part]:
        return [p for o in self.objects.values() for p in o.parts.values()]


# Kept defined: codes are never removed or reused (v2 files are read since this module).
ZT2_UNSUPPORTED = codes.define(
    "ZT2_UNSUPPORTED",
    "Retired: earlier versions refused every zTensor v2 file with this code; v2 is now read.",
    group=G,
)


def shown(value: Any, limit: int = 60) -> str:
    """A value from a manifest for a message: its repr, cut to about `limit` characters with
    its quotes kept and its full length said (a cut repr left a quote open)."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = (
        f"{len(value.encode('utf-8', 'surrogatepass')):,} bytes"
        if isinstance(value, str)
        else f"{len(value):,} items"
        if isinstance(value, list | tuple | dict)
        else f"{len(text):,} characters shown"
    )
    if isinstance(value, str):
        return repr(value[: max(8, limit - 12)] + "…") + f" ({size})"
    return text[: max(8, limit - 12)] + f"… ({size})"
