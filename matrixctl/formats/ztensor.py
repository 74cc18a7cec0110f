"""zTensor v1.1 (`.zt`): aligned blobs, a CBOR manifest, and a footer (spec: ztensor-v1.1.md).

Byte layout, resolved as docs/formats/ztensor.md explains (integers little-endian):

    offset            size      field
    0                 8         magic b"ZTEN1000"
    64k (k >= 1)      length    component blobs, each at a multiple of 64, zero padding between
    M                 S         manifest: one CBOR map {version, attributes?, objects}
    M + S             8         manifest size S (u64)
    M + S + 8         8         magic b"ZTEN1000" again; EOF = M + S + 16

    objects: {name: {shape: [u64...], format: layout, attributes?: map,
                     components: {role: {dtype, offset, length, encoding?, digest?}}}}

Layouts and their components: dense {data}; sparse_csr {values, indices, indptr};
sparse_coo {values, coords}; quantized_group {packed_weight, scales, zeros}. Encodings: raw
(default) and zstd. A digest is `crc32c:0x<8 hex>` or `sha256:<64 hex>` over the component's
stored bytes (after zstd, as the reference implementation ztensor 1.1.1 computes it).

This module parses (`parse`), streams components with every safety cap (`stream_component`),
and writes (`ZtWriter`, `ZtSink`). Judging a file is `matrixctl.validate.ztensor`.
"""

from __future__ import annotations

import contextlib
import re
import struct
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, BinaryIO

from matrixctl import cbor, codes, crc
from matrixctl.codes import Severity
from matrixctl.errors import FormatError, UsageError
from matrixctl.findings import Problem
from matrixctl.io import BackgroundWriter
from matrixctl.records import Record
from matrixctl.tensors import (
    CHUNK_BYTES,
    DTYPES,
    Component,
    Outputs,
    PartStreams,
    StoredBytes,
    TensorInfo,
    TensorSink,
    TensorSource,
    copy_stream,
    drop_pages,
    element_count,
    read_pieces,
    storage_array,
    text_metadata,
)

if TYPE_CHECKING:
    from matrixctl.io import Source

FORMAT = "ztensor"
MAGIC = b"ZTEN1000"
HEADER_SIZE = 8
FOOTER_SIZE = 16  # manifest size (u64) + magic
ALIGNMENT = 64
BACKGROUND_MIN = 256 << 10  # pieces this large are written on a helper thread
MAX_MANIFEST = 1 << 30  # spec IV.1 step 4: abort above 1 GiB
VERSION = "1.1.0"
SUPPORTED_MAJOR = 1
KNOWN_MINOR = 1
ENCODINGS = ("raw", "zstd")
# Roles each layout requires (spec part III).
LAYOUTS: dict[str, tuple[str, ...]] = {
    "dense": ("data",),
    "sparse_csr": ("values", "indices", "indptr"),
    "sparse_coo": ("values", "coords"),
    "quantized_group": ("packed_weight", "scales", "zeros"),
}
INDEX_ROLES = frozenset({"indices", "indptr", "coords"})
# A zstd block decodes to at most 128 KiB and costs at least 4 bytes (an RLE block: 3-byte
# header + 1 byte), so no zstd data decodes to more than 32768 times its own size.
ZSTD_MAX_RATIO = 32768
ZSTD_MAX_WINDOW = 1 << 27  # zstd's own default limit: decoding memory stays <= 128 MiB
DEFAULT_ZSTD_LEVEL = 3
DIGESTS = ("crc32c", "sha256")
DEFAULT_DIGEST = "crc32c"
# ztensor 1.1.1 (the reference release) refuses files using these dtypes: it knows 13 of 17.
REFERENCE_DTYPES = frozenset(
    {"f64", "f32", "f16", "bf16", "i64", "i32", "i16", "i8", "u64", "u32", "u16", "u8", "bool"}
)

