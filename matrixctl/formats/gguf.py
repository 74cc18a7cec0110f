"""GGUF (llama.cpp / ggml models and vocabularies): a bounds-checked reader of our own.

Byte layout, versions 2 and 3 (integers little-endian; docs/formats/gguf.md resolves the spec):

    offset  size  field
    0       4     magic b"GGUF"
    4       4     version (u32): 2 or 3 (1 used 32-bit counts and is refused)
    8       8     tensor_count (u64)
    16      8     kv_count (u64)
    24      ..    kv_count metadata pairs: key (string), value_type (u32), value
    ..      ..    tensor_count tensor infos: name (string), n_dims (u32), n_dims dims (u64,
                  ne[0] first: the innermost, contiguous axis), ggml type (u32), offset (u64,
                  relative to the data section)
    D       ..    the data section, D = end of the tensor infos rounded up to the alignment
                  (`general.alignment`, u32, a power of two; 32 when absent); each tensor at
                  D + offset, offset a multiple of the alignment, zero padding between

    string  = length (u64) + that many bytes (UTF-8 by the spec, no terminator)
    value   = u8 i8 u16 i16 u32 i32 f32 (types 0-6), bool (7, one byte 0 or 1), string (8),
              array (9: item type u32, count u64, items), u64 i64 f64 (10-12)

Every count and length is checked against a limit and against the bytes left before anything
is allocated or looped over, so a hostile count (2**63 tensors, a string running past the end)
is refused at once. Strings stay raw bytes (a token that is not UTF-8 survives); string arrays
are walked once and kept as the offsets of their items; numeric arrays are not read at all until
asked for (zero-copy numpy views). A byte-swapped (big-endian) file is recognised and named.

The format's facts (magic, value types, the ggml type table, key names) are
`matrixctl.formats.gguf_constants`, re-exported here under the same names. Dequantization is
`gguf.quants.dequantize`, block range by block range.

Judging a file (rules, findings) is `matrixctl.validate.gguf`; `GgufSource` is the source side
of `convert` (dequantized to f32 by default, or the raw blocks as zTensor `quantized_group`).
"""

from __future__ import annotations

import math
import struct
from array import array
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from matrixctl import codes
from matrixctl.codes import Severity
from matrixctl.errors import FormatError
from matrixctl.findings import Problem

# The format's facts, also read through this module (gguf_format.STRING, GGML_TYPES, ...).
from matrixctl.formats.gguf_constants import (  # noqa: F401
    ALIGNMENT_KEY,
    ARRAY,
    BOOL,
    DEFAULT_ALIGNMENT,
    FLOAT32,
    FLOAT64,
    GGML_BY_NAME,
    GGML_TYPES,
    HEADER_SIZE,
    INT8,
    INT16,
    INT32,
    INT64,
    INTEGER_TYPES,
    MAGIC,
    MAX_DIMS,
    MAX_KEY,
    MAX_NAME,
    MERGES,
    SCALARS,
    STRING,
    TYPE_NAMES,
    UINT8,
    UINT16,
    UINT32,
    UINT64,
    VERSIONS,
    GgmlType,
    ggml_type,
)
from matrixctl.tensors import (
    CHUNK_BYTES,
    Component,
    TensorInfo,
    TensorSource,
    drop_pages,
    element_count,
    mapped_chunks,
    storage_array,
)

if TYPE_CHECKING:
    import numpy as np

    from matrixctl.io import Source

FORMAT = "gguf"
# Limits on what a file may make this reader create (each also bounded by the bytes left).
MAX_KV = 1 << 16
MAX_TENSORS = 1 << 18
MAX_STRING_ITEMS = 1 << 24  # string array items, all arrays together (a vocabulary: ~2**18)
MAX_NESTED_ITEMS = 1 << 16  # items of arrays of arrays, all together
MAX_DEPTH = 8  # arrays of arrays of ...
MAX_RANK_PARSED = 64  # n_dims above this cannot be a tensor: stop parsing there
MIN_KV_BYTES = 8 + 4 + 1  # empty key, type, a one-byte value
MIN_TENSOR_BYTES = 8 + 4 + 4 + 8  # empty name, n_dims 0, type, offset

SCALAR_STRUCTS = {t: struct.Struct(f) for t, (f, _) in SCALARS.items()}

_U32 = struct.Struct("<I").unpack_from
_U64 = struct.Struct("<Q").unpack_from


