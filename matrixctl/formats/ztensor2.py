"""zTensor 2 (`.zt`, ztensor 2.x): blobs, a deterministic CBOR manifest, a 40-byte footer.

Byte layout (spec: shared/specs/ztensor-v2/ztensor-v2-spec.md; decisions in
docs/formats/ztensor2.md; integers little-endian):

    offset          size     field
    0               8        magic 89 5A 54 32 0D 0A 1A 0A
    4096 k (k >= 1) length   blobs (tensor parts, the manifest), zero padding between them
    EOF - 40        8        manifest_offset (u64)
    EOF - 32        8        manifest_length (u64)
    EOF - 24        8        manifest_hash: XXH3-64 of the manifest bytes (u64)
    EOF - 16        4        version (u32) = 2
    EOF - 12        4        reserved (u32), ignored
    EOF - 8         8        magic again

    manifest: {objects: {name: {shape, layout, parts: {role: part}, attributes?}},
               shards?: {name: {size, digest}}, attributes?}
    part: {dtype, type?, blob: [offset, length], shard?, encoding?, decoded_length?, digest?}

Layouts: `dense` and the profiles `zt.sparse_csr/1`, `zt.sparse_coo/1`, `zt.quant_group/1`,
`zt.mx/1`, `gguf.<type>/1`; encoding profile `zt.zstd-seekable/1`. Digests (`xxh3:<16 hex>`,
`sha256:<64 hex>`) cover the decoded bytes.

This module parses (`parse`: every check that decides which bytes are read later), streams
parts (`stream_part`) and writes (`Zt2Writer`, `Zt2Sink`). Judging a file is
`matrixctl.validate.ztensor2`.
"""

from __future__ import annotations

import collections
import contextlib
import operator
import re
import struct
import threading
import unicodedata
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, BinaryIO

from matrixctl import cbor, codes
from matrixctl.codes import Severity
from matrixctl.errors import FormatError, UsageError
from matrixctl.findings import Problem
from matrixctl.tensors import (
    CHUNK_BYTES,
    DTYPES,
    Component,
    Outputs,
    PartStreams,
    TensorInfo,
    TensorSink,
    TensorSource,
    copy_stream,
    drop_pages,
    element_count,
    mapped_chunks,
    read_pieces,
    storage_array,
)

if TYPE_CHECKING:
    from matrixctl.io import Source

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


def read_footer(buf: Any, size: int, *, end: int | None = None) -> Footer:
    """The footer ending at `end` (EOF by default) after the L0 checks (spec 2.1-2.3, 8 steps
    1-4): size, both magics, version, manifest bounds and cap. The hash is checked by
    `read_manifest`."""
    end = size if end is None else end
    if end < MIN_SIZE:
        raise FormatError(
            ZT2_TRUNCATED,
            f"file is {end} bytes; magic and footer alone need {MIN_SIZE}",
            offset=end,
            field="footer",
        )
    if bytes(buf[:8]) != MAGIC:
        raise FormatError(
            ZT2_MAGIC, "the file does not start with the zTensor 2 magic", offset=0, field="magic"
        )
    at = end - FOOTER_SIZE
    moff, mlen, mhash, version, reserved, magic = FOOTER.unpack(bytes(buf[at:end]))
    if magic != MAGIC:
        raise FormatError(
            ZT2_MAGIC,
            "the last 8 bytes are not the zTensor 2 magic: the footer is not at EOF (a truncated "
            "file or a crashed append; there is no recovery)",
            offset=end - 8,
            field="footer.magic",
        )
    if version != VERSION:
        raise FormatError(
            ZT2_VERSION,
            f"footer version {version}: this reader knows version 2 only",
            offset=at + 24,
            field="footer.version",
        )
    f = Footer(at, moff, mlen, mhash, version, reserved)
    if mlen == 0:
        if moff or mhash:
            raise FormatError(
                ZT2_MANIFEST_BOUNDS,
                f"manifest_length is 0 (a data shard) but manifest_offset is {moff} and "
                f"manifest_hash 0x{mhash:016x}: a data shard has all three zero",
                offset=at,
                field="footer.manifest_offset",
            )
        return f
    if mlen > MAX_MANIFEST:
        raise FormatError(
            ZT2_MANIFEST_BOUNDS,
            f"manifest_length {mlen:,} exceeds the 1 GiB cap: refusing to read it",
            offset=at + 8,
            field="footer.manifest_length",
        )
    if moff % ALIGN or moff < ALIGN:
        raise FormatError(
            ZT2_MANIFEST_BOUNDS,
            f"manifest_offset {moff:,} is not a multiple of 4096 at or above 4096",
            offset=at,
            field="footer.manifest_offset",
        )
    if moff + mlen > at:
        raise FormatError(
            ZT2_MANIFEST_BOUNDS,
            f"manifest bytes {moff:,}..{moff + mlen:,} run past the data region, which ends at "
            f"the footer ({at:,})",
            offset=at,
            field="footer.manifest_length",
        )
    return f


def manifest_hash(data: Any) -> int:
    import xxhash

    value: int = xxhash.xxh3_64_intdigest(data)
    return value


def read_manifest(buf: Any, f: Footer) -> dict[str, Any]:
    """The manifest map: hash checked, deterministic CBOR decoded (spec 8 steps 4-5)."""
    if f.manifest_length == 0:
        return {}
    raw = memoryview(buf)[f.manifest_offset : f.manifest_offset + f.manifest_length]
    try:
        got = manifest_hash(raw)
        if got != f.manifest_hash:
            raise FormatError(
                ZT2_MANIFEST_HASH,
                f"manifest XXH3-64 is 0x{got:016x}, the footer says 0x{f.manifest_hash:016x}",
                offset=f.offset + 16,
                field="footer.manifest_hash",
            )
        try:
            root = cbor.loads_deterministic(raw)
        except cbor.CborError as err:
            raise FormatError(
                ZT2_CBOR,
                f"manifest: {err.message}",
                offset=f.manifest_offset + err.offset,
                field="manifest",
            ) from None
    finally:
        raw.release()
    if not isinstance(root, dict):
        raise FormatError(
            ZT2_SCHEMA,
            f"the manifest is a CBOR {type(root).__name__}, not a map",
            offset=f.manifest_offset,
            field="manifest",
        )
    return root


def _uint(value: Any) -> bool:
    return type(value) is int and 0 <= value < U64


def _uint_list(values: list[Any]) -> bool:
    """Whether every item is a u64 (`_uint`): one loop, no generator (a shape per object)."""
    for v in values:  # noqa: SIM110
        if type(v) is not int or not 0 <= v < U64:
            return False
    return True


def name_problem(name: str) -> str | None:
    """Why `name` breaks the name rules of spec 3.5 (None: it does not)."""
    if not name:
        return "is empty"
    if "\x00" in name:
        return "contains U+0000"
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME:
        return f"is longer than {MAX_NAME} bytes"
    return None


def parse(buf: Any, size: int, *, end: int | None = None) -> Zt2File:
    """Footer, manifest and schema. Raises FormatError when nothing can be checked; other
    problems are collected in `problems` (the object concerned is left out of `objects`)."""
    end = size if end is None else end
    f = read_footer(buf, size, end=end)
    root = read_manifest(buf, f)
    zt = Zt2File(end, f, {}, {}, {})
    if f.manifest_length == 0:
        return zt
    at = f.manifest_offset
    probs = zt.problems

    def bad(code: str, message: str, where: str) -> None:
        probs.append(Problem(code, message, at, where))

    objects = root.get("objects")
    if not isinstance(objects, dict):
        raise FormatError(
            ZT2_SCHEMA, "the manifest has no map 'objects' (required)", offset=at, field="objects"
        )
    if "attributes" in root:
        zt.attributes = _attributes(root["attributes"], "attributes", bad) or {}
    shards = root.get("shards")
    if shards is not None:
        if not isinstance(shards, dict):
            bad(ZT2_SCHEMA, "'shards' is not a map", "shards")
        else:
            for name, entry in shards.items():
                where = f"shards/{name}"
                if not _SHARD_RE.fullmatch(name):
                    bad(ZT2_NAME, f"shard name {name!r:.80} is not allowed", where)
                    continue
                if not isinstance(entry, dict):
                    bad(ZT2_SHARD, f"shard {name!r}: entry is not a map", where)
                    continue
                if not _uint(entry.get("size")) or not isinstance(entry.get("digest"), str):
                    bad(ZT2_SHARD, f"shard {name!r}: size (u64) and digest (text) required", where)
                    continue
                try:
                    parse_digest(entry["digest"])
                except ValueError as exc:
                    bad(ZT2_DIGEST_FORMAT, f"shard {name!r}: digest is malformed: {exc}", where)
                    continue
                zt.shards[name] = entry
    # Blob order: by the first offset of the object's parts in this file (0 without one),
    # then by name.
    keyed: list[tuple[int, str, Obj]] = []
    for name, obj in objects.items():
        got = _object(name, obj, shards, bad)
        if got is not None:
            first: int | None = None
            for p in got.parts.values():
                if p.shard is None and (first is None or p.offset < first):
                    first = p.offset
            keyed.append((first or 0, got.name, got))
    keyed.sort(key=_by_first_two)
    zt.objects = {name: o for _, name, o in keyed}
    return zt