G = FORMAT
ZT_TRUNCATED = codes.define(
    "ZT_TRUNCATED",
    "The file is shorter than the 8-byte magic plus the 16-byte footer.",
    group=G,
)
ZT_FOOTER_MAGIC = codes.define(
    "ZT_FOOTER_MAGIC",
    "The last 8 bytes are not the magic ZTEN1000: the file is truncated or was not finished.",
    group=G,
)
ZT_MANIFEST_SIZE = codes.define(
    "ZT_MANIFEST_SIZE",
    "The manifest size is above the 1 GiB limit or larger than the file allows.",
    group=G,
)
ZT_CBOR = codes.define(
    "ZT_CBOR",
    "The manifest is not well-formed CBOR, or uses what a manifest may not (tags, duplicate "
    "keys, non-text keys, nesting deeper than 64).",
    group=G,
)
ZT_SCHEMA = codes.define(
    "ZT_SCHEMA",
    "A manifest field is missing or has the wrong type (version, objects, shape, format, "
    "components, dtype, offset, length, encoding, digest).",
    group=G,
)
ZT_VERSION = codes.define(
    "ZT_VERSION", "The manifest version is not a zTensor 1.x version.", group=G
)
ZT_VERSION_NEWER = codes.define(
    "ZT_VERSION_NEWER",
    "The manifest declares a newer 1.x minor version than 1.1; fields it adds are ignored.",
    group=G,
    severity=Severity.WARNING,
)
ZT_LAYOUT = codes.define(
    "ZT_LAYOUT",
    "An object's format (layout) is not one the spec defines; its components are still "
    "checked but it cannot be read as a tensor.",
    group=G,
    severity=Severity.WARNING,
)
ZT_COMPONENTS = codes.define(
    "ZT_COMPONENTS", "A component the object's layout requires is missing.", group=G
)
ZT_EXTRA_COMPONENT = codes.define(
    "ZT_EXTRA_COMPONENT",
    "An object has a component its layout does not define.",
    group=G,
    severity=Severity.WARNING,
)
ZT_COMPONENT_DTYPE = codes.define(
    "ZT_COMPONENT_DTYPE",
    "A sparse index component (indices, indptr, coords) is not of an integer dtype.",
    group=G,
)
ZT_ALIGN = codes.define("ZT_ALIGN", "A component's offset is not a multiple of 64.", group=G)
ZT_BOUNDS = codes.define(
    "ZT_BOUNDS",
    "A component lies outside the data region (before byte 8, past EOF, or over the manifest).",
    group=G,
)
ZT_OVERLAP = codes.define("ZT_OVERLAP", "Two components share bytes.", group=G)
ZT_LENGTH = codes.define(
    "ZT_LENGTH",
    "A component's length disagrees with its shape and dtype (or is not a whole number of "
    "elements).",
    group=G,
)
ZT_ZSTD_SIZE = codes.define(
    "ZT_ZSTD_SIZE",
    "A zstd component decodes (or declares it decodes) to a size other than its shape and "
    "dtype give, or to more than 32768 times its stored size.",
    group=G,
)
ZT_ZSTD = codes.define("ZT_ZSTD", "A zstd component is not valid zstd data.", group=G)
ZT_DIGEST = codes.define(
    "ZT_DIGEST", "A component's digest does not match its stored bytes.", group=G
)
ZT_DIGEST_FORMAT = codes.define(
    "ZT_DIGEST_FORMAT",
    "A digest string is malformed (crc32c:0x + 8 hex digits, or sha256: + 64 hex digits).",
    group=G,
)
ZT_DIGEST_UNKNOWN = codes.define(
    "ZT_DIGEST_UNKNOWN",
    "A digest uses an algorithm matrixctl cannot compute, or a component's digest key is "
    "damaged: the component could not be verified (an error unless --allow-unknown-digest).",
    group=G,
)
ZT_NO_DIGEST = codes.define(
    "ZT_NO_DIGEST",
    "Components without a digest: damage to their bytes cannot be detected.",
    group=G,
    severity=Severity.INFO,
)
ZT_PADDING = codes.define("ZT_PADDING", "A padding byte between blobs is not 0x00.", group=G)
ZT_GAP = codes.define(
    "ZT_GAP",
    "64 or more bytes between blobs belong to no component (unreferenced data).",
    group=G,
    severity=Severity.WARNING,
)
ZT_BOOL = codes.define(
    "ZT_BOOL",
    "A bool element is a byte other than 0x00 or 0x01 (a warning: the zTensor 1.1 spec does "
    "not say MUST and ztensor 1.1.1 reads it; convert writes it as 0x01).",
    group=G,
    severity=codes.Severity.WARNING,
)
ZT_SPARSE = codes.define(
    "ZT_SPARSE",
    "Sparse index data is inconsistent: indptr not starting at 0 or decreasing, an index out "
    "of the shape, or component counts that disagree.",
    group=G,
)
ZT_QUANT_SIZE = codes.define(
    "ZT_QUANT_SIZE",
    "A quantized_group component's size disagrees with the bits or group_size attributes.",
    group=G,
    severity=Severity.WARNING,
)
ZT_ATTRIBUTES = codes.define(
    "ZT_ATTRIBUTES",
    "Root attributes hold a non-text key or value: valid per the spec, but ztensor 1.1.1 "
    "refuses to open such a file.",
    group=G,
    severity=Severity.WARNING,
)
ZT_REFERENCE_DTYPE = codes.define(
    "ZT_REFERENCE_DTYPE",
    "The file uses a dtype (f8_e4m3, f8_e5m2, complex64, complex128) that ztensor 1.1.1 does "
    "not know: that release cannot open it.",
    group=G,
    severity=Severity.INFO,
)
ZT_NAME = codes.define(
    "ZT_NAME",
    "An object name is empty or contains a NUL character.",
    group=G,
    severity=Severity.WARNING,
)
ZT_WRITE = codes.define(
    "ZT_WRITE",
    "A tensor handed to the zTensor writer is inconsistent (bytes streamed differ from shape "
    "and dtype, unknown dtype or layout, duplicate name).",
    group=G,
)


# Parsed structure ---------------------------------------------------------------------------


class ZtComponent(Record):
    __slots__ = ("digest", "dtype", "encoding", "field", "length", "obj", "offset", "role")

    def __init__(
        self,
        obj: str,
        role: str,
        dtype: str,
        offset: int,
        length: int,
        encoding: str,
        digest: str | None,
        field: str,
    ) -> None:
        self.obj = obj
        self.role = role
        self.dtype = dtype
        self.offset = offset
        self.length = length
        self.encoding = encoding
        self.digest = digest
        self.field = field  # "objects/<name>/components/<role>", for findings

    @property
    def end(self) -> int:
        return self.offset + self.length

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype].itemsize


class ZtObject(Record):
    __slots__ = ("attributes", "components", "layout", "name", "shape")

    def __init__(
        self,
        name: str,
        shape: tuple[int, ...],
        layout: str,
        components: dict[str, ZtComponent],
        attributes: dict[str, Any],
    ) -> None:
        self.name = name
        self.shape = shape
        self.layout = layout
        self.components = components
        self.attributes = attributes

    @property
    def count(self) -> int:
        return element_count(self.shape)

    @property
    def field(self) -> str:
        return f"objects/{self.name}"