G = FORMAT
GGUF_TRUNCATED = codes.define(
    "GGUF_TRUNCATED",
    "The file ends inside the header, the metadata or the tensor table (a count, a length or "
    "a value runs past the end).",
    group=G,
)
GGUF_VERSION = codes.define(
    "GGUF_VERSION", "The GGUF version is not 2 or 3 (version 1 is no longer read).", group=G
)
GGUF_BYTE_ORDER = codes.define(
    "GGUF_BYTE_ORDER",
    "The file is a byte-swapped (big-endian) GGUF; matrixctl reads little-endian GGUF only.",
    group=G,
)
GGUF_COUNT = codes.define(
    "GGUF_COUNT",
    "A count (tensors, keys, array items, dimensions) exceeds matrixctl's limit or cannot fit "
    "in the bytes left; nothing is allocated for it.",
    group=G,
)
GGUF_VALUE_TYPE = codes.define(
    "GGUF_VALUE_TYPE", "A metadata value type (or array item type) is not one of 0-12.", group=G
)
GGUF_MAGIC = codes.define(
    "GGUF_MAGIC",
    "A file named .gguf, whose bytes no format claims, does not start with the magic GGUF.",
    group=G,
)
GGUF_DUP_KEY = codes.define("GGUF_DUP_KEY", "Two metadata pairs have the same key.", group=G)
GGUF_KEY = codes.define(
    "GGUF_KEY",
    "A metadata key is empty, longer than 65,535 bytes, or not ASCII lower_snake_case "
    "segments separated by dots, as the spec requires.",
    group=G,
    severity=Severity.WARNING,
)
GGUF_BOOL = codes.define("GGUF_BOOL", "A bool value is a byte other than 0 or 1.", group=G)
GGUF_NESTED_ARRAY = codes.define(
    "GGUF_NESTED_ARRAY",
    "A metadata array holds arrays: the spec allows it, llama.cpp refuses such files.",
    group=G,
    severity=Severity.WARNING,
)
GGUF_ALIGNMENT = codes.define(
    "GGUF_ALIGNMENT",
    "general.alignment is not a uint32 power of two: the data section cannot be located.",
    group=G,
)
GGUF_TENSOR_NAME = codes.define(
    "GGUF_TENSOR_NAME",
    "A tensor name is repeated, empty, not UTF-8, or 64 bytes or longer (llama.cpp's limit).",
    group=G,
)
GGUF_TENSOR_SHAPE = codes.define(
    "GGUF_TENSOR_SHAPE",
    "A tensor has more than 4 dimensions, a dimension or element count of 2**63 or more, or "
    "rows that are not a whole number of its type's blocks.",
    group=G,
)
GGUF_TENSOR_TYPE = codes.define(
    "GGUF_TENSOR_TYPE", "A tensor's ggml type id is not a known type.", group=G
)
GGUF_TENSOR_ALIGN = codes.define(
    "GGUF_TENSOR_ALIGN", "A tensor's data offset is not a multiple of the alignment.", group=G
)
GGUF_TENSOR_BOUNDS = codes.define(
    "GGUF_TENSOR_BOUNDS", "A tensor's data runs past the end of the file.", group=G
)
GGUF_TENSOR_OVERLAP = codes.define("GGUF_TENSOR_OVERLAP", "Two tensors share bytes.", group=G)
GGUF_LAYOUT = codes.define(
    "GGUF_LAYOUT",
    "Tensors are not stored back to back in table order (each padded to the alignment), the "
    "layout llama.cpp requires.",
    group=G,
    severity=Severity.WARNING,
)
GGUF_TRAILING = codes.define(
    "GGUF_TRAILING",
    "Bytes after the last tensor and its padding belong to no tensor.",
    group=G,
    severity=Severity.WARNING,
)
GGUF_PADDING = codes.define(
    "GGUF_PADDING",
    "A padding byte (before the data section or between tensors) is not 0x00.",
    group=G,
    severity=Severity.WARNING,
)
GGUF_UTF8 = codes.define(
    "GGUF_UTF8",
    "A string (a metadata value or a token) is not valid UTF-8; it is kept as raw bytes.",
    group=G,
    severity=Severity.WARNING,
)
GGUF_TOKENIZER = codes.define(
    "GGUF_TOKENIZER",
    "The tokenizer metadata is inconsistent: tokens not a string array, scores or token types "
    "of another length or type, a special token id out of range, an unknown token type.",
    group=G,
)
GGUF_VOCAB_EMBD = codes.define(
    "GGUF_VOCAB_EMBD",
    "token_embd.weight does not have one row per token of the vocabulary.",
    group=G,
    severity=Severity.WARNING,
)
GGUF_DEQUANT = codes.define(
    "GGUF_DEQUANT",
    "The installed gguf package cannot dequantize this ggml type; --keep-quantized stores its "
    "blocks as they are.",
    group=G,
)


# Parsed structure ---------------------------------------------------------------------------