_by_first_two = operator.itemgetter(0, 1)


def _attributes(value: Any, where: str, bad: Any) -> dict[str, Any] | None:
    if not isinstance(value, dict):
        bad(ZT2_SCHEMA, f"{where} is not a map", where)
        return None
    for key in value:
        why = name_problem(key)
        if why:
            bad(ZT2_NAME, f"attribute key {key!r:.60} {why}", f"{where}/{key}")
            return None
    return value


def _object(name: str, obj: Any, shards: Any, bad: Any) -> Obj | None:
    where = f"objects/{name}"
    # A name of at most MAX_NAME / 4 characters without U+0000 is allowed (name_problem);
    # anything else is asked.
    if not (type(name) is str and name and len(name) * 4 <= MAX_NAME and "\x00" not in name):
        why = name_problem(name)
        if why:
            bad(ZT2_NAME, f"object name {name!r:.60} {why}", where)
            return None
    if not isinstance(obj, dict):
        bad(ZT2_SCHEMA, f"object {name!r}: not a map", where)
        return None
    shape = obj.get("shape")
    if type(shape) is not list or not _uint_list(shape):
        bad(
            ZT2_SCHEMA,
            f"object {name!r}: shape must be an array of u64, got {shape!r:.60}",
            f"{where}/shape",
        )
        return None
    if len(shape) > MAX_RANK:
        bad(ZT2_SHAPE, f"object {name!r}: rank {len(shape)} exceeds 64", f"{where}/shape")
        return None
    if element_count(shape) >= U64:
        bad(
            ZT2_SHAPE,
            f"object {name!r}: element count of {shape!r:.60} overflows u64",
            f"{where}/shape",
        )
        return None
    layout = obj.get("layout")
    if not isinstance(layout, str):
        bad(ZT2_SCHEMA, f"object {name!r}: 'layout' (text) is required", f"{where}/layout")
        return None
    attributes: dict[str, Any] = {}
    if "attributes" in obj:
        got = _attributes(obj["attributes"], f"{where}/attributes", bad)
        if got is None:
            return None
        attributes = got
    parts = obj.get("parts")
    if not isinstance(parts, dict):
        bad(ZT2_SCHEMA, f"object {name!r}: 'parts' (map) is required", f"{where}/parts")
        return None
    if not parts:
        bad(ZT2_PARTS, f"object {name!r}: parts is empty", f"{where}/parts")
        return None
    out: dict[str, Part] = {}
    for role, part in parts.items():
        p = _part(name, role, part, shards, bad)
        if p is None:
            return None
        out[role] = p
    return Obj(name, tuple(shape), layout, out, attributes)


def _part(name: str, role: str, part: Any, shards: Any, bad: Any) -> Part | None:
    where = f"objects/{name}/parts/{role}"
    # A part of this file without a logical type or an encoding, every field well-formed (the
    # decoder gives exact types: bool is not an int), is made at once; anything else goes
    # through the checks below, which say what is wrong. A name of at most MAX_NAME / 4
    # characters cannot exceed MAX_NAME bytes in UTF-8.
    if (
        type(part) is dict
        and type(role) is str
        and role
        and len(role) * 4 <= MAX_NAME
        and "\x00" not in role
        and type(dtype := part.get("dtype")) is str
        and dtype in STORAGE
        and type(blob := part.get("blob")) is list
        and len(blob) == 2
        and type(offset := blob[0]) is int
        and 0 <= offset < U64
        and type(length := blob[1]) is int
        and 0 <= length < U64
        and ((digest := part.get("digest")) is None or type(digest) is str)
        and _PLAIN_KEYS.issuperset(part)
    ):
        return Part(name, role, dtype, None, offset, length, None, None, None, digest, where)
    why = name_problem(role)
    if why:
        bad(ZT2_NAME, f"{name}: part name {role!r:.60} {why}", where)
        return None
    if not isinstance(part, dict):
        bad(ZT2_SCHEMA, f"{name}/{role}: part is not a map", where)
        return None
    dtype = part.get("dtype")
    if not isinstance(dtype, str) or dtype not in STORAGE:
        bad(
            ZT2_DTYPE,
            f"{name}/{role}: dtype {dtype!r:.40} is not one of the 12 storage types",
            f"{where}/dtype",
        )
        return None
    ltype = part.get("type")
    if ltype is not None and not isinstance(ltype, str):
        bad(ZT2_SCHEMA, f"{name}/{role}: type is not text", f"{where}/type")
        return None
    if ltype in LOGICAL and LOGICAL[ltype][0] != dtype:
        bad(
            ZT2_DTYPE,
            f"{name}/{role}: logical type {ltype} requires dtype {LOGICAL[ltype][0]}, not {dtype}",
            f"{where}/dtype",
        )
        return None
    blob = part.get("blob")
    if not isinstance(blob, list) or len(blob) != 2:
        bad(
            ZT2_SCHEMA,
            f"{name}/{role}: blob must be an array of exactly two u64 [offset, length], got "
            f"{blob!r:.60}",
            f"{where}/blob",
        )
        return None
    if not all(_uint(v) for v in blob):
        bad(
            ZT2_SCHEMA, f"{name}/{role}: blob values must be u64, got {blob!r:.60}", f"{where}/blob"
        )
        return None
    shard = part.get("shard")
    if shard is not None:
        if not isinstance(shard, str):
            bad(ZT2_SCHEMA, f"{name}/{role}: shard is not text", f"{where}/shard")
            return None
        if not isinstance(shards, dict) or shard not in shards:
            bad(
                ZT2_SHARD,
                f"{name}/{role}: shard {shard!r:.60} is not in the shard table",
                f"{where}/shard",
            )
            return None
    encoding = part.get("encoding")
    if encoding is not None and not isinstance(encoding, str):
        bad(ZT2_SCHEMA, f"{name}/{role}: encoding is not text", f"{where}/encoding")
        return None
    decoded = part.get("decoded_length")
    if (encoding is None) != (decoded is None):
        what = "without an encoding" if encoding is None else f"missing for encoding {encoding}"
        bad(ZT2_DECODED_LENGTH, f"{name}/{role}: decoded_length {what}", f"{where}/decoded_length")
        return None
    if decoded is not None and not _uint(decoded):
        bad(ZT2_SCHEMA, f"{name}/{role}: decoded_length is not a u64", f"{where}/decoded_length")
        return None
    digest = part.get("digest")
    if digest is not None and not isinstance(digest, str):
        bad(ZT2_SCHEMA, f"{name}/{role}: digest is not text", f"{where}/digest")
        return None
    return Part(name, role, dtype, ltype, blob[0], blob[1], shard, encoding, decoded, digest, where)


# The keys of a part `_part` makes at once: any other key (a type, a shard, an encoding, a
# decoded length, or one it does not know) takes the checks.
_PLAIN_KEYS = frozenset(("dtype", "blob", "digest"))


# Layout rules -------------------------------------------------------------------------------


def type_size(part: Part, n: int) -> int | None:
    """The size function of the part's logical type at n elements (None: unknown type)."""
    if part.type is None:
        return n * STORAGE[part.dtype]
    known = LOGICAL.get(part.type)
    if known is None:
        return None
    return (n + 1) // 2 if known[1] == 0 else n * known[1]