class ZtFile(Record):
    __slots__ = (
        "attributes",
        "manifest_offset",
        "manifest_size",
        "objects",
        "parts",
        "problems",
        "size",
        "version",
    )

    def __init__(
        self,
        size: int,
        manifest_offset: int,
        manifest_size: int,
        version: str,
        attributes: dict[str, Any],
        objects: dict[str, ZtObject],
        problems: list[Problem] | None = None,
        parts: list[ZtComponent] | None = None,
    ) -> None:
        self.size = size
        self.manifest_offset = manifest_offset
        self.manifest_size = manifest_size
        self.version = version
        self.attributes = attributes
        self.objects = objects  # well-formed objects, in blob order
        self.problems: list[Problem] = [] if problems is None else problems
        self.parts: list[ZtComponent] = [] if parts is None else parts  # every component

    def components(self) -> list[ZtComponent]:
        """Every component of `objects`, in their order (the list `parse` made: not a copy)."""
        return self.parts


def read_footer(buf: Any, size: int) -> tuple[int, int]:
    """(manifest offset, manifest size) after the spec's checks (IV.1 steps 1-4)."""
    if size < HEADER_SIZE + FOOTER_SIZE:
        raise FormatError(
            ZT_TRUNCATED,
            f"file is {size} bytes; magic and footer alone need {HEADER_SIZE + FOOTER_SIZE}",
            offset=size,
            field="footer",
        )
    if bytes(buf[:HEADER_SIZE]) != MAGIC:
        raise FormatError(
            ZT_TRUNCATED, "the file does not start with ZTEN1000", offset=0, field="magic"
        )
    tail = bytes(buf[size - FOOTER_SIZE : size])
    if tail[8:] != MAGIC:
        raise FormatError(
            ZT_FOOTER_MAGIC,
            f"the file ({size:,} bytes) ends with {tail[8:]!r}, not the footer magic "
            "b'ZTEN1000': it is cut short (its size is recorded only in the missing footer) or "
            "its writer did not finish",
            offset=size - 8,
            field="footer_magic",
        )
    msize = struct.unpack("<Q", tail[:8])[0]
    if msize > MAX_MANIFEST:
        raise FormatError(
            ZT_MANIFEST_SIZE,
            f"manifest size {msize:,} exceeds the 1 GiB limit (spec IV.1): refusing to read it",
            offset=size - FOOTER_SIZE,
            field="manifest_size",
        )
    if msize > size - HEADER_SIZE - FOOTER_SIZE:
        raise FormatError(
            ZT_MANIFEST_SIZE,
            f"manifest size {msize:,} is larger than the {size - HEADER_SIZE - FOOTER_SIZE:,} "
            "bytes between the magic and the footer",
            offset=size - FOOTER_SIZE,
            field="manifest_size",
        )
    return size - FOOTER_SIZE - msize, msize


def decode_manifest(buf: Any, offset: int, size: int) -> dict[str, Any]:
    raw = memoryview(buf)[offset : offset + size]
    try:
        root = cbor.loads(raw)
    except cbor.CborError as err:
        raise FormatError(
            ZT_CBOR, f"manifest: {err.message}", offset=offset + err.offset, field="manifest"
        ) from None
    finally:
        raw.release()
    if not isinstance(root, dict):
        raise FormatError(
            ZT_SCHEMA,
            f"the manifest is a CBOR {type(root).__name__}, not a map",
            offset=offset,
            field="manifest",
        )
    return root


_U64 = 1 << 64


def parse(buf: Any, size: int) -> ZtFile:
    """Footer, manifest and schema. Raises FormatError only when nothing can be checked; other
    schema problems are collected in `problems` and the object concerned is left out."""
    moff, msize = read_footer(buf, size)
    root = decode_manifest(buf, moff, msize)
    version = root.get("version")
    if not isinstance(version, str):
        raise FormatError(
            ZT_SCHEMA,
            "the manifest has no text field 'version' (required)",
            offset=moff,
            field="version",
        )
    objects = root.get("objects")
    if not isinstance(objects, dict):
        raise FormatError(
            ZT_SCHEMA,
            "the manifest has no map 'objects' (required)",
            offset=moff,
            field="objects",
        )
    attributes = root.get("attributes", {})
    # The decoded manifest is not kept: the parse keeps what it checked (the objects and their
    # components), and the CBOR maps and arrays, about five per tensor, are freed with `root`.
    zt = ZtFile(size, moff, msize, version, {}, {})
    if not isinstance(attributes, dict):
        zt.problems.append(Problem(ZT_SCHEMA, "root 'attributes' is not a map", field="attributes"))
    else:
        zt.attributes = attributes
    # Blob order: by first component offset (then name), so reading follows the file. Names
    # are the keys of one map, so the sort never compares two objects.
    keyed: list[tuple[int, str, ZtObject]] = []
    for name, obj in objects.items():
        got = _parse_object(name, obj, zt.problems)
        if got is not None:
            comps = got.components
            first = min(c.offset for c in comps.values()) if len(comps) > 1 else 0
            if len(comps) == 1:
                for c in comps.values():
                    first = c.offset
            keyed.append((first, name, got))
    keyed.sort()
    zt.objects = {name: o for _, name, o in keyed}
    zt.parts = [c for o in zt.objects.values() for c in o.components.values()]
    return zt