@dataclass
class GgufArray:
    """An array value. Items are not read: numeric items are `count` fixed-size values at
    `offset`; string items are at the offsets in `starts` (each preceded by its u64 length);
    arrays of arrays list their items in `items`."""

    item_type: int
    count: int
    offset: int  # absolute offset of the first item
    end: int  # absolute offset just past the last item
    starts: array | None = None  # string items: offset of each string's bytes
    items: list[GgufArray] | None = None

    @property
    def type_name(self) -> str:
        if self.item_type == ARRAY and self.items:
            return f"array[{self.items[0].type_name}]"
        return f"array[{TYPE_NAMES[self.item_type]}]"

    def string(self, buf: Any, i: int) -> bytes:
        assert self.starts is not None
        start = self.starts[i]
        (n,) = _U64(buf, start - 8)
        return bytes(buf[start : start + n])

    def strings(self, buf: Any, first: int = 0, stop: int | None = None) -> list[bytes]:
        """String items `first`..`stop` (default: all) as bytes (the lengths were checked
        when walking)."""
        assert self.starts is not None
        out: list[bytes] = []
        append = out.append
        for start in self.starts[first:stop]:
            (n,) = _U64(buf, start - 8)
            append(buf[start : start + n])
        return out

    def joined(self, buf: Any, first: int = 0, stop: int | None = None) -> bytes:
        """String items `first`..`stop` joined by NUL bytes, cut out of the mapped file with
        numpy (the strings lie back to back, each after its 8-byte length: keep each length's
        first byte as the separator, drop the other seven): one copy, no per-item slicing."""
        import numpy as np

        assert self.starts is not None
        starts = np.frombuffer(self.starts, dtype=np.uint64)[first:stop].astype(np.int64)
        if starts.size == 0:
            return b""
        (last,) = _U64(buf, int(starts[-1]) - 8)
        lo, hi = int(starts[0]), int(starts[-1]) + int(last)
        region = np.frombuffer(buf, dtype=np.uint8, count=hi - lo, offset=lo).copy()
        prefixes = starts[1:] - lo
        keep = np.ones(hi - lo, dtype=bool)
        for k in range(1, 8):
            keep[prefixes - k] = False
        region[prefixes - 8] = 0
        return region[keep].tobytes()

    def head(self, buf: Any, n: int) -> list[Any]:
        """The first `n` items as Python values (strings as bytes) without numpy."""
        if self.item_type == STRING:
            return [self.string(buf, i) for i in range(min(n, self.count))]
        if self.item_type == ARRAY:
            return [f"{a.type_name} x {a.count}" for a in (self.items or [])[:n]]
        st = SCALAR_STRUCTS[self.item_type]
        out = [st.unpack_from(buf, self.offset + i * st.size)[0] for i in range(min(n, self.count))]
        return [bool(v) if self.item_type == BOOL else v for v in out]

    def numpy(self, buf: Any) -> np.ndarray:
        """Numeric items as a zero-copy little-endian numpy view (bool as uint8)."""
        import numpy as np

        dtype = np.dtype(SCALARS[self.item_type][1])
        return np.frombuffer(buf, dtype=dtype, count=self.count, offset=self.offset)

    def values(self, buf: Any) -> list[Any]:
        """Every item as Python values (strings as bytes, nested arrays as lists)."""
        if self.item_type == STRING:
            return self.strings(buf)
        if self.item_type == ARRAY:
            return [a.values(buf) for a in self.items or []]
        values = array(SCALARS[self.item_type][0][1])
        values.frombytes(bytes(buf[self.offset : self.end]))
        out = values.tolist()
        return [bool(v) for v in out] if self.item_type == BOOL else out


@dataclass
class GgufKV:
    key: bytes
    name: str  # the key as text (undecodable bytes backslash-escaped)
    vtype: int
    offset: int  # where the pair starts
    value_offset: int
    value: Any  # int | float | bool-byte | bytes (string) | GgufArray

    @property
    def type_name(self) -> str:
        if isinstance(self.value, GgufArray):
            return self.value.type_name
        return TYPE_NAMES[self.vtype]


@dataclass
class GgufTensor:
    index: int
    name: str
    raw_name: bytes
    dims: tuple[int, ...]  # GGUF order: ne[0] (innermost) first
    type_id: int
    rel_offset: int
    info_offset: int  # where the tensor info starts in the file
    gtype: GgmlType | None
    offset: int = 0  # absolute data offset (data section + rel_offset)
    nbytes: int | None = None  # None when the type is unknown or the shape is invalid

    @property
    def shape(self) -> tuple[int, ...]:
        """numpy / safetensors order: outermost first (row i of a matrix is contiguous)."""
        return tuple(reversed(self.dims))

    @property
    def count(self) -> int:
        return element_count(self.dims)

    @property
    def type_name(self) -> str:
        return self.gtype.name if self.gtype else f"type {self.type_id}"

    @property
    def end(self) -> int:
        return self.offset + (self.nbytes or 0)

    @property
    def field(self) -> str:
        return f"tensors[{self.index}]"


@dataclass
class GgufFile:
    size: int
    version: int
    tensor_count: int
    kv_count: int
    kvs: dict[str, GgufKV]
    tensors: list[GgufTensor]
    info_end: int  # end of the tensor table
    alignment: int
    alignment_ok: bool
    data_offset: int
    problems: list[Problem] = field(default_factory=list)

    def get(self, key: str) -> Any:
        kv = self.kvs.get(key)
        return None if kv is None else kv.value

    def text(self, key: str) -> str | None:
        value = self.get(key)
        if isinstance(value, bytes):
            return value.decode("utf-8", "backslashreplace")
        return None


# Parsing ------------------------------------------------------------------------------------