def layout_known(layout: str) -> bool:
    return layout in (DENSE, CSR, COO, QUANT, MX) or gguf_type(layout) is not None


def gguf_type(layout: str) -> str | None:
    m = _GGUF_RE.fullmatch(layout)
    return m.group(1) if m and m.group(1) in GGUF_TYPES else None


def _uattr(attrs: Mapping[str, Any], key: str) -> int | None:
    v = attrs.get(key)
    return v if _uint(v) else None


def _size_problem(o: Obj, p: Part, want: int, why: str) -> Problem:
    return Problem(
        ZT2_SIZE,
        f"{o.name}/{p.role}: decoded size {p.decoded_size:,}, {why} give {want:,}",
        field=f"{p.field}/blob" if p.encoding is None else f"{p.field}/decoded_length",
    )


def layout_problems(o: Obj) -> Iterator[Problem]:
    """A problem for every metadata rule of the object's layout that fails
    (spec 5.1 and the profiles); nothing for an unknown layout (reported elsewhere)."""
    parts = o.parts
    if o.layout == DENSE and len(parts) == 1 and "data" in parts:
        # The common case, without the helpers below: the size equation alone.
        d = parts["data"]
        want = type_size(d, o.count)
        if want is not None and d.decoded_size != want:
            yield _size_problem(o, d, want, f"shape {list(o.shape)} and {d.type or d.dtype}")
        return
    w = o.field
    roles = set(parts)

    def need(*want: str, optional: tuple[str, ...] = ()) -> Iterator[Problem]:
        missing = [r for r in want if r not in roles]
        extra = sorted(roles - set(want) - set(optional))
        if missing or extra:
            yield Problem(
                ZT2_PARTS,
                f"{o.name}: layout {o.layout} has parts {', '.join(want)}"
                + (f"; missing {', '.join(missing)}" if missing else "")
                + (f"; unexpected {', '.join(extra)}" if extra else ""),
                field=f"{w}/parts",
            )

    def size_eq(p: Part, want: int, why: str) -> Iterator[Problem]:
        if p.decoded_size != want:
            yield _size_problem(o, p, want, why)

    unknown_type = [p for p in parts.values() if p.type is not None and p.type not in LOGICAL]
    if o.layout == DENSE:
        problems = list(need("data"))
        if problems:
            yield from problems
            return
        d = parts["data"]
        want = type_size(d, o.count)
        if want is not None:
            yield from size_eq(d, want, f"shape {list(o.shape)} and {d.type or d.dtype}")
        return
    if unknown_type:
        return  # sizes cannot be computed; the object is structural only
    if o.layout == CSR:
        problems = list(need("values", "indices", "indptr"))
        if len(o.shape) != 2:
            problems.append(
                Problem(
                    ZT2_PROFILE,
                    f"{o.name}: {CSR} needs rank 2, shape is {list(o.shape)}",
                    field=f"{w}/shape",
                )
            )
        if problems:
            yield from problems
            return
        ind, ptr, val = parts["indices"], parts["indptr"], parts["values"]
        if ind.dtype not in ("u32", "u64") or ind.type is not None:
            yield Problem(
                ZT2_PROFILE,
                f"{o.name}/indices: dtype must be u32 or u64 without a logical type",
                field=f"{ind.field}/dtype",
            )
            return
        if ptr.dtype != ind.dtype or ptr.type is not None:
            yield Problem(
                ZT2_PROFILE,
                f"{o.name}/indptr: dtype must equal indices' ({ind.dtype}) without a logical type",
                field=f"{ptr.field}/dtype",
            )
            return
        width = STORAGE[ind.dtype]
        if ind.decoded_size % width:
            yield Problem(
                ZT2_SIZE,
                f"{o.name}/indices: {ind.decoded_size:,} bytes is not whole {ind.dtype} elements",
                field=f"{ind.field}/blob",
            )
            return
        nnz = ind.decoded_size // width
        yield from size_eq(ptr, (o.shape[0] + 1) * width, f"{o.shape[0]} rows + 1 of {ind.dtype}")
        yield from size_eq(val, type_size(val, nnz) or 0, f"nnz {nnz} of {val.type or val.dtype}")
        return
    if o.layout == COO:
        problems = list(need("values", "coords"))
        if not o.shape:
            problems.append(
                Problem(ZT2_PROFILE, f"{o.name}: {COO} needs rank >= 1", field=f"{w}/shape")
            )
        if problems:
            yield from problems
            return
        co, val = parts["coords"], parts["values"]
        if co.dtype not in ("u32", "u64") or co.type is not None:
            yield Problem(
                ZT2_PROFILE,
                f"{o.name}/coords: dtype must be u32 or u64 without a logical type",
                field=f"{co.field}/dtype",
            )
            return
        unit = STORAGE[co.dtype] * len(o.shape)
        if co.decoded_size % unit:
            yield Problem(
                ZT2_SIZE,
                f"{o.name}/coords: {co.decoded_size:,} bytes is not a multiple of {unit} "
                f"({len(o.shape)} dims of {co.dtype})",
                field=f"{co.field}/blob",
            )
            return
        nnz = co.decoded_size // unit
        yield from size_eq(val, type_size(val, nnz) or 0, f"nnz {nnz} of {val.type or val.dtype}")
        return
    gt = gguf_type(o.layout)
    if gt is not None:
        problems = list(need("data"))
        if problems:
            yield from problems
            return
        d = parts["data"]
        if d.dtype != "u8" or d.type is not None:
            yield Problem(
                ZT2_PROFILE,
                f"{o.name}/data: {o.layout} data is u8 without a logical type",
                field=f"{d.field}/dtype",
            )
            return
        epb, bb = _uattr(o.attributes, "elems_per_block"), _uattr(o.attributes, "block_bytes")
        if not epb or not bb:
            yield Problem(
                ZT2_PROFILE,
                f"{o.name}: elems_per_block and block_bytes (uint >= 1) are required",
                field=f"{w}/attributes",
            )
            return
        if o.count % epb or (o.shape and o.shape[-1] % epb):
            yield Problem(
                ZT2_PROFILE,
                f"{o.name}: elems_per_block {epb} does not divide the element count or the last "
                f"dimension of {list(o.shape)}",
                field=f"{w}/attributes/elems_per_block",
            )
            return
        yield from size_eq(d, o.count // epb * bb, f"{o.count // epb} blocks of {bb} bytes")
        return
    if o.layout == MX:
        yield from _mx_problems(o, need)
        return
    if o.layout == QUANT:
        yield from _quant_problems(o, need)


def _mx_problems(o: Obj, need: Any) -> Iterator[Problem]:
    w = o.field
    problems = list(need("data", "scales"))
    if problems:
        yield from problems
        return
    d, s = o.parts["data"], o.parts["scales"]
    a = o.attributes
    if s.dtype != "u8" or s.type != "f8_e8m0":
        yield Problem(
            ZT2_PROFILE, f"{o.name}/scales: must be u8 with type f8_e8m0", field=f"{s.field}/type"
        )
        return
    if a.get("scale_form") != "e8m0_exponent":
        yield Problem(
            ZT2_PROFILE,
            f"{o.name}: scale_form must be 'e8m0_exponent'",
            field=f"{w}/attributes/scale_form",
        )
        return
    if (d.dtype, d.type) not in (
        ("u8", "f4_e2m1"),
        ("u8", "f8_e4m3fn"),
        ("u8", "f8_e5m2"),
        ("i8", None),
    ):
        yield Problem(
            ZT2_PROFILE,
            f"{o.name}/data: {d.dtype}/{d.type} is not an MX element type",
            field=f"{d.field}/type",
        )
        return
    if not o.shape:
        yield Problem(ZT2_PROFILE, f"{o.name}: {MX} needs rank >= 1", field=f"{w}/shape")
        return
    axis = a.get("axis", len(o.shape) - 1)
    if not _uint(axis) or axis >= len(o.shape):
        yield Problem(
            ZT2_PROFILE,
            f"{o.name}: axis {axis!r:.20} is not below rank {len(o.shape)}",
            field=f"{w}/attributes/axis",
        )
        return
    bs = _uattr(a, "block_size")
    if bs is None or bs < 2 or o.shape[axis] % bs:
        yield Problem(
            ZT2_PROFILE,
            f"{o.name}: block_size {a.get('block_size')!r:.20} must be >= 2 and divide "
            f"shape[{axis}] = {o.shape[axis]}",
            field=f"{w}/attributes/block_size",
        )
        return
    yield from _size(o, d, type_size(d, o.count) or 0, f"{o.count} elements of {d.type or d.dtype}")
    yield from _size(o, s, o.count // bs, f"{o.count // bs} blocks")


def _size(o: Obj, p: Part, want: int, why: str) -> Iterator[Problem]:
    if p.decoded_size != want:
        yield Problem(
            ZT2_SIZE,
            f"{o.name}/{p.role}: decoded size {p.decoded_size:,}, {why} give {want:,}",
            field=f"{p.field}/blob" if p.encoding is None else f"{p.field}/decoded_length",
        )


_WORDS = {"u8": 1, "u16": 2, "u32": 4, "u64": 8}


def _quant_problems(o: Obj, need: Any) -> Iterator[Problem]:
    w = o.field
    a = o.attributes
    zp = a.get("zero_point")
    if not isinstance(zp, dict) or zp.get("form") not in ("none", "implied", "tensor"):
        yield Problem(
            ZT2_PROFILE,
            f"{o.name}: zero_point.form must be none, implied or tensor",
            field=f"{w}/attributes/zero_point",
        )
        return
    form = zp["form"]
    problems = list(need("data", "scales", "zeros") if form == "tensor" else need("data", "scales"))
    if problems:
        yield from problems
        return
    if form == "implied" and type(zp.get("value")) is not int:
        yield Problem(
            ZT2_PROFILE,
            f"{o.name}: zero_point.value (int) is required for form implied",
            field=f"{w}/attributes/zero_point/value",
        )
        return
    if form == "tensor" and zp.get("packing") not in ("same_as_data", "plain"):
        yield Problem(
            ZT2_PROFILE,
            f"{o.name}: zero_point.packing must be same_as_data or plain",
            field=f"{w}/attributes/zero_point/packing",
        )
        return
    pk = a.get("packing")
    if (
        not isinstance(pk, dict)
        or pk.get("word") not in _WORDS
        or pk.get("order") not in ("lsb_first", "msb_first")
    ):
        yield Problem(
            ZT2_PROFILE,
            f"{o.name}: packing needs word (u8/u16/u32/u64) and order (lsb_first/msb_first)",
            field=f"{w}/attributes/packing",
        )
        return
    word = pk["word"]
    wbytes = _WORDS[word]
    bits = _uattr(a, "bits")
    if bits not in (2, 3, 4, 5, 6, 8) or (8 * wbytes) % bits:
        yield Problem(
            ZT2_PROFILE,
            f"{o.name}: bits {a.get('bits')!r:.20} must be 2, 3, 4, 5, 6 or 8 and divide the "
            f"{8 * wbytes}-bit word",
            field=f"{w}/attributes/bits",
        )
        return
    per_word = 8 * wbytes // bits
    if pk.get("per_word") != per_word:
        yield Problem(
            ZT2_PROFILE,
            f"{o.name}: packing.per_word {pk.get('per_word')!r:.20} must be {per_word}",
            field=f"{w}/attributes/packing/per_word",
        )
        return
    d, s = o.parts["data"], o.parts["scales"]
    if d.type is not None or d.dtype.lstrip("i").lstrip("u") != word[1:] or d.dtype[0] not in "iu":
        yield Problem(
            ZT2_PROFILE,
            f"{o.name}/data: dtype {d.dtype} does not match packing.word {word}",
            field=f"{d.field}/dtype",
        )
        return
    sf = a.get("scale_form")
    if sf in ("f32_factors", "f16_factors"):
        ok = s.dtype in ("f64", "f32", "f16", "bf16") and s.type is None
    elif sf == "e8m0_exponent":
        ok = s.dtype == "u8" and s.type == "f8_e8m0"
    else:
        yield Problem(
            ZT2_PROFILE,
            f"{o.name}: scale_form {sf!r:.30} is not f32_factors, f16_factors or e8m0_exponent",
            field=f"{w}/attributes/scale_form",
        )
        return
    if not ok:
        yield Problem(
            ZT2_PROFILE,
            f"{o.name}/scales: {s.dtype}/{s.type} does not fit scale_form {sf}",
            field=f"{s.field}/dtype",
        )
        return
    axis, gs = _uattr(a, "axis"), _uattr(a, "group_size")
    if axis is None or axis >= len(o.shape):
        yield Problem(
            ZT2_PROFILE,
            f"{o.name}: axis {a.get('axis')!r:.20} is not below rank {len(o.shape)}",
            field=f"{w}/attributes/axis",
        )
        return
    along = o.shape[axis]
    if gs is None or (gs and along % gs):
        yield Problem(
            ZT2_PROFILE,
            f"{o.name}: group_size {a.get('group_size')!r:.20} must divide shape[{axis}] = {along}",
            field=f"{w}/attributes/group_size",
        )
        return
    groups = along if gs == 0 else along // gs
    lanes = o.count // along if along else 0
    codes_n = o.count
    if codes_n % per_word:
        yield Problem(
            ZT2_SIZE,
            f"{o.name}/data: {codes_n} codes are not whole {word} words of {per_word}",
            field=f"{d.field}/blob",
        )
        return
    yield from _size(o, d, codes_n // per_word * wbytes, f"{codes_n} codes, {per_word} per {word}")
    yield from _size(o, s, groups * lanes * STORAGE[s.dtype], f"{groups} groups x {lanes} lanes")
    if form == "tensor":
        z = o.parts["zeros"]
        if zp["packing"] == "plain":
            yield from _size(
                o, z, groups * lanes * STORAGE[z.dtype], f"{groups} groups x {lanes} lanes"
            )
        else:
            yield from _size(
                o,
                z,
                groups * lanes // per_word * wbytes,
                f"{groups * lanes} zero points packed like data",
            )


# Digests ------------------------------------------------------------------------------------


def parse_digest(text: str) -> tuple[str, str] | None:
    """(algorithm, hex) for a registered algorithm; None for another; ValueError when a
    registered algorithm's value is malformed."""
    algo, sep, value = text.partition(":")
    pattern = _DIGEST_RE.get(algo)
    if pattern is None:
        if not sep or not algo:
            raise ValueError("a digest is ALGORITHM:HEX")
        return None
    if not pattern.fullmatch(value):
        n = 16 if algo == "xxh3" else 64
        raise ValueError(f"{algo} digests are {algo}: followed by {n} lowercase hex digits")
    return algo, value


class Digester:
    def __init__(self, algorithm: str) -> None:
        self.algorithm = algorithm
        if algorithm == "xxh3":
            import xxhash

            self._h: Any = xxhash.xxh3_64()
        else:
            import hashlib  # only for sha256 digests: it loads OpenSSL

            self._h = hashlib.sha256()

    def update(self, data: Any) -> None:
        self._h.update(data)

    def text(self) -> str:
        return f"{self.algorithm}:{self._h.hexdigest()}"


# Zstd seekable ------------------------------------------------------------------------------


def seek_table(blob: Any) -> list[tuple[int, int, int]]:
    """[(stored offset in the blob, stored size, decoded size)] of a zstd seekable stream,
    after the profile's checks on the table (ValueError otherwise)."""
    view = memoryview(blob).cast("B")
    n = len(view)
    if n < 9 + 8:
        raise ValueError(f"{n} bytes cannot hold a seek table")
    nframes = int.from_bytes(view[n - 9 : n - 5], "little")
    desc = view[n - 5]
    magic = int.from_bytes(view[n - 4 :], "little")
    if magic != SEEK_MAGIC:
        raise ValueError(f"no seek table: the last 4 bytes are 0x{magic:08x}, not 0x8f92eab1")
    if desc & 0x7C:
        raise ValueError(f"seek table descriptor 0x{desc:02x} has reserved bits set")
    entry = 12 if desc & 0x80 else 8
    table = nframes * entry + 9
    if table + 8 > n:
        raise ValueError(f"a seek table of {nframes:,} frames does not fit in {n:,} bytes")
    start = n - table - 8
    head = int.from_bytes(view[start : start + 4], "little")
    size = int.from_bytes(view[start + 4 : start + 8], "little")
    if head != SEEK_SKIPPABLE or size != table:
        raise ValueError("the seek table is not a skippable frame of its declared size")
    frames = []
    pos = 0
    for i in range(nframes):
        at = start + 8 + i * entry
        c = int.from_bytes(view[at : at + 4], "little")
        d = int.from_bytes(view[at + 4 : at + 8], "little")
        frames.append((pos, c, d))
        pos += c
    if pos != start:
        raise ValueError(
            f"frames add up to {pos:,} bytes, the stream holds {start:,} before the table"
        )
    for i, (_, c, d) in enumerate(frames):
        if d > ZSTD_FRAME_MAX:
            raise ValueError(f"frame {i} holds {d:,} bytes, above the 16 MiB limit")
        if i < len(frames) - 1 and d != frames[0][2]:
            raise ValueError(
                f"frame {i} holds {d:,} bytes, frame 0 {frames[0][2]:,}: all but the last must be "
                "equal"
            )
        if c < 6:
            raise ValueError(f"frame {i} is {c} bytes, too short for a zstd frame")
    return frames


def _check_frame(view: Any, i: int) -> None:
    if int.from_bytes(view[:4], "little") != 0xFD2FB528:
        raise ValueError(f"frame {i} does not start with the zstd magic")
    if not view[4] & 0x04:
        raise ValueError(f"frame {i} has no content checksum")
    from matrixctl.formats.ztensor import zstd_frames

    declared = zstd_frames(view)  # a complete frame, nothing after it
    del declared


def iter_seekable(
    blob: Any, decoded_length: int, where: str, offset: int, field_name: str
) -> Iterator[bytes]:
    """The decoded frames of a zt.zstd-seekable/1 part, each checked (checksum, size)."""
    import zstandard

    def fail(code: str, msg: str) -> FormatError:
        return FormatError(code, f"{where}: {msg}", offset=offset, field=field_name)

    try:
        frames = seek_table(blob)
    except ValueError as exc:
        raise fail(ZT2_ZSTD, str(exc)) from None
    total = sum(d for _, _, d in frames)
    if total != decoded_length:
        raise fail(
            ZT2_DECODED_LENGTH,
            f"frames decode to {total:,} bytes, decoded_length is {decoded_length:,}",
        )
    view = memoryview(blob).cast("B")
    local = threading.local()

    def decode(i: int) -> bytes:
        pos, c, d = frames[i]
        frame = view[pos : pos + c]
        dctx = getattr(local, "dctx", None)
        if dctx is None:
            dctx = local.dctx = zstandard.ZstdDecompressor()
        try:
            _check_frame(frame, i)
            out: bytes = dctx.decompress(frame, max_output_size=max(d, 1))
        except (ValueError, zstandard.ZstdError) as exc:
            raise fail(ZT2_ZSTD, f"frame {i}: {exc}") from None
        if len(out) != d:
            raise fail(
                ZT2_DECODED_LENGTH,
                f"frame {i} decodes to {len(out):,} bytes, the seek table says {d:,}",
            )
        return out

    if len(frames) < 2:
        for i in range(len(frames)):
            yield decode(i)
        return
    # Frames are independent: decode a few ahead on helper threads (zstd releases the GIL),
    # in order, with at most DECODE_AHEAD frames (<= 16 MiB each) held at once.
    pool = _decoder_pool()
    pending: collections.deque[Any] = collections.deque()
    nxt = 0
    try:
        while nxt < len(frames) or pending:
            while nxt < len(frames) and len(pending) < DECODE_AHEAD:
                pending.append(pool.submit(decode, nxt))
                nxt += 1
            yield pending.popleft().result()
    finally:
        for fut in pending:
            fut.cancel()
        for fut in pending:
            with contextlib.suppress(BaseException):
                fut.result()


def decode_seekable_into(blob: Any, out: Any, where: str, offset: int, field_name: str) -> None:
    """Decode a zt.zstd-seekable/1 part straight into `out` (a writable uint8 array of exactly
    decoded_length bytes): the same checks as `iter_seekable` (table, magic, content checksum,
    one complete frame each, sizes), with no intermediate bytes and no copy. Frames decode on
    the helper threads, each into its own slice of `out`."""
    import zstandard

    def fail(code: str, msg: str) -> FormatError:
        return FormatError(code, f"{where}: {msg}", offset=offset, field=field_name)

    try:
        frames = seek_table(blob)
    except ValueError as exc:
        raise fail(ZT2_ZSTD, str(exc)) from None
    total = sum(d for _, _, d in frames)
    if total != len(out):
        raise fail(
            ZT2_DECODED_LENGTH, f"frames decode to {total:,} bytes, decoded_length is {len(out):,}"
        )
    view = memoryview(blob).cast("B")
    target = memoryview(out).cast("B")
    starts = []
    at = 0
    for _, _, d in frames:
        starts.append(at)
        at += d
    local = threading.local()

    def decode(i: int) -> None:
        pos, c, d = frames[i]
        frame = view[pos : pos + c]
        dctx = getattr(local, "dctx", None)
        if dctx is None:
            dctx = local.dctx = zstandard.ZstdDecompressor()
        dest = target[starts[i] : starts[i] + d]
        got = 0
        try:
            _check_frame(frame, i)
            with dctx.stream_reader(frame, read_across_frames=False, closefd=False) as reader:
                while got < d:
                    n = reader.readinto(dest[got:])
                    if not n:
                        break
                    got += n
                more = len(reader.read(1)) if got == d else 0  # the checksum is read here
        except (ValueError, zstandard.ZstdError) as exc:
            raise fail(ZT2_ZSTD, f"frame {i}: {exc}") from None
        if got != d or more:
            what = f"{got:,}" if got != d else f"more than {d:,}"
            raise fail(
                ZT2_DECODED_LENGTH, f"frame {i} decodes to {what} bytes, the seek table says {d:,}"
            )

    if len(frames) < 2:
        for i in range(len(frames)):
            decode(i)
        return
    pool = _decoder_pool()
    futures = [pool.submit(decode, i) for i in range(len(frames))]
    try:
        for fut in futures:
            fut.result()  # the first failure in frame order
    finally:
        for fut in futures:
            fut.cancel()
        for fut in futures:
            with contextlib.suppress(BaseException):
                fut.result()


DECODE_AHEAD = 4
_POOL: Any = None


def _decoder_pool() -> Any:
    global _POOL
    if _POOL is None:
        import concurrent.futures
        import os

        workers = max(1, min(4, os.cpu_count() or 1))
        _POOL = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="zt2-zstd")
    return _POOL


# Streaming parts ----------------------------------------------------------------------------


def check_values(part: Part, piece: Any, count: int | None = None) -> str | None:
    """Why `piece` (decoded bytes of `part`) breaks its logical type's data rule."""
    import numpy as np

    arr = np.frombuffer(piece, dtype=np.uint8)
    if part.type == "bool" and arr.size and int(arr.max()) > 1:
        bad = int(np.flatnonzero(arr > 1)[0])
        return f"bool byte 0x{int(arr[bad]):02x} at element {bad}"
    if part.type == "f4_e2m1" and count is not None and count % 2 and arr.size and arr[-1] >> 4:
        return "the final odd nibble of f4_e2m1 data is not zero"
    return None


def _known_digest(part: Part) -> str | None:
    """The algorithm of the part's digest when this reader computes it."""
    if part.digest:
        with contextlib.suppress(ValueError):
            known = parse_digest(part.digest)
            if known is not None:
                return known[0]
    return None


def stream_part(
    buf: Any,
    part: Part,
    *,
    verify_digest: bool = True,
    chunk: int = CHUNK_BYTES,
) -> Iterator[Any]:
    """Decoded bytes of a local part whose bounds were checked (zero-copy slices for raw
    data). The digest is checked before the last piece is handed out, so a consumer never
    finishes with damaged bytes; bool data is checked as it goes."""
    where = f"{part.obj}/{part.role}"
    digester: Digester | None = None
    known = _known_digest(part) if verify_digest else None
    if known is not None:
        digester = Digester(known)
    if part.encoding is None:
        pieces: Iterator[Any] = mapped_chunks(buf, part.offset, part.length, chunk)
        if digester is not None:  # hashing first keeps the pieces zero-copy
            for piece in read_pieces(buf, part.offset, part.length, chunk):
                digester.update(piece)
            _check_digest(part, digester)
            digester = None
    elif part.encoding == ZSTD_SEEKABLE:
        stored = memoryview(buf)[part.offset : part.end]
        pieces = iter_seekable(stored, part.decoded_length or 0, where, part.offset, part.field)
    else:
        raise FormatError(
            ZT2_NOT_READ,
            f"{where}: encoding {part.encoding!r} is not one this reader decodes",
            offset=part.offset,
            field=f"{part.field}/encoding",
        )
    held: Any = None
    for piece in pieces:
        if part.type == "bool":
            why = check_values(part, piece)
            if why:
                raise FormatError(
                    ZT2_VALUES, f"{where}: {why}", offset=part.offset, field=part.field
                )
        if digester is not None:
            digester.update(piece)
        if held is not None:
            yield held
        held = piece
    if digester is not None:
        _check_digest(part, digester)
    if held is not None:
        yield held


def _check_digest(part: Part, digester: Digester) -> None:
    got = digester.text()
    if part.digest != got:
        raise FormatError(
            ZT2_DIGEST,
            f"{part.obj}/{part.role}: digest is {part.digest}, the decoded bytes give {got}",
            offset=part.offset,
            field=f"{part.field}/digest",
        )


# Reading for convert ------------------------------------------------------------------------


VERBATIM = "zt2.verbatim"  # a TensorInfo attribute only Zt2Sink reads (every other sink refuses)


def copyable(o: Obj) -> bool:
    """Whether zTensor 2 output can copy `o` as it is without interpreting it: its parts are
    in this file and decodable (an unknown layout or logical type is carried, never read)."""
    return all(p.local and p.encoding in (None, ZSTD_SEEKABLE) for p in o.parts.values())


def readable(o: Obj) -> str | None:
    """Why convert cannot read `o` (None: it can)."""
    if o.layout == DENSE and len(o.parts) == 1:
        d = o.parts.get("data")
        if (
            d is not None
            and d.shard is None
            and d.encoding in (None, ZSTD_SEEKABLE)
            and (d.dtype, d.type) in MATRIX_DTYPE
        ):
            return None  # what the loops below find for it, at once
    for p in o.parts.values():
        if not p.local:
            return f"part {p.role} lives in shard {p.shard!r}, which convert does not open"
        if p.encoding not in (None, ZSTD_SEEKABLE):
            return f"part {p.role} has encoding {p.encoding!r}, which this reader does not know"
    if o.layout in (DENSE, CSR, COO):
        for p in o.parts.values():
            if (p.dtype, p.type) not in MATRIX_DTYPE:
                return f"part {p.role} is {p.dtype}/{p.type}, which has no matrixctl dtype"
        return None
    if gguf_type(o.layout) is not None:
        from matrixctl.formats.gguf import GGML_BY_NAME

        g = GGML_BY_NAME.get(gguf_type(o.layout).upper())  # type: ignore[union-attr]
        if g is None:
            return f"layout {o.layout} names a ggml type matrixctl does not know"
        if (o.attributes.get("elems_per_block"), o.attributes.get("block_bytes")) != (
            g.block_size,
            g.type_size,
        ):
            return f"layout {o.layout}: block geometry disagrees with ggml's {g.name}"
        return None
    return f"layout {o.layout!r} has no matrixctl equivalent (inspect and verify read it)"


def to_info(o: Obj) -> TensorInfo:
    attrs = dict(o.attributes)
    if o.layout == DENSE:
        d = o.parts["data"]
        return TensorInfo(o.name, MATRIX_DTYPE[(d.dtype, d.type)], o.shape, "dense", (), attrs)
    gt = gguf_type(o.layout)
    if gt is not None:
        from matrixctl.formats.gguf import GGML_BY_NAME

        g = GGML_BY_NAME[gt.upper()]
        meta = {k: v for k, v in attrs.items() if k not in ("elems_per_block", "block_bytes")}
        meta |= {
            "quantization": "ggml",
            "ggml_type": g.name,
            "ggml_type_id": g.id,
            "block_size": g.block_size,
            "type_size": g.type_size,
        }
        return TensorInfo(
            o.name,
            "u8",
            o.shape,
            "quantized_group",
            (
                Component("packed_weight", "u8", o.parts["data"].decoded_size),
                Component("scales", "f32", 0),
                Component("zeros", "f32", 0),
            ),
            meta,
        )
    roles = ("values", "indices", "indptr") if o.layout == CSR else ("values", "coords")
    comps = []
    for role in roles:
        p = o.parts[role]
        dt = MATRIX_DTYPE[(p.dtype, p.type)]
        comps.append(Component(role, dt, p.decoded_size // DTYPES[dt].itemsize))
    return TensorInfo(
        o.name, comps[0].dtype, o.shape, TO_MATRIX_LAYOUT[o.layout], tuple(comps), attrs
    )


class Zt2Source(TensorSource):
    """A zTensor 2 file opened for `convert`: every structural rule of `verify` must pass."""

    format = FORMAT

    def __init__(self, src: Source, checked: Any) -> None:
        self.src = src
        self.subject = checked
        self.zt: Zt2File = self.subject.zt
        # Objects convert cannot read stay listed (so --select/--exclude see them) under a
        # layout no sink holds, `zt2:<layout>`: the sink refuses them by name if chosen.
        self.unread: dict[str, str] = {}
        self._infos = []
        for o in self.zt.objects.values():
            why = readable(o)
            if why is None:
                self._infos.append(to_info(o))
                continue
            label = o.layout
            if o.layout == DENSE:
                d = o.parts["data"]
                label = f"dense/{d.type or d.dtype}"
            comps = tuple(Component(r, "u8", p.decoded_size) for r, p in o.parts.items())
            attrs = dict(o.attributes)
            if copyable(o):
                # zTensor 2 output copies it as it is (layout, dtypes, types, decoded bytes).
                parts = {r: [p.dtype, p.type] for r, p in o.parts.items()}
                attrs[VERBATIM] = {"layout": o.layout, "parts": parts}
            else:
                self.unread[o.name] = why
            self._infos.append(TensorInfo(o.name, "u8", o.shape, f"zt2:{label}", comps, attrs))

    def tensors(self) -> list[TensorInfo]:
        return list(self._infos)

    def metadata(self) -> dict[str, Any]:
        return dict(self.zt.attributes)

    def _part(self, info: TensorInfo, role: str) -> Part:
        o = self.zt.objects[info.name]
        return o.parts["data" if role == "packed_weight" else role]

    def stream(self, info: TensorInfo, role: str = "data") -> Iterator[Any]:
        if info.name in self.unread:
            raise FormatError(
                ZT2_NOT_READ,
                f"object {info.name!r} cannot be converted: {self.unread[info.name]}",
                path=self.src.name,
                field=f"objects/{info.name}",
            )
        if info.layout == "quantized_group" and role != "packed_weight":
            return iter(())
        if VERBATIM in info.attributes:
            return stream_part(self.src.buf, self.zt.objects[info.name].parts[role])
        return stream_part(self.src.buf, self._part(info, role))

    def array(self, info: TensorInfo, role: str = "data", *, verify: bool = True) -> Any:
        """Zero-copy view of raw data (after the digest check, unless `verify=False`)."""
        p = self._part(info, role)
        dt = MATRIX_DTYPE[(p.dtype, p.type)]
        if p.encoding == ZSTD_SEEKABLE and p.type != "bool":
            import numpy as np

            out = np.empty(p.decoded_size, dtype=np.uint8)  # decoded_length was checked
            stored = memoryview(self.src.buf)[p.offset : p.end]
            decode_seekable_into(stored, out, f"{p.obj}/{p.role}", p.offset, p.field)
            known = _known_digest(p) if verify else None
            if known is not None:
                digester = Digester(known)
                digester.update(out.data)
                _check_digest(p, digester)
            return out.view(np.dtype(DTYPES[dt].storage))
        if p.encoding is not None or p.type == "bool":
            import numpy as np

            out = np.empty(p.decoded_size, dtype=np.uint8)  # decoded_length was checked
            pos = 0
            for piece in stream_part(self.src.buf, p, verify_digest=verify):
                n = memoryview(piece).nbytes
                out[pos : pos + n] = np.frombuffer(piece, dtype=np.uint8)
                pos += n
            return out.view(np.dtype(DTYPES[dt].storage))
        if p.digest and verify:
            for _ in stream_part(self.src.buf, p):
                pass
        return storage_array(self.src.buf, dt, p.offset, p.length)

    def release(self, info: TensorInfo) -> None:
        for p in self.zt.objects[info.name].parts.values():
            drop_pages(self.src.buf, p.offset, p.length)


# Writing ------------------------------------------------------------------------------------


def _align_up(pos: int, align: int) -> int:
    return -(-pos // align) * align


def attribute_value(value: Any) -> Any:
    """A metadata value as a zTensor 2 attribute ztensor 2.1.2 accepts: byte strings (which it
    refuses) become lowercase hex text; tuples become arrays; map keys text."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, list | tuple):
        return [attribute_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): attribute_value(v) for k, v in value.items()}
    if hasattr(value, "item") and not isinstance(value, str):  # numpy scalars
        return value.item()
    return value


class Zt2Writer:
    """Stream objects into a zTensor 2 file.

    Canonical (spec 6.3; the default): raw parts, an xxh3 digest on every part, blobs packed
    at successive 64 KiB boundaries from 65536 in (object name, part name) order, identical
    contents sharing one blob (equality confirmed on the bytes), manifest last. Objects must
    be added in ascending bytewise name order. Otherwise (`level` set: zt.zstd-seekable/1
    frames of 1 MiB; or another digest): the same layout at 4096-byte alignment, which is
    what ztensor 2.1.2 writes for compressed files. The file object must be seekable and
    readable (blob sharing reads back the earlier copy), positioned at 0.
    """

    def __init__(
        self,
        fp: BinaryIO,
        *,
        digest: str | None = "xxh3",
        level: int | None = None,
        attributes: Mapping[str, Any] | None = None,
        align: int | None = None,
    ) -> None:
        if digest is not None and digest not in DIGESTS:
            raise UsageError(f"--digest for zTensor 2 must be one of {', '.join(DIGESTS)} or none")
        self.fp = fp
        self.digest = digest
        self.level = level
        self.canonical = level is None and digest == "xxh3" and align in (None, CANONICAL_ALIGN)
        self.align = align or (CANONICAL_ALIGN if level is None else ALIGN)
        if self.align % ALIGN:
            raise UsageError(f"zTensor 2 alignment must be a multiple of 4096, got {self.align}")
        self.attributes = {str(k): attribute_value(v) for k, v in (attributes or {}).items()}
        self.objects: dict[str, dict[str, Any]] = {}
        self.last_name: bytes | None = None
        self.seen: dict[tuple[str, int], list[int]] = {}
        self.pos = 0
        self.fp.write(MAGIC)
        self.pos = len(MAGIC)

    def add(
        self,
        name: str,
        shape: tuple[int, ...] | list[int],
        layout: str,
        parts: list[tuple[str, str, str | None, int, Iterator[Any]]],
        attributes: Mapping[str, Any] | None = None,
    ) -> None:
        """One object; `parts` is (role, dtype, logical type, decoded byte size, byte stream)
        per part. Parts are written in ascending name order, as canonical form wants."""
        why = name_problem(name)
        if why:
            raise FormatError(ZT2_WRITE, f"tensor name {name!r:.60} {why}", field=name)
        if name in self.objects:
            raise FormatError(ZT2_WRITE, f"tensor {name!r} is added twice", field=name)
        key = name.encode("utf-8")
        if self.last_name is not None and key < self.last_name:
            self.canonical = False
        self.last_name = key
        if unicodedata.normalize("NFC", name) != name:
            self.canonical = False
        out: dict[str, dict[str, Any]] = {}
        for role, dtype, ltype, nbytes, stream in sorted(parts, key=lambda p: p[0].encode()):
            if dtype not in STORAGE:
                raise FormatError(ZT2_WRITE, f"{name}/{role}: unknown dtype {dtype!r}", field=name)
            out[role] = self._part(f"{name}/{role}", dtype, ltype, nbytes, stream)
        obj: dict[str, Any] = {"shape": list(shape), "layout": layout, "parts": out}
        if attributes:
            obj["attributes"] = {str(k): attribute_value(v) for k, v in attributes.items()}
        self.objects[name] = obj

    def _pad_to(self, offset: int) -> None:
        if offset > self.pos:
            self.fp.write(bytes(offset - self.pos))
            self.pos = offset

    def _part(
        self, where: str, dtype: str, ltype: str | None, nbytes: int, stream: Iterator[Any]
    ) -> dict[str, Any]:
        before = self.pos
        offset = _align_up(self.pos, self.align)
        digester = Digester(self.digest) if self.digest else None
        got = 0
        part: dict[str, Any] = {"dtype": dtype}
        if ltype is not None:
            part["type"] = ltype
        if self.level is None:
            if nbytes:  # an empty part takes no padding (its offset is where the next begins)
                self._pad_to(offset)
            got = copy_stream(
                self.fp,
                stream,
                nbytes,
                where=where,
                code=ZT2_WRITE,
                update=digester.update if digester is not None else None,
            )
            self.pos += got
            length = got
        else:
            self._pad_to(offset)
            length = self._zstd(stream, digester, nbytes)
            got = self._zstd_got
            part["encoding"] = ZSTD_SEEKABLE
            part["decoded_length"] = got
        if got != nbytes:
            raise FormatError(
                ZT2_WRITE,
                f"{where}: {got:,} bytes arrived, shape and dtype give {nbytes:,}",
                field=where,
            )
        if digester is not None:
            part["digest"] = digester.text()
        if self.level is None and part.get("digest"):
            same = self._shared(part["digest"], offset, length)
            if same is not None:
                self.fp.seek(before)
                self.fp.truncate()
                self.pos = before
                offset = same
            else:
                self.seen.setdefault((part["digest"], length), []).append(offset)
        part["blob"] = [offset, length]
        return part

    def _shared(self, digest: str, offset: int, length: int) -> int | None:
        """The offset of an earlier blob with the same bytes (compared, not trusted to the
        hash), or None."""
        for earlier in self.seen.get((digest, length), []):
            if self._same_bytes(earlier, offset, length):
                return earlier
        return None

    def _same_bytes(self, a: int, b: int, length: int) -> bool:
        fp = self.fp
        fp.flush()
        step = CHUNK_BYTES
        try:
            for start in range(0, length, step):
                n = min(step, length - start)
                fp.seek(a + start)
                x = fp.read(n)
                fp.seek(b + start)
                if fp.read(n) != x:
                    return False
            return True
        finally:
            fp.seek(self.pos)

    def _zstd(self, stream: Iterator[Any], digester: Digester | None, nbytes: int) -> int:
        import zstandard

        cctx = zstandard.ZstdCompressor(
            level=self.level or ZSTD_LEVEL, write_checksum=True, write_content_size=False
        )
        table: list[tuple[int, int]] = []
        pending = bytearray()
        got = 0
        written = 0

        def flush_frame(data: Any) -> None:
            nonlocal written
            # Size not pledged, as ztensor 2.1.2 compresses: same window, same bytes.
            cobj = cctx.compressobj()
            frame = cobj.compress(data) + cobj.flush()
            self.fp.write(frame)
            table.append((len(frame), len(data)))
            written += len(frame)

        for piece in stream:
            view = memoryview(piece).cast("B")
            got += view.nbytes
            if got > nbytes:
                break
            if digester is not None:
                digester.update(view)
            start = 0
            if pending:
                take = min(ZSTD_FRAME - len(pending), view.nbytes)
                pending += view[:take]
                start = take
                if len(pending) == ZSTD_FRAME:
                    flush_frame(bytes(pending))
                    pending.clear()
            while view.nbytes - start >= ZSTD_FRAME:
                flush_frame(view[start : start + ZSTD_FRAME])
                start += ZSTD_FRAME
            if start < view.nbytes:
                pending += view[start:]
        if pending:  # an empty part is a seek table of 0 frames, as ztensor 2.1.2 writes it
            flush_frame(bytes(pending))
        entries = b"".join(struct.pack("<II", c, d) for c, d in table)
        seek = entries + struct.pack("<IBI", len(table), 0, SEEK_MAGIC)
        tail = struct.pack("<II", SEEK_SKIPPABLE, len(seek)) + seek
        self.fp.write(tail)
        written += len(tail)
        self.pos += written
        self._zstd_got = got
        return written

    def manifest(self) -> dict[str, Any]:
        root: dict[str, Any] = {"objects": self.objects}
        if self.attributes:
            root["attributes"] = self.attributes
        return root

    def finish(self) -> int:
        """Write the manifest blob and the footer; return the file size."""
        raw = cbor.dumps(self.manifest())
        moff = _align_up(self.pos, self.align)
        self._pad_to(moff)
        self.fp.write(raw)
        self.fp.write(FOOTER.pack(moff, len(raw), manifest_hash(raw), VERSION, 0, MAGIC))
        self.pos += len(raw) + FOOTER_SIZE
        return self.pos


class Zt2Sink(TensorSink):
    """`convert` into zTensor 2: canonical by default (raw, xxh3, 64 KiB, sorted names);
    `--compress zstd[:LEVEL]` writes zt.zstd-seekable/1 parts at 4096-byte alignment;
    `--digest sha256|none` changes the digests (not canonical then)."""

    format = FORMAT
    dtypes = frozenset(TO_ZT2)
    layouts = frozenset({"dense", "sparse_csr", "sparse_coo", "quantized_group"})
    keeps_metadata = True
    accepts = ("compress", "digest")

    def refuse(self, info: TensorInfo) -> str | None:
        if info.layout.startswith("zt2:"):
            if VERBATIM in info.attributes:
                return None
            return f"its layout {info.layout[4:]} cannot be read from its source"
        why = super().refuse(info)
        if why or info.layout != "quantized_group":
            return why
        if ggml_layout(info) is None:
            return (
                "only quantized_group tensors that hold raw ggml blocks (GGUF --keep-quantized) "
                "have a zTensor 2 profile (gguf.<type>/1)"
            )
        return None

    def order(self, plan: list[TensorInfo]) -> list[TensorInfo]:
        return sorted(plan, key=lambda i: i.name.encode("utf-8"))

    def begin(self, out: Outputs, plan: list[TensorInfo], metadata: Mapping[str, Any]) -> None:
        level = self.options.get("compress_level")
        digest = self.options.get("digest", "xxh3")
        self._notes: list[str] = []
        self.writer = Zt2Writer(out.main, digest=digest, level=level, attributes=metadata)
        self.count = 0

    def add(self, info: TensorInfo, parts: PartStreams) -> None:
        if VERBATIM in info.attributes:
            meta = info.attributes[VERBATIM]
            attrs = {k: v for k, v in info.attributes.items() if k != VERBATIM}
            sizes = {c.role: c.count for c in info.components}
            copied = [
                (role, dtype, ltype, sizes[role], parts(role))
                for role, (dtype, ltype) in meta["parts"].items()
            ]
            self.writer.add(info.name, info.shape, meta["layout"], copied, attrs)
            self.count += 1
            return
        if info.layout == "quantized_group":
            layout, attrs = ggml_layout(info) or ("", {})
            c = next(p for p in info.components if p.role == "packed_weight")
            self.writer.add(
                info.name,
                info.shape,
                layout,
                [("data", "u8", None, c.nbytes, parts("packed_weight"))],
                attrs,
            )
        else:
            layout = {v: k for k, v in TO_MATRIX_LAYOUT.items()}[info.layout]
            pieces: list[tuple[str, str, str | None, int, Iterator[Any]]] = []
            for p in info.parts():
                dtype, ltype = TO_ZT2[p.dtype]
                pieces.append((p.role, dtype, ltype, p.nbytes, parts(p.role)))
            self.writer.add(info.name, info.shape, layout, pieces, info.attributes)
        self.count += 1

    def finish(self) -> dict[str, Any]:
        size = self.writer.finish()
        w = self.writer
        return {
            "bytes": size,
            "zt_version": 2,
            "canonical": w.canonical,
            "encoding": "raw" if w.level is None else f"zstd:{w.level}",
            "digest": w.digest or "none",
        }

    def notes(self) -> list[str]:
        if not self.writer.canonical and self.writer.level is None and self.writer.digest:
            return ["the output is valid zTensor 2 but not canonical (a name is not in NFC)"]
        return list(self._notes)


def ggml_layout(info: TensorInfo) -> tuple[str, dict[str, Any]] | None:
    """(gguf.<type>/1, attributes) for a quantized_group tensor of raw ggml blocks."""
    a = info.attributes
    if a.get("quantization") != "ggml":
        return None
    from matrixctl.formats.gguf import GGML_BY_NAME

    g = GGML_BY_NAME.get(str(a.get("ggml_type")))
    if g is None or not g.quantized or g.name.lower() not in GGUF_TYPES:
        return None
    if (a.get("block_size"), a.get("type_size")) != (g.block_size, g.type_size):
        return None
    rest = {
        k: v
        for k, v in a.items()
        if k not in ("quantization", "ggml_type", "ggml_type_id", "block_size", "type_size")
    }
    rest |= {"elems_per_block": g.block_size, "block_bytes": g.type_size}
    return f"gguf.{g.name.lower()}/1", rest


def save_file(
    tensors: Mapping[str, Any],
    path: str,
    *,
    compress: str | None = None,
    digest: str | None = "xxh3",
    attributes: Mapping[str, Any] | None = None,
) -> int:
    """Write numpy arrays as a zTensor 2 file, atomically; return its size. Canonical (the
    bytes ztensor 2.1.2's `save_file` writes for the same arrays) unless `compress`
    (`zstd[:LEVEL]`) or `digest` (`sha256`, None) say otherwise. bf16 and float8 arrays are
    ml_dtypes arrays; bool is stored as u8 with logical type bool."""
    import numpy as np

    from matrixctl.formats.ztensor import parse_compress
    from matrixctl.io import atomic_output

    level = parse_compress(compress)
    for name in tensors:  # names are UTF-8 text in the manifest: checked before anything is written
        if not isinstance(name, str) or not _encodable(name):
            raise UsageError(f"tensor name {name!r} is not valid Unicode text (UTF-8)")
    with atomic_output(path, what="a zTensor 2 file") as fp:
        writer = Zt2Writer(fp, digest=digest, level=level, attributes=attributes)
        for name in sorted(tensors, key=lambda n: n.encode("utf-8")):
            arr = np.asarray(tensors[name], order="C")  # ascontiguousarray makes 0-d 1-d
            kind = _numpy_dtype(arr.dtype)
            if kind is None:
                raise UsageError(f"{name}: numpy dtype {arr.dtype} has no zTensor 2 type")
            dtype, ltype = TO_ZT2[kind]
            raw = arr.reshape(-1).view(np.uint8)
            writer.add(name, arr.shape, DENSE, [("data", dtype, ltype, raw.nbytes, iter([raw]))])
        return writer.finish()


def _numpy_dtype(dt: Any) -> str | None:
    """The matrixctl dtype of a numpy dtype (ml_dtypes' by name)."""
    by_name = {"bfloat16": "bf16", "float8_e4m3fn": "f8_e4m3", "float8_e5m2": "f8_e5m2"}
    if dt.name in by_name:
        return by_name[dt.name]
    for name, d in DTYPES.items():
        if d.numeric and dt.kind != "V" and dt == d.storage.replace("|b1", "?"):
            return name
    return None


TENSOR_IO = {FORMAT: (Zt2Source, Zt2Sink)}

# Kept defined: codes are never removed or reused (v2 files are read since this module).
ZT2_UNSUPPORTED = codes.define(
    "ZT2_UNSUPPORTED",
    "Retired: earlier versions refused every zTensor v2 file with this code; v2 is now read.",
    group=G,
)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate
        return False
    return True