def _parse_object(name: str, obj: Any, problems: list[Problem]) -> ZtObject | None:
    if type(obj) is not dict:
        problems.append(
            Problem(ZT_SCHEMA, f"object {name!r} is not a map", field=f"objects/{name}")
        )
        return None
    shape: Any = obj.get("shape")
    ok = type(shape) is list  # what the CBOR decoder gives: exact types (bool is not an int)
    if ok:
        for d in shape:
            if type(d) is not int or d < 0:
                ok = False
                break
    if not ok:
        problems.append(
            Problem(
                ZT_SCHEMA,
                f"object {name!r}: shape must be an array of unsigned integers, got {shape!r:.60}",
                field=f"objects/{name}/shape",
            )
        )
        return None
    if len(shape) > 64 or element_count(shape) >= 1 << 64:
        problems.append(
            Problem(
                ZT_SCHEMA,
                f"object {name!r}: shape {shape!r:.80} has rank above 64 or 2**64+ elements",
                field=f"objects/{name}/shape",
            )
        )
        return None
    layout = obj.get("format")
    if type(layout) is not str:
        problems.append(
            Problem(
                ZT_SCHEMA,
                f"object {name!r}: 'format' (text) is required",
                field=f"objects/{name}/format",
            )
        )
        return None
    attributes = obj.get("attributes", {})
    if type(attributes) is not dict:
        problems.append(
            Problem(
                ZT_SCHEMA,
                f"object {name!r}: 'attributes' is not a map",
                field=f"objects/{name}/attributes",
            )
        )
        return None
    comps = obj.get("components")
    if type(comps) is not dict:
        problems.append(
            Problem(
                ZT_SCHEMA,
                f"object {name!r}: 'components' (map) is required",
                field=f"objects/{name}/components",
            )
        )
        return None
    out: dict[str, ZtComponent] = {}
    ok = True
    for role, comp in comps.items():
        # A component with every field well-formed (with a digest, or without one and
        # nothing like it) gives no problem: made here.
        # Anything else goes through _parse_component, which reports what is wrong.
        if (
            type(comp) is dict
            and type(dtype := comp.get("dtype")) is str
            and dtype in DTYPES
            and type(offset := comp.get("offset")) is int
            and 0 <= offset < _U64
            and type(length := comp.get("length")) is int
            and 0 <= length < _U64
            and (encoding := comp.get("encoding", "raw")) in ENCODINGS
            and (
                type(digest := comp.get("digest")) is str
                # no digest, and no other key that could be a damaged 'digest'
                or (digest is None and _UNSIGNED_KEYS.issuperset(comp))
            )
        ):
            where = f"objects/{name}/components/{role}"
            out[role] = ZtComponent(name, role, dtype, offset, length, encoding, digest, where)
            continue
        parsed = _parse_component(name, role, comp, problems)
        if parsed is None:
            ok = False
        else:
            out[role] = parsed
    if not ok:
        return None
    return ZtObject(name, tuple(shape), layout, out, attributes)


# The keys of a component without a digest that can be judged at once (files written
# without digests, as ztensor 1.1.1 writes them): any other key may be a damaged 'digest'.
_UNSIGNED_KEYS = frozenset(("dtype", "offset", "length", "encoding"))


def _near_digest_key(comp: dict[Any, Any]) -> str | None:
    """A key one character away from 'digest' (one changed byte of the manifest)."""
    for key in comp:
        if (
            isinstance(key, str)
            and len(key) == len("digest")
            and sum(a != b for a, b in zip(key, "digest", strict=True)) == 1
        ):
            return key
    return None


def _parse_component(
    name: str, role: str, comp: Any, problems: list[Problem]
) -> ZtComponent | None:
    where = f"objects/{name}/components/{role}"
    if type(comp) is not dict:
        problems.append(Problem(ZT_SCHEMA, f"{name}/{role}: component is not a map", field=where))
        return None
    dtype = comp.get("dtype")
    if type(dtype) is not str or dtype not in DTYPES:
        problems.append(
            Problem(
                ZT_SCHEMA,
                f"{name}/{role}: dtype {dtype!r:.40} is not one the spec lists "
                f"({', '.join(DTYPES)})",
                field=f"{where}/dtype",
            )
        )
        return None
    offset: Any = comp.get("offset")
    length: Any = comp.get("length")
    if not (
        type(offset) is int and 0 <= offset < _U64 and type(length) is int and 0 <= length < _U64
    ):
        for key, value in (("offset", offset), ("length", length)):
            if type(value) is not int or not 0 <= value < _U64:  # bool is not an int here
                problems.append(
                    Problem(
                        ZT_SCHEMA,
                        f"{name}/{role}: {key} must be an unsigned 64-bit integer, got "
                        f"{value!r:.40}",
                        field=f"{where}/{key}",
                    )
                )
                return None
    encoding = comp.get("encoding", "raw")
    if encoding not in ENCODINGS:
        problems.append(
            Problem(
                ZT_SCHEMA,
                f"{name}/{role}: encoding {encoding!r:.40} is not raw or zstd",
                field=f"{where}/encoding",
            )
        )
        return None
    digest = comp.get("digest")
    if digest is None:
        damaged = _near_digest_key(comp)
        if damaged is not None:
            problems.append(
                Problem(
                    ZT_DIGEST_UNKNOWN,
                    f"{name}/{role}: key {damaged!r} looks like a damaged 'digest' key; the "
                    "component cannot be verified",
                    field=f"{where}/{damaged}",
                )
            )
    elif type(digest) is not str:
        problems.append(
            Problem(ZT_SCHEMA, f"{name}/{role}: digest is not text", field=f"{where}/digest")
        )
        return None
    return ZtComponent(name, role, dtype, offset, length, encoding, digest, where)


# Digests ------------------------------------------------------------------------------------

_CRC_RE = re.compile(r"crc32c:0x([0-9a-fA-F]{8})")
_SHA_RE = re.compile(r"sha256:([0-9a-fA-F]{64})")
# Exactly the digests parse_digest accepts as known (a check of many at once needs no values).
KNOWN_DIGEST = re.compile(r"crc32c:0x[0-9a-fA-F]{8}|sha256:[0-9a-fA-F]{64}")


class Digester:
    """Incremental digest of stored bytes, in the manifest's text form."""

    def __init__(self, algorithm: str) -> None:
        self.algorithm = algorithm
        if algorithm == "crc32c":
            self._crc = 0
        elif algorithm == "sha256":
            import hashlib  # only for sha256 digests: it loads OpenSSL

            self._sha = hashlib.sha256()
        else:  # pragma: no cover - callers validate
            raise ValueError(algorithm)

    def update(self, data: Any) -> None:
        if self.algorithm == "crc32c":
            self._crc = crc.crc32c(data, self._crc)
        else:
            self._sha.update(data)

    def text(self) -> str:
        if self.algorithm == "crc32c":
            return f"crc32c:0x{self._crc:08X}"
        return f"sha256:{self._sha.hexdigest()}"