def _truncated(what: str, offset: int, need: int, left: int, field_name: str) -> FormatError:
    return FormatError(
        GGUF_TRUNCATED,
        f"{what} needs {need:,} bytes at offset {offset:,}, but the file has only {max(left, 0):,} "
        f"left (file is {offset + max(left, 0):,} bytes, expected at least {offset + need:,})",
        offset=offset,
        field=field_name,
    )


def sniff_byte_order(head: bytes) -> str | None:
    """'little', 'big' or None (not GGUF) from the first 8 bytes."""
    if len(head) < 8 or head[:4] != MAGIC:
        return None
    version = int.from_bytes(head[4:8], "little")
    if version & 0xFFFF == 0 and version != 0:
        return "big"
    return "little"


class _Reader:
    """A cursor over the mapped file that checks every read against the end first."""

    def __init__(self, buf: Any, size: int) -> None:
        self.buf = buf
        self.size = size
        self.pos = 0
        # What the whole file may make the parser keep: string items (8 bytes each) and
        # nested arrays (an object each), summed over every array.
        self.strings_left = MAX_STRING_ITEMS
        self.nested_left = MAX_NESTED_ITEMS

    def need(self, n: int, what: str, field_name: str) -> None:
        if n > self.size - self.pos:
            raise _truncated(what, self.pos, n, self.size - self.pos, field_name)

    def u32(self, what: str, field_name: str) -> int:
        self.need(4, what, field_name)
        (v,) = _U32(self.buf, self.pos)
        self.pos += 4
        return int(v)

    def u64(self, what: str, field_name: str) -> int:
        self.need(8, what, field_name)
        (v,) = _U64(self.buf, self.pos)
        self.pos += 8
        return int(v)

    def string(self, what: str, field_name: str, limit: int | None = None) -> bytes:
        at = self.pos
        n = self.u64(f"the length of {what}", field_name)
        if limit is not None and n > limit:
            raise FormatError(
                GGUF_COUNT,
                f"{what} declares {n:,} bytes; the limit is {limit:,}",
                offset=at,
                field=field_name,
            )
        if n > self.size - self.pos:
            raise FormatError(
                GGUF_TRUNCATED,
                f"{what} declares {n:,} bytes at offset {self.pos:,}, past the end of the "
                f"{self.size:,}-byte file (expected at least {self.pos + n:,})",
                offset=at,
                field=field_name,
            )
        data = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return data


def _count(value: int, limit: int, min_item: int, left: int, what: str, at: int, fld: str) -> int:
    """A count read from the file, refused above `limit` or when `min_item` bytes per item
    cannot fit in the `left` bytes: nothing is allocated or looped over before this."""
    if value > limit:
        raise FormatError(
            GGUF_COUNT,
            f"{what} is {value:,}; matrixctl reads at most {limit:,}",
            offset=at,
            field=fld,
        )
    if value * min_item > left:
        raise FormatError(
            GGUF_COUNT,
            f"{what} is {value:,}, but the {max(left, 0):,} bytes left hold at most "
            f"{max(left, 0) // min_item:,} (each takes at least {min_item} bytes)",
            offset=at,
            field=fld,
        )
    return value


def _array(r: _Reader, fld: str, problems: list[Problem], depth: int) -> GgufArray:
    at = r.pos
    item_type = r.u32("an array's item type", fld)
    if item_type not in TYPE_NAMES:
        raise FormatError(
            GGUF_VALUE_TYPE,
            f"array item type {item_type} is not a GGUF value type (0-12)",
            offset=at,
            field=fld,
        )
    count_at = r.pos
    count = r.u64("an array's item count", fld)
    left = r.size - r.pos
    if item_type == STRING:
        _count(count, r.strings_left, 8, left, "the array's item count", count_at, fld)
        r.strings_left -= count
        start = r.pos
        starts, r.pos = _walk_strings(r.buf, r.pos, count, r.size, fld)
        return GgufArray(STRING, count, start, r.pos, starts=starts)
    if item_type == ARRAY:
        if depth >= MAX_DEPTH:
            raise FormatError(
                GGUF_COUNT,
                f"arrays nested deeper than {MAX_DEPTH} levels",
                offset=at,
                field=fld,
            )
        _count(count, r.nested_left, 12, left, "the array's item count", count_at, fld)
        r.nested_left -= count
        start = r.pos
        items = [_array(r, f"{fld}[{i}]", problems, depth + 1) for i in range(count)]
        return GgufArray(ARRAY, count, start, r.pos, items=items)
    size = SCALAR_STRUCTS[item_type].size
    if count * size > left:
        raise FormatError(
            GGUF_TRUNCATED,
            f"an array of {count:,} {TYPE_NAMES[item_type]} needs {count * size:,} bytes at "
            f"offset {r.pos:,}, past the end of the {r.size:,}-byte file (expected at least "
            f"{r.pos + count * size:,})",
            offset=count_at,
            field=fld,
        )
    start = r.pos
    r.pos += count * size
    return GgufArray(item_type, count, start, r.pos)