def parse_digest(text: str) -> tuple[str, str] | None:
    """(algorithm, normalised value) for a digest matrixctl computes; None for an unknown
    algorithm; raises ValueError for a malformed value of a known one."""
    algo, sep, _ = text.partition(":")
    if algo == "crc32c":
        m = _CRC_RE.fullmatch(text)
        if not m:
            raise ValueError("crc32c digests are crc32c:0x followed by 8 hex digits")
        return algo, m.group(1).upper()
    if algo == "sha256":
        m = _SHA_RE.fullmatch(text)
        if not m:
            raise ValueError("sha256 digests are sha256: followed by 64 hex digits")
        return algo, m.group(1).lower()
    if not sep:
        raise ValueError("a digest is ALGORITHM:VALUE")
    return None


def same_digest(want: str, got: str) -> bool:
    a, b = parse_digest(want), parse_digest(got)
    return a is not None and a == b


# Streaming components -----------------------------------------------------------------------


def decoded_cap(obj: ZtObject, comp: ZtComponent) -> tuple[int, bool]:
    """(the decoded byte size a component may have, whether that size is exact).

    Dense data is exactly count x itemsize. For other layouts the shape bounds the count of
    each component (no more values, indices or scales than logical elements; indptr is
    rows + 1), so a decompressor stops there.
    """
    size = DTYPES[comp.dtype].itemsize
    if obj.layout == "dense":
        return obj.count * size, True
    ggml = ggml_blocks(obj)
    if ggml is not None and comp.dtype == "u8":
        # Raw ggml blocks (GGUF --keep-quantized): the exact size, scales inside the blocks.
        return (ggml if comp.role == "packed_weight" else 0), True
    if comp.role == "indptr" and obj.shape:
        return (obj.shape[0] + 1) * size, True
    return max(obj.count, 1) * size, False


def ggml_blocks(obj: ZtObject) -> int | None:
    """For a quantized_group object holding raw ggml blocks (attributes `quantization: ggml`,
    a known `ggml_type` with its `block_size` and `type_size`, whole blocks along the last
    axis): the byte size of its blocks. None for any other object, or when the attributes do
    not describe valid blocks (the ggml rule of the validator reports those)."""
    if obj.layout != "quantized_group" or obj.attributes.get("quantization") != "ggml":
        return None
    from matrixctl.formats.gguf import GGML_BY_NAME

    gtype = GGML_BY_NAME.get(str(obj.attributes.get("ggml_type")))
    if gtype is None or not gtype.quantized:
        return None
    for key, want in (
        ("ggml_type_id", gtype.id),
        ("block_size", gtype.block_size),
        ("type_size", gtype.type_size),
    ):
        if obj.attributes.get(key, want) != want:
            return None
    row = obj.shape[-1] if obj.shape else 1
    if row % gtype.block_size:
        return None
    return obj.count // gtype.block_size * gtype.type_size


ZSTD_MAGIC = 0xFD2FB528
ZSTD_BLOCK_MAX = 128 * 1024


def zstd_frames(data: Any) -> int | None:
    """Walk the zstd frames of `data` by their headers, without decoding: raise ValueError if
    a frame is truncated or malformed or garbage follows; return the decoded size the frames
    declare (None when one of them does not say). zstd's streaming decoder returns short
    output without an error for a truncated frame, so this walk is what catches it."""
    view = memoryview(data).cast("B")
    n = len(view)
    pos = 0
    total: int | None = 0
    if n == 0:
        raise ValueError("no zstd frame")
    while pos < n:
        if n - pos < 4:
            raise ValueError(f"{n - pos} stray bytes after the last frame")
        magic = int.from_bytes(view[pos : pos + 4], "little")
        if magic & 0xFFFFFFF0 == 0x184D2A50:  # skippable frame
            if n - pos < 8:
                raise ValueError("truncated skippable frame header")
            size = int.from_bytes(view[pos + 4 : pos + 8], "little")
            if size > n - pos - 8:
                raise ValueError("truncated skippable frame")
            pos += 8 + size
            continue
        if magic != ZSTD_MAGIC:
            raise ValueError(f"bytes at {pos} are not a zstd frame (magic 0x{magic:08x})")
        pos += 4
        if pos >= n:
            raise ValueError("truncated frame header")
        fhd = view[pos]
        pos += 1
        fcs_flag, single, checksum, dict_flag = fhd >> 6, (fhd >> 5) & 1, (fhd >> 2) & 1, fhd & 3
        if fhd & 0x08:
            raise ValueError("reserved bit set in the frame header")
        header = (0 if single else 1) + (0, 1, 2, 4)[dict_flag]
        fcs_size = (1 if single else 0, 2, 4, 8)[fcs_flag]
        if n - pos < header + fcs_size:
            raise ValueError("truncated frame header")
        fcs_at = pos + header
        pos = fcs_at + fcs_size
        if fcs_size:
            fcs = int.from_bytes(view[fcs_at:pos], "little") + (256 if fcs_size == 2 else 0)
            total = None if total is None else total + fcs
        else:
            total = None
        while True:
            if n - pos < 3:
                raise ValueError("truncated block header")
            bh = int.from_bytes(view[pos : pos + 3], "little")
            pos += 3
            last, btype, bsize = bh & 1, (bh >> 1) & 3, bh >> 3
            if btype == 3:
                raise ValueError("reserved block type")
            if btype != 1 and bsize > ZSTD_BLOCK_MAX:
                raise ValueError(f"block of {bsize} bytes exceeds 128 KiB")
            content = 1 if btype == 1 else bsize
            if n - pos < content:
                raise ValueError("truncated block")
            pos += content
            if last:
                break
        if checksum:
            if n - pos < 4:
                raise ValueError("truncated frame checksum")
            pos += 4
    return total


def zstd_frame_size(data: Any) -> int | None:
    """The decoded size the zstd frames declare, or None if they do not (or are malformed)."""
    try:
        return zstd_frames(data)
    except ValueError:
        return None


def iter_zstd(
    data: Any, cap: int, where: str, offset: int, chunk: int = CHUNK_BYTES
) -> Iterator[bytes]:
    """Decode zstd `data` (one or more frames) in chunks, refusing to go past `cap` bytes."""
    import zstandard

    try:
        zstd_frames(data)
    except ValueError as exc:
        raise FormatError(
            ZT_ZSTD, f"{where}: invalid zstd data ({exc})", offset=offset, field=where
        ) from None
    dctx = zstandard.ZstdDecompressor(max_window_size=ZSTD_MAX_WINDOW)
    total = 0
    try:
        reader = dctx.stream_reader(data, read_across_frames=True, read_size=1 << 20)
        while True:
            piece = reader.read(min(chunk, cap - total + 1))
            if not piece:
                break
            total += len(piece)
            if total > cap:
                raise FormatError(
                    ZT_ZSTD_SIZE,
                    f"{where}: zstd data decodes to more than the {cap:,} bytes its shape and "
                    "dtype allow; stopped there",
                    offset=offset,
                    field=where,
                )
            yield piece
    except zstandard.ZstdError as exc:
        raise FormatError(
            ZT_ZSTD, f"{where}: invalid zstd data ({exc})", offset=offset, field=where
        ) from None


def stream_component(
    buf: Any,
    obj: ZtObject,
    comp: ZtComponent,
    *,
    verify_digest: bool = True,
    exact: bool = True,
    chunk: int = CHUNK_BYTES,
) -> Iterator[Any]:
    """Decoded bytes of a component whose bounds were checked. Raw data comes as zero-copy
    slices of `buf` (`StoredBytes`, which a sink may copy inside the kernel); the digest (over
    the stored bytes) is checked before the first byte is handed out or copied, so a consumer
    never starts on damaged data."""
    where = f"{obj.name}/{comp.role}"
    check = None
    if verify_digest and comp.digest:
        known = parse_digest(comp.digest)
        if known is not None:
            algorithm = known[0]

            def verify() -> tuple[Callable[[Any], Any], Callable[[], None]]:
                digester = Digester(algorithm)
                return digester.update, lambda: _check_digest(comp, digester)

            def check() -> None:
                update, finish = verify()
                for piece in read_pieces(buf, comp.offset, comp.length, chunk):
                    update(piece)
                finish()

    if comp.encoding == "raw":
        return StoredBytes(
            buf, comp.offset, comp.length, chunk, check, verify if check is not None else None
        )
    return _zstd_pieces(buf, obj, comp, where, exact, chunk, check)


def _zstd_pieces(
    buf: Any,
    obj: ZtObject,
    comp: ZtComponent,
    where: str,
    exact: bool,
    chunk: int,
    check: Callable[[], None] | None,
) -> Iterator[bytes]:
    if check is not None:
        check()
    cap, is_exact = decoded_cap(obj, comp)
    total = 0
    stored = memoryview(buf)[comp.offset : comp.end]
    for piece in iter_zstd(stored, cap, where, comp.offset, chunk):
        total += len(piece)
        yield piece
    drop_pages(buf, comp.offset, comp.length)
    if exact and is_exact and total != cap:
        raise FormatError(
            ZT_ZSTD_SIZE,
            f"{where}: zstd data decodes to {total:,} bytes, shape and dtype give {cap:,}",
            offset=comp.offset,
            field=comp.field,
        )


def partial_element(obj: ZtObject, comp: ZtComponent, total: int) -> FormatError | None:
    """The error for a zstd component that decodes to `total` bytes, not a whole number of
    its dtype's elements (None when it is whole)."""
    if total % comp.itemsize == 0:
        return None
    return FormatError(
        ZT_ZSTD_SIZE,
        f"{obj.name}/{comp.role}: decodes to {total:,} bytes, not a whole number of "
        f"{comp.dtype} elements",
        offset=comp.offset,
        field=comp.field,
    )


def _check_digest(comp: ZtComponent, digester: Digester) -> None:
    got = digester.text()
    if comp.digest is not None and not same_digest(comp.digest, got):
        raise FormatError(
            ZT_DIGEST,
            f"{comp.obj}/{comp.role}: digest is {comp.digest}, the stored bytes give {got}",
            offset=comp.offset,
            field=f"{comp.field}/digest",
        )


def decoded_count(buf: Any, obj: ZtObject, comp: ZtComponent) -> int:
    """Elements a component holds once decoded (decoding zstd data without a declared size)."""
    size = comp.itemsize
    if comp.encoding == "raw":
        return comp.length // size
    declared = zstd_frame_size(memoryview(buf)[comp.offset : comp.end])
    if declared is not None:
        return declared // size
    total = sum(len(p) for p in stream_component(buf, obj, comp, verify_digest=False, exact=False))
    return total // size


# Reading for convert ------------------------------------------------------------------------


def to_info(buf: Any, obj: ZtObject) -> TensorInfo:
    if obj.layout == "dense":
        data = obj.components["data"]
        return TensorInfo(obj.name, data.dtype, obj.shape, "dense", (), obj.attributes)
    roles = LAYOUTS[obj.layout]
    comps = tuple(
        Component(role, obj.components[role].dtype, decoded_count(buf, obj, obj.components[role]))
        for role in roles
    )
    return TensorInfo(obj.name, comps[0].dtype, obj.shape, obj.layout, comps, obj.attributes)