def _walk_strings(buf: Any, pos: int, count: int, end: int, fld: str) -> tuple[array, int]:
    """Offsets of `count` strings starting at `pos`; each length checked against the end."""
    starts = array("Q")
    append = starts.append
    unpack = _U64
    for i in range(count):
        if end - pos < 8:
            raise _truncated(f"the length of item {i}", pos, 8, end - pos, f"{fld}[{i}]")
        (n,) = unpack(buf, pos)
        pos += 8
        if n > end - pos:
            raise FormatError(
                GGUF_TRUNCATED,
                f"item {i} declares {n:,} bytes at offset {pos:,}, past the end of the "
                f"{end:,}-byte file (expected at least {pos + n:,})",
                offset=pos - 8,
                field=f"{fld}[{i}]",
            )
        append(pos)
        pos += n
    return starts, pos


def _value(r: _Reader, vtype: int, fld: str, problems: list[Problem]) -> Any:
    if vtype == STRING:
        return r.string("a string value", fld)
    if vtype == ARRAY:
        arr = _array(r, fld, problems, 0)
        if arr.item_type == ARRAY:
            problems.append(
                Problem(
                    GGUF_NESTED_ARRAY,
                    f"{fld} is an array of arrays: valid GGUF, but llama.cpp refuses the file",
                    arr.offset,
                    fld,
                )
            )
        return arr
    st = SCALAR_STRUCTS[vtype]
    r.need(st.size, f"a {TYPE_NAMES[vtype]} value", fld)
    (value,) = st.unpack_from(r.buf, r.pos)
    if vtype == BOOL and value > 1:
        problems.append(
            Problem(
                GGUF_BOOL,
                f"{fld} is a bool of byte 0x{value:02x}; only 0 and 1 are valid",
                r.pos,
                fld,
            )
        )
    r.pos += st.size
    return value


def _key_ok(key: bytes) -> bool:
    if not key or len(key) > MAX_KEY:
        return False
    for segment in key.split(b"."):
        if not segment or not all(
            c == 0x5F or 0x61 <= c <= 0x7A or 0x30 <= c <= 0x39 for c in segment
        ):
            return False
    return True