class ZtSource(TensorSource):
    """A zTensor file opened for `convert`: every structural rule of `verify` must pass."""

    format = FORMAT

    def __init__(self, src: Source, checked: Any) -> None:
        self.src = src
        self.subject = checked
        self.zt: ZtFile = self.subject.zt
        unknown = [o for o in self.zt.objects.values() if o.layout not in LAYOUTS]
        if unknown:
            o = unknown[0]
            raise FormatError(
                ZT_LAYOUT,
                f"object {o.name!r} has format {o.layout!r}, which the spec does not define: "
                "it cannot be converted",
                path=src.name,
                field=f"{o.field}/format",
            )
        self._infos = [to_info(src.buf, o) for o in self.zt.objects.values()]

    def tensors(self) -> list[TensorInfo]:
        return list(self._infos)

    def metadata(self) -> dict[str, Any]:
        return dict(self.zt.attributes)

    def stream(self, info: TensorInfo, role: str = "data") -> Iterator[Any]:
        obj = self.zt.objects[info.name]
        return stream_component(self.src.buf, obj, obj.components[role])

    def array(self, info: TensorInfo, role: str = "data", *, verify: bool = True) -> Any:
        """Zero-copy view of raw data (after the digest check, unless `verify=False`)."""
        obj = self.zt.objects[info.name]
        comp = obj.components[role]
        if comp.encoding != "raw":
            import numpy as np

            data = b"".join(bytes(p) for p in self.stream(info, role))
            error = partial_element(obj, comp, len(data))
            if error is not None:  # only the scan rules see it before: refused, not cut
                raise error
            return np.frombuffer(data, dtype=np.dtype(DTYPES[comp.dtype].storage))
        if comp.digest and verify:
            stored = stream_component(self.src.buf, obj, comp)
            assert isinstance(stored, StoredBytes)  # raw
            stored.start()  # the digest check, one pass
        return storage_array(self.src.buf, comp.dtype, comp.offset, comp.length)

    def release(self, info: TensorInfo) -> None:
        obj = self.zt.objects[info.name]
        for comp in obj.components.values():
            drop_pages(self.src.buf, comp.offset, comp.length)


# Writing ------------------------------------------------------------------------------------


class _Counting:
    """Forwards writes to the file, counting them and feeding the digest (for zstd output)."""

    def __init__(self, fp: BinaryIO, digester: Digester | None) -> None:
        self.fp = fp
        self.digester = digester
        self.count = 0

    def write(self, data: Any) -> int:
        if self.digester is not None:
            self.digester.update(data)
        n = self.fp.write(data)
        self.count += len(memoryview(data).cast("B")) if not isinstance(data, bytes) else len(data)
        return n if n is not None else 0

    def flush(self) -> None:
        return None


class ZtWriter:
    """Stream tensors into a zTensor v1.1 file: each component is written as it arrives
    (memory: one chunk), 64-byte aligned with zero padding; the manifest (deterministic CBOR)
    and the footer are written by `finish`. The file object must be positioned at 0."""

    def __init__(
        self,
        fp: BinaryIO,
        *,
        digest: str | None = DEFAULT_DIGEST,
        level: int | None = None,
        attributes: Mapping[str, Any] | None = None,
        overlap_pieces: bool = True,
    ) -> None:
        """`overlap_pieces=False`: every piece is written before the next one is asked for, so
        a stream over a mapped input may release a piece's pages as soon as it yields the next
        (`convert` does); slices inside a piece still overlap."""
        if digest is not None and digest not in DIGESTS:
            raise UsageError(f"--digest must be one of {', '.join(DIGESTS)} or none")
        self.fp = fp
        self.digest = digest
        self.level = level
        self.attributes = dict(attributes or {})
        self.objects: dict[str, dict[str, Any]] = {}
        self.overlap_pieces = overlap_pieces
        self.pos = 0
        # Raw components are written on a helper thread while the next slice is digested (both
        # release the GIL). Pieces are views of mapped inputs or fresh arrays, which stay
        # unchanged until written, as BackgroundWriter requires; `add` waits for the thread
        # before it returns an error, so no write outlives the call that queued it.
        self._bg: BackgroundWriter | None = None
        self._write(MAGIC)

    def _write(self, data: Any) -> None:
        n = len(data) if isinstance(data, bytes) else memoryview(data).nbytes
        if n >= BACKGROUND_MIN:
            if self._bg is None:
                self._bg = BackgroundWriter(self.fp)
            self._bg.write(data)
        elif self._bg is not None:
            self._bg.write(data)
        else:
            self.fp.write(data)
        self.pos += n

    def _wait_queue(self) -> None:
        if self._bg is not None:
            self._bg.drain()

    def _drain(self) -> None:
        if self._bg is not None:
            bg, self._bg = self._bg, None
            bg.close()

    def _abort(self) -> None:
        """Wait for queued writes after an error, keeping the error that stopped us."""
        with contextlib.suppress(BaseException):
            self._drain()

    def _align(self) -> None:
        pad = (-self.pos) % ALIGNMENT
        if pad:
            self._write(bytes(pad))

    def add(
        self,
        name: str,
        shape: tuple[int, ...],
        layout: str,
        parts: list[tuple[str, str, int, Iterator[Any]]],
        attributes: Mapping[str, Any] | None = None,
    ) -> None:
        """Add one object; `parts` is (role, dtype, decoded byte size, byte stream) per
        component, in the order they are written."""
        if name in self.objects:
            raise FormatError(ZT_WRITE, f"tensor {name!r} is added twice", field=name)
        if layout not in LAYOUTS:
            raise FormatError(ZT_WRITE, f"{name}: unknown layout {layout!r}", field=name)
        components: dict[str, dict[str, Any]] = {}
        try:
            for role, dtype, nbytes, stream in parts:
                if dtype not in DTYPES:
                    raise FormatError(
                        ZT_WRITE, f"{name}/{role}: unknown dtype {dtype!r}", field=name
                    )
                components[role] = self._component(f"{name}/{role}", dtype, nbytes, stream)
        except BaseException:
            self._abort()
            raise
        obj: dict[str, Any] = {"shape": list(shape), "format": layout, "components": components}
        if attributes:
            obj["attributes"] = dict(attributes)
        self.objects[name] = obj

    def _component(
        self, where: str, dtype: str, nbytes: int, stream: Iterator[Any]
    ) -> dict[str, Any]:
        self._align()
        offset = self.pos
        digester = Digester(self.digest) if self.digest else None
        got = 0
        if self.level is None:
            stored = isinstance(stream, StoredBytes) and stream.fresh
            if (stored or digester is None) and self._bg is not None:
                # Stored bytes go by the kernel or through copy_stream's reused buffer,
                # written in place: queued writes first.
                self._bg.drain()
            got = copy_stream(
                self.fp,
                stream,
                nbytes,
                where=where,
                code=ZT_WRITE,
                update=digester.update if digester is not None else None,
                write=None if stored else self._write,
                piece_done=None if self.overlap_pieces else self._wait_queue,
            )
            self.pos = offset + got  # copy_stream wrote past self._write when the kernel copied
            length = got
        else:
            import zstandard

            self._drain()
            sink = _Counting(self.fp, digester)
            cctx = zstandard.ZstdCompressor(
                level=self.level, write_content_size=True, write_checksum=True, threads=0
            )
            # No `with`: leaving the block on an error (a full disk in `sink.write`, a short
            # stream) would end the frame, and zstd's "Src size is incorrect" would replace the
            # error that stopped us. The frame is ended only when every byte arrived.
            writer = cctx.stream_writer(sink, size=nbytes, closefd=False)  # type: ignore[arg-type]
            for piece in stream:
                got += memoryview(piece).nbytes
                if got > nbytes:
                    break
                writer.write(piece)
            if got == nbytes:
                writer.flush(zstandard.FLUSH_FRAME)
            length = sink.count
            self.pos += length
        if got != nbytes:
            raise FormatError(
                ZT_WRITE,
                f"{where}: {got:,} bytes arrived, shape and dtype give {nbytes:,}",
                field=where,
            )
        comp: dict[str, Any] = {"dtype": dtype, "offset": offset, "length": length}
        if self.level is not None:
            comp["encoding"] = "zstd"
        if digester is not None:
            comp["digest"] = digester.text()
        return comp

    def manifest(self) -> dict[str, Any]:
        root: dict[str, Any] = {"version": VERSION, "objects": self.objects}
        if self.attributes:
            root["attributes"] = self.attributes
        return root

    def finish(self) -> int:
        """Write the manifest, its size and the footer magic; return the file size."""
        raw = cbor.dumps(self.manifest())
        try:
            self._write(raw)
            self._write(struct.pack("<Q", len(raw)))
            self._write(MAGIC)
        finally:
            self._drain()
        return self.pos


def parse_compress(text: str | None) -> int | None:
    """`zstd`, `zstd:LEVEL` (1-22) or `none`/`raw` -> zstd level or None."""
    if text is None:
        return None
    name, sep, level_text = text.strip().lower().partition(":")
    if name in ("none", "raw") and not sep:
        return None
    if name != "zstd":
        raise UsageError(f"--compress must be zstd, zstd:LEVEL or none, got {text!r}")
    if not sep:
        return DEFAULT_ZSTD_LEVEL
    try:
        level = int(level_text)
    except ValueError:
        raise UsageError(f"--compress zstd:LEVEL needs an integer level, got {text!r}") from None
    if not 1 <= level <= 22:
        raise UsageError(f"zstd levels are 1 to 22, got {level}")
    return level


class ZtSink(TensorSink):
    """`convert` into zTensor: every dtype and layout of the spec; metadata kept as root
    attributes (text values as they are, others as their JSON text, so ztensor 1.1.1 can
    open the file)."""

    format = FORMAT
    dtypes = frozenset(DTYPES)
    layouts = frozenset(LAYOUTS)
    keeps_metadata = True
    accepts = ("compress", "digest")

    def begin(self, out: Outputs, plan: list[TensorInfo], metadata: Mapping[str, Any]) -> None:

        level = self.options.get("compress_level")
        digest = self.options.get("digest", DEFAULT_DIGEST)
        self._notes: list[str] = []
        attributes, converted = text_metadata(metadata)
        if converted:
            self._notes.append(
                f"metadata {', '.join(converted)} stored as JSON text (zTensor root attributes "
                "are text for ztensor 1.1.1)"
            )
        foreign = sorted({p.dtype for i in plan for p in i.parts()} - REFERENCE_DTYPES)
        if foreign:
            self._notes.append(
                f"dtype {', '.join(foreign)} is valid zTensor v1.1 but ztensor 1.1.1 cannot "
                "open files that use it"
            )
        # The source's pages are released as it streams: each piece is written before the next.
        self.writer = ZtWriter(
            out.main, digest=digest, level=level, attributes=attributes, overlap_pieces=False
        )
        self.count = 0

    def add(self, info: TensorInfo, parts: PartStreams) -> None:
        pieces = [(p.role, p.dtype, p.nbytes, parts(p.role)) for p in info.parts()]
        self.writer.add(info.name, info.shape, info.layout, pieces, info.attributes)
        self.count += 1

    def finish(self) -> dict[str, Any]:
        size = self.writer.finish()
        return {
            "bytes": size,
            "encoding": "raw" if self.writer.level is None else f"zstd:{self.writer.level}",
            "digest": self.writer.digest or "none",
        }

    def notes(self) -> list[str]:
        return list(self._notes)


TENSOR_IO = {FORMAT: (ZtSource, ZtSink)}