def parse(buf: Any, size: int) -> GgufFile:
    """Header, metadata and tensor table. Raises FormatError when the rest cannot be located
    (truncation, a hostile count, an unknown value type, a bad version or byte order); other
    problems are collected in `problems` for the validator."""
    r = _Reader(buf, size)
    r.need(4, "the magic", "magic")
    if bytes(buf[:4]) != MAGIC:
        raise FormatError(
            GGUF_MAGIC,
            f"the file does not start with the magic GGUF (it starts {bytes(buf[:4])!r})",
            offset=0,
            field="magic",
        )
    r.pos = 4
    version = r.u32("the version", "version")
    if version & 0xFFFF == 0 and version != 0:
        swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
        raise FormatError(
            GGUF_BYTE_ORDER,
            f"this GGUF file is big-endian (byte-swapped; version {swapped} read the other way); "
            "matrixctl reads little-endian GGUF only",
            offset=4,
            field="version",
            hint="convert it with `gguf-convert-endian FILE little` (gguf package) first",
        )
    if version not in VERSIONS:
        why = (
            "GGUF version 1 used 32-bit counts and is no longer read (llama.cpp dropped it too)"
            if version == 1
            else f"GGUF version {version} is not one matrixctl reads (2 and 3)"
        )
        raise FormatError(GGUF_VERSION, why, offset=4, field="version")
    count_at = r.pos
    tensor_count = r.u64("the tensor count", "tensor_count")
    kv_at = r.pos
    kv_count = r.u64("the metadata count", "kv_count")
    left = size - r.pos
    _count(kv_count, MAX_KV, MIN_KV_BYTES, left, "kv_count", kv_at, "kv_count")
    _count(
        tensor_count, MAX_TENSORS, MIN_TENSOR_BYTES, left, "tensor_count", count_at, "tensor_count"
    )
    problems: list[Problem] = []
    kvs: dict[str, GgufKV] = {}
    seen: set[bytes] = set()
    for i in range(kv_count):
        at = r.pos
        key = r.string(f"the key of metadata pair {i}", f"kv[{i}].key")
        name = key.decode("utf-8", "backslashreplace")
        key_ok = _key_ok(key)
        fld = name if key_ok else f"kv[{i}]"
        if not key_ok:
            problems.append(
                Problem(
                    GGUF_KEY,
                    f"metadata key {name!r:.80} is not ASCII lower_snake_case segments "
                    "separated by dots (or is empty or longer than 65,535 bytes)",
                    at,
                    f"kv[{i}]",
                )
            )
        type_at = r.pos
        vtype = r.u32(f"the value type of {name!r:.60}", fld)
        if vtype not in TYPE_NAMES:
            raise FormatError(
                GGUF_VALUE_TYPE,
                f"metadata {name!r:.60} has value type {vtype}, not a GGUF type (0-12); the "
                "rest of the file cannot be located",
                offset=type_at,
                field=fld,
            )
        value_at = r.pos
        value = _value(r, vtype, fld, problems)
        if key in seen:
            problems.append(
                Problem(
                    GGUF_DUP_KEY,
                    f"metadata key {name!r:.80} appears twice (the first is "
                    "used; llama.cpp refuses the file)",
                    at,
                    fld,
                )
            )
            continue
        seen.add(key)
        if name in kvs:  # two raw keys that read the same once escaped: keep both visible
            name = f"{name}#{i}"
        kvs[name] = GgufKV(key, name, vtype, at, value_at, value)

    alignment, alignment_ok = DEFAULT_ALIGNMENT, True
    akv = kvs.get(ALIGNMENT_KEY)
    if akv is not None:
        value = akv.value
        if akv.vtype != UINT32:
            alignment_ok = False
            problems.append(
                Problem(
                    GGUF_ALIGNMENT,
                    f"{ALIGNMENT_KEY} is a {akv.type_name}, the spec requires uint32",
                    akv.offset,
                    ALIGNMENT_KEY,
                )
            )
        elif value == 0 or value & (value - 1):
            alignment_ok = False
            problems.append(
                Problem(
                    GGUF_ALIGNMENT,
                    f"{ALIGNMENT_KEY} is {value}, not a power of two",
                    akv.value_offset,
                    ALIGNMENT_KEY,
                )
            )
        else:
            alignment = int(value)

    tensors: list[GgufTensor] = []
    names: dict[str, int] = {}
    for i in range(tensor_count):
        tensors.append(_tensor_info(r, i, names, problems))
    info_end = r.pos
    data_offset = -(-info_end // alignment) * alignment
    gf = GgufFile(
        size=size,
        version=version,
        tensor_count=tensor_count,
        kv_count=kv_count,
        kvs=kvs,
        tensors=tensors,
        info_end=info_end,
        alignment=alignment,
        alignment_ok=alignment_ok,
        data_offset=data_offset,
        problems=problems,
    )
    for t in tensors:
        t.offset = data_offset + t.rel_offset
    return gf


def _tensor_info(r: _Reader, i: int, names: dict[str, int], problems: list[Problem]) -> GgufTensor:
    at = r.pos
    fld = f"tensors[{i}]"
    raw = r.string(f"the name of tensor {i}", f"{fld}.name")
    try:
        name = raw.decode("utf-8")
        bad_name = None
    except UnicodeDecodeError:
        name = raw.decode("utf-8", "backslashreplace")
        bad_name = "is not UTF-8"
    if not raw:
        bad_name = "is empty"
    elif len(raw) > MAX_NAME:
        bad_name = f"is {len(raw)} bytes; llama.cpp allows at most {MAX_NAME}"
    if name in names:
        bad_name = f"repeats the name of tensors[{names[name]}]"
        name = f"{name}#{i}"
    names.setdefault(name, i)
    if bad_name:
        problems.append(
            Problem(GGUF_TENSOR_NAME, f"tensor {i} name {name!r:.80} {bad_name}", at, f"{fld}.name")
        )
    dims_at = r.pos
    n_dims = r.u32(f"the rank of tensor {name!r:.60}", f"{fld}.n_dims")
    if n_dims > MAX_RANK_PARSED or n_dims * 8 > r.size - r.pos:
        raise FormatError(
            GGUF_COUNT,
            f"tensor {name!r:.60} declares {n_dims:,} dimensions (GGUF allows {MAX_DIMS}); "
            "the rest of the table cannot be located",
            offset=dims_at,
            field=f"{fld}.n_dims",
        )
    dims = tuple(r.u64(f"dimension {d} of {name!r:.60}", f"{fld}.dims") for d in range(n_dims))
    type_id = r.u32(f"the type of tensor {name!r:.60}", f"{fld}.type")
    rel_offset = r.u64(f"the data offset of tensor {name!r:.60}", f"{fld}.offset")
    gtype = ggml_type(type_id)
    t = GgufTensor(i, name, raw, dims, type_id, rel_offset, at, gtype)
    shape_problem = None
    if n_dims > MAX_DIMS:
        shape_problem = f"has {n_dims} dimensions; GGUF allows at most {MAX_DIMS}"
    elif any(d >= 1 << 63 for d in dims):
        shape_problem = f"has a dimension of 2**63 or more ({list(dims)})"
    elif element_count(dims) >= 1 << 63:
        shape_problem = f"has {element_count(dims):,} elements, 2**63 or more"
    elif gtype is not None and (dims[0] if dims else 1) % gtype.block_size:
        row = dims[0] if dims else 1
        shape_problem = (
            f"rows of {row:,} elements are not a whole number of {gtype.name} blocks of "
            f"{gtype.block_size}"
        )
    if shape_problem:
        problems.append(
            Problem(
                GGUF_TENSOR_SHAPE, f"tensor {name!r:.60} {shape_problem}", dims_at, f"{fld}.dims"
            )
        )
    elif gtype is None:
        problems.append(
            Problem(
                GGUF_TENSOR_TYPE,
                f"tensor {name!r:.60} has ggml type {type_id}, which is not a known type",
                dims_at + 4 + 8 * n_dims,
                f"{fld}.type",
            )
        )
    else:
        count = element_count(dims)
        t.nbytes = count // gtype.block_size * gtype.type_size
    return t


def parse_source(src: Source) -> GgufFile:
    return parse(src.buf, src.size)


# Display helpers ----------------------------------------------------------------------------


def neutral(text: str, limit: int | None = None) -> str:
    """Text with every non-printable character (controls, terminal escapes, bidi overrides)
    shown as a backslash escape, cut to `limit` characters. Used for keys and strings in
    descriptions, so neither a terminal nor a JSON consumer receives raw control codes."""
    cut = text if limit is None or len(text) <= limit else text[:limit]
    if cut.isprintable():
        out = cut
    else:
        parts = []
        for ch in cut:
            if ch.isprintable() or ch == " ":
                parts.append(ch)
            else:
                code = ord(ch)
                parts.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
        out = "".join(parts)
    if cut is not text:
        out += f"... ({len(text):,} characters)"
    return out


def short_f32(value: float) -> float:
    """The shortest decimal that reads back as the same float32 (1e-06, not
    9.999999974752427e-07): what a person expects to see for a float32 value."""
    if not math.isfinite(value):
        return value
    packed = struct.pack("<f", value)
    for digits in range(1, 10):
        short = float(f"{value:.{digits}g}")
        if struct.pack("<f", short) == packed:
            return short
    return value  # pragma: no cover - 9 significant digits always round-trip a float32


def show_bytes(raw: bytes, limit: int | None = 120) -> str:
    return neutral(raw.decode("utf-8", "backslashreplace"), limit)


def metadata_value(gf: GgufFile, buf: Any, kv: GgufKV) -> Any:
    """A metadata value as JSON-able data for `convert` (strings decoded, escapes for bytes
    that are not UTF-8; arrays as lists)."""
    value = kv.value
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if isinstance(value, GgufArray):
        if value.item_type in SCALARS and value.item_type != BOOL:
            return value.numpy(buf).tolist()  # exact: float32 -> the double it equals
        return _plain(value.values(buf))
    if kv.vtype == BOOL:
        return bool(value)
    return value


def tokenizer_merges(gf: GgufFile, buf: Any) -> list[bytes] | None:
    """tokenizer.ggml.merges as raw strings, or None when absent, empty or not strings."""
    kv = gf.kvs.get(MERGES)
    if (
        kv is None
        or not isinstance(kv.value, GgufArray)
        or kv.value.item_type != STRING
        or kv.value.count == 0
    ):
        return None
    arr = kv.value
    joined = arr.joined(buf)
    if joined.count(b"\x00") == arr.count - 1:
        return joined.split(b"\x00")
    return arr.strings(buf)


def float_array(gf: GgufFile, buf: Any, key: str, n: int) -> list[float] | None:
    """The float array under `key` as Python floats when it has `n` items, else None."""
    kv = gf.kvs.get(key)
    if kv is None or not isinstance(kv.value, GgufArray) or kv.value.count != n:
        return None
    if kv.value.item_type not in (FLOAT32, FLOAT64):
        return None
    values: list[float] = kv.value.numpy(buf).astype("float64").tolist()
    return values


def _plain(items: list[Any]) -> list[Any]:
    return [
        i.decode("utf-8", "backslashreplace")
        if isinstance(i, bytes)
        else _plain(i)
        if isinstance(i, list)
        else i
        for i in items
    ]


# Reading for convert ------------------------------------------------------------------------

DEQUANT_CHUNK = CHUNK_BYTES  # decoded bytes per dequantized piece


def dequantizer(gtype: GgmlType) -> Any:
    """A function from a 1-D uint8 array of whole blocks to their f32 values, from the gguf
    package: its per-type `dequantize_rows` on a (blocks, type_size) view when the type has
    one (4x faster than the generic `gguf.quants.dequantize`, which splits and re-joins
    rows), else `gguf.quants.dequantize`. Raises NotImplementedError (or ValueError) for a
    type gguf cannot dequantize."""
    from gguf import quants
    from gguf.constants import GGMLQuantizationType

    qtype = GGMLQuantizationType(gtype.id)
    cls = getattr(quants, qtype.name, None)
    if cls is not None and getattr(cls, "qtype", None) == qtype and hasattr(cls, "dequantize_rows"):
        cls.init_grid()

        def rows(raw: Any) -> Any:
            return cls.dequantize_rows(raw.reshape(-1, gtype.type_size))

        return rows

    def generic(raw: Any) -> Any:
        return quants.dequantize(raw.reshape(1, -1), qtype)

    return generic


def can_dequantize(gtype: GgmlType) -> bool:
    """Whether the installed gguf package dequantizes this type (tried on one zero block)."""
    if not gtype.quantized:
        return True
    import numpy as np

    try:
        dequantizer(gtype)(np.zeros(gtype.type_size, dtype=np.uint8))
    except (NotImplementedError, ValueError, KeyError, AssertionError, TypeError):
        return False
    return True


def dequantize_blocks(
    buf: Any, offset: int, nbytes: int, gtype: GgmlType, chunk: int = DEQUANT_CHUNK
) -> Iterator[Any]:
    """f32 values of the blocks at `buf[offset:offset+nbytes]`, in pieces of about `chunk`
    decoded bytes, dequantized by the gguf package. Blocks are independent, so any run of
    whole blocks decodes alone; the pages of each run are dropped once it is decoded."""
    import numpy as np

    decode = dequantizer(gtype)
    per_chunk = max(1, chunk // (gtype.block_size * 4))
    step = per_chunk * gtype.type_size
    for start in range(offset, offset + nbytes, step):
        stop = min(offset + nbytes, start + step)
        raw = np.frombuffer(buf, dtype=np.uint8, count=stop - start, offset=start)
        values = decode(raw)
        yield np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
        drop_pages(buf, start, stop - start)


def quantized_info(t: GgufTensor) -> TensorInfo:
    """A quantized tensor kept as its raw ggml blocks (zTensor `quantized_group`)."""
    assert t.gtype is not None and t.nbytes is not None
    g = t.gtype
    return TensorInfo(
        t.name,
        "u8",
        t.shape,
        "quantized_group",
        (
            Component("packed_weight", "u8", t.nbytes),
            Component("scales", "f32", 0),
            Component("zeros", "f32", 0),
        ),
        {
            "quantization": "ggml",
            "ggml_type": g.name,
            "ggml_type_id": g.id,
            "block_size": g.block_size,
            "type_size": g.type_size,
        },
    )


class GgufSource(TensorSource):
    """A GGUF file opened for `convert`: every structural rule of `verify` must pass.

    Plain types (F32, F16, BF16, F64, I8-I64) are dense tensors of that dtype; quantized types
    are dense f32, dequantized block run by block run as they stream, unless `keep_quantized`,
    which hands out their raw blocks as `quantized_group` (scales and zeros are inside the
    blocks: those components are empty; the ggml type and geometry are attributes)."""

    format = FORMAT
    accepts = ("keep_quantized",)

    def __init__(self, src: Source, checked: Any, options: Mapping[str, Any] | None = None) -> None:
        self.src = src
        self.gf: GgufFile = checked.gf
        self.keep = bool((options or {}).get("keep_quantized"))
        self._by_name = {t.name: t for t in self.gf.tensors}
        self._verdict: dict[int, bool] = {}  # ggml type id -> gguf can dequantize it

    def info(self, t: GgufTensor) -> TensorInfo:
        assert t.gtype is not None
        if t.gtype.dtype is not None:
            return TensorInfo(t.name, t.gtype.dtype, t.shape)
        if self.keep:
            return quantized_info(t)
        return TensorInfo(t.name, "f32", t.shape)

    def tensors(self) -> list[TensorInfo]:
        ordered = sorted(self.gf.tensors, key=lambda t: (t.offset, t.index))
        return [self.info(t) for t in ordered]

    def metadata(self) -> dict[str, Any]:
        return {kv.name: metadata_value(self.gf, self.src.buf, kv) for kv in self.gf.kvs.values()}

    def dequantized(self, names: list[str]) -> list[tuple[str, str, int]]:
        """(name, ggml type, stored bytes) of the tensors among `names` that stream
        dequantized to f32 (none under `keep_quantized`): what a conversion reports as lossy
        in size and type (the values are the blocks' exact decoding)."""
        if self.keep:
            return []
        out = []
        for name in names:
            t = self._by_name.get(name)
            if t is not None and t.gtype is not None and t.gtype.quantized:
                out.append((name, t.gtype.name, t.nbytes or 0))
        return out

    def stream(self, info: TensorInfo, role: str = "data") -> Iterator[Any]:
        t = self._by_name[info.name]
        assert t.gtype is not None and t.nbytes is not None
        if info.layout == "quantized_group":
            if role != "packed_weight":
                return iter(())
            return mapped_chunks(self.src.buf, t.offset, t.nbytes)
        if t.gtype.quantized:
            if t.type_id not in self._verdict:  # asked here, not up front: importing gguf
                self._verdict[t.type_id] = can_dequantize(t.gtype)  # costs ~0.25 s
            if not self._verdict[t.type_id]:
                raise FormatError(
                    GGUF_DEQUANT,
                    f"tensor {t.name!r} is {t.gtype.name}, which the installed gguf package "
                    "cannot dequantize",
                    path=self.src.name,
                    field=t.field,
                    hint="--keep-quantized stores its blocks as they are (in .zt)",
                )
            return dequantize_blocks(self.src.buf, t.offset, t.nbytes, t.gtype)
        return mapped_chunks(self.src.buf, t.offset, t.nbytes)

    def array(self, info: TensorInfo, role: str = "data", *, verify: bool = True) -> Any:
        t = self._by_name[info.name]
        assert t.gtype is not None and t.nbytes is not None
        if info.layout == "dense" and not t.gtype.quantized:
            view = memoryview(self.src.buf)[t.offset : t.offset + t.nbytes]
            return storage_array(view, info.dtype)
        return super().array(info, role, verify=verify)

    def release(self, info: TensorInfo) -> None:
        t = self._by_name[info.name]
        drop_pages(self.src.buf, t.offset, t.nbytes or 0)


TENSOR_IO = {FORMAT: (GgufSource, None)}
