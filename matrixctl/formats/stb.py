"""STB `.stb` (SVG-Tensor binary, stb-v0.1.md) and its JSON sidecar.

Byte layout (integers little-endian; decisions in docs/formats/stb.md):

    0    32      header: magic "STB0", version u8 (1), flags u8 (0), tensor_count u16,
                 reserved0 u32, reserved1 u32, data_offset u64 (64-aligned, >= 32 + 32 N),
                 file_size u64 (the file's length)
    32   32 N    tensor table: tensor_id u8, dtype u8 (0 float32, 1 float16, 2 int8,
                 3 int32), rank u8 (0-8), layout u8 (0 ROW_MAJOR, 1 COL_MAJOR,
                 2 CHANNELS_LAST), offset u64 (absolute, 64-aligned, >= data_offset),
                 size_bytes u64, dims[3] u32 (rank <= 3: the dimensions, 0 past rank;
                 rank > 3: dims[0] = index into the sidecar's shape table, dims[1..2] = 0)
    ..           zero padding up to data_offset
    data_offset  tensors, each at a multiple of 64, zero padding between; the file ends at
                 the end of the last tensor

STB stores no names, only four dtypes and (tensor_id being a u8) at most 256 tensors per file.
matrixctl's writer puts tensor names, the shape table for rank > 3, the bin-file table
(KHΛNARY module metadata: bin_file_id -> path, mmap_required) and the file metadata in a JSON
sidecar `NAME.stb.json`, and splits a set of more than `--per-file` (default 256) tensors into
`NAME.stb`, `NAME.1.stb`, `NAME.2.stb`, ... The sidecar is a format of its own (sniffed by its
first bytes): `verify NAME.stb.json` checks the whole set, `convert NAME.stb.json ...` reads it.
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, BinaryIO

from matrixctl import codes, crc
from matrixctl.codes import Severity
from matrixctl.errors import FormatError, UsageError
from matrixctl.findings import Problem
from matrixctl.records import FrozenRecord, Record
from matrixctl.tensors import (
    DTYPES,
    FileCheck,
    Outputs,
    PartStreams,
    TensorInfo,
    TensorSink,
    TensorSource,
    copy_stream,
    drop_pages,
    element_count,
    mapped_chunks,
    storage_array,
)

if TYPE_CHECKING:
    from matrixctl.io import Source

FORMAT = "stb"
SIDECAR_FORMAT = "stb-sidecar"
MAGIC = b"STB0"
VERSION = 1
HEADER = struct.Struct("<4sBBHIIQQ")
ENTRY = struct.Struct("<BBBBQQIII")
HEADER_SIZE = HEADER.size  # 32
ENTRY_SIZE = ENTRY.size  # 32
ALIGNMENT = 64
MAX_PER_FILE = 256  # tensor_id is a u8
MAX_FILES = 256  # bin_file_id is 0-255
MAX_RANK = 8
DIRECT_RANK = 3
GLYPH_REACH = 16  # G_LOAD_BIN_TENSOR: 4-bit bin_file_id and shape_id
U32_MAX = 0xFFFFFFFF

DTYPE_CODES = {0: "f32", 1: "f16", 2: "i8", 3: "i32"}
DTYPE_IDS = {name: code for code, name in DTYPE_CODES.items()}
SPEC_DTYPES = {0: "float32", 1: "float16", 2: "int8", 3: "int32"}
SPEC_DTYPE_IDS = {name: code for code, name in SPEC_DTYPES.items()}
LAYOUTS = {0: "ROW_MAJOR", 1: "COL_MAJOR", 2: "CHANNELS_LAST"}
LAYOUT_IDS = {name: code for code, name in LAYOUTS.items()}

SIDECAR_MAGIC = "matrixctl-stb-sidecar"
SIDECAR_VERSION = 1
MAX_SIDECAR = 256 << 20

G = FORMAT
STB_TRUNCATED = codes.define(
    "STB_TRUNCATED",
    "The file is shorter than the 32-byte header, or than the tensor table it declares.",
    group=G,
)
STB_VERSION = codes.define("STB_VERSION", "version is not 0x01.", group=G)
STB_FLAGS = codes.define("STB_FLAGS", "flags is not 0 (the spec reserves it).", group=G)
STB_RESERVED = codes.define(
    "STB_RESERVED", "reserved0 or reserved1 is not 0.", group=G, severity=Severity.WARNING
)
STB_FILE_SIZE = codes.define("STB_FILE_SIZE", "file_size differs from the file's length.", group=G)
STB_COUNT = codes.define(
    "STB_COUNT",
    "tensor_count is above 256: tensor ids are one byte, so they cannot all differ.",
    group=G,
)
STB_DATA_OFFSET = codes.define(
    "STB_DATA_OFFSET",
    "data_offset is below the end of the tensor table or past file_size (rule 2), or not "
    "64-byte aligned (rule 3).",
    group=G,
)
STB_TENSOR_ID = codes.define("STB_TENSOR_ID", "Two entries have the same tensor_id.", group=G)
STB_DTYPE = codes.define(
    "STB_DTYPE", "A tensor's dtype is not in the enum (0-3): unsupported.", group=G
)
STB_LAYOUT = codes.define(
    "STB_LAYOUT",
    "A tensor's layout is not in the enum (0-2), or cannot be read as row-major "
    "(CHANNELS_LAST is checked but not converted).",
    group=G,
)
STB_RANK = codes.define(
    "STB_RANK",
    "rank is above 8, dims past the rank are not 0, or a rank above 3 has no shape (no "
    "sidecar, or a shape_id outside its shape table).",
    group=G,
)
STB_SIZE = codes.define(
    "STB_SIZE", "size_bytes differs from the product of the dimensions times the itemsize.", group=G
)
STB_BOUNDS = codes.define(
    "STB_BOUNDS",
    "A tensor starts before data_offset or ends past file_size (rule 4).",
    group=G,
)
STB_ALIGN = codes.define("STB_ALIGN", "A tensor's offset is not a multiple of 64.", group=G)
STB_OVERLAP = codes.define("STB_OVERLAP", "Two tensors share bytes.", group=G)
STB_PADDING = codes.define(
    "STB_PADDING", "A padding byte (after the table or between tensors) is not 0x00.", group=G
)
STB_GAP = codes.define(
    "STB_GAP",
    "64 or more bytes of the data region belong to no tensor (unreferenced data).",
    group=G,
    severity=Severity.WARNING,
)
STB_GLYPH_REACH = codes.define(
    "STB_GLYPH_REACH",
    "Tensor ids above 15 (or bin files above 15) cannot be named by a runtime that addresses "
    "them in 4 bits each (KHΛNARY, the runtime of the STB spec: its G_LOAD_BIN_TENSOR).",
    group=G,
    severity=Severity.INFO,
)
STB_SIDECAR = codes.define(
    "STB_SIDECAR",
    "The sidecar is not valid: not JSON, a field missing or of the wrong type, a path that "
    "leaves its folder, a name twice.",
    group=G,
)
STB_SIDECAR_FILE = codes.define(
    "STB_SIDECAR_FILE",
    "A .stb file the sidecar lists is missing, unreadable, invalid, or differs from the "
    "sidecar (size, tensor count, CRC-32).",
    group=G,
)
STB_SIDECAR_MISMATCH = codes.define(
    "STB_SIDECAR_MISMATCH",
    "A sidecar tensor entry disagrees with the .stb tensor table (missing tensor_id, dtype, "
    "rank, layout, shape), or a tensor of a .stb file has no sidecar entry.",
    group=G,
)
STB_NO_SIDECAR = codes.define(
    "STB_NO_SIDECAR",
    "No sidecar beside the .stb file: tensors are named tensor_<id>.",
    group=G,
    severity=Severity.INFO,
)


def sniff_sidecar(head: bytes, size: int) -> bool:
    """A JSON object whose first key is "format": "matrixctl-stb-sidecar"."""
    text = head.removeprefix(b"\xef\xbb\xbf").lstrip()
    return text.startswith(b"{") and SIDECAR_MAGIC.encode() in text


def align(n: int, to: int = ALIGNMENT) -> int:
    return n + (-n) % to


# Structures ---------------------------------------------------------------------------------


class Header(FrozenRecord):
    __slots__ = (
        "data_offset",
        "file_size",
        "flags",
        "reserved0",
        "reserved1",
        "tensor_count",
        "version",
    )
    version: int
    flags: int
    tensor_count: int
    reserved0: int
    reserved1: int
    data_offset: int
    file_size: int

    def __init__(
        self,
        version: int,
        flags: int,
        tensor_count: int,
        reserved0: int,
        reserved1: int,
        data_offset: int,
        file_size: int,
    ) -> None:
        self._init(version, flags, tensor_count, reserved0, reserved1, data_offset, file_size)

    @classmethod
    def parse(cls, raw: bytes) -> Header:
        return cls(*HEADER.unpack(raw[:HEADER_SIZE])[1:])

    def to_bytes(self) -> bytes:
        return HEADER.pack(
            MAGIC,
            self.version,
            self.flags,
            self.tensor_count,
            self.reserved0,
            self.reserved1,
            self.data_offset,
            self.file_size,
        )


class Entry(Record):
    __slots__ = (
        "dims",
        "dtype_code",
        "index",
        "layout_code",
        "offset",
        "rank",
        "size_bytes",
        "tensor_id",
    )

    def __init__(
        self,
        index: int,
        tensor_id: int,
        dtype_code: int,
        rank: int,
        layout_code: int,
        offset: int,
        size_bytes: int,
        dims: tuple[int, int, int],
    ) -> None:
        self.index = index  # position in the table
        self.tensor_id = tensor_id
        self.dtype_code = dtype_code
        self.rank = rank
        self.layout_code = layout_code
        self.offset = offset
        self.size_bytes = size_bytes
        self.dims = dims

    @classmethod
    def parse(cls, index: int, raw: bytes, at: int) -> Entry:
        tid, dtype, rank, layout, offset, size, d0, d1, d2 = ENTRY.unpack_from(raw, at)
        return cls(index, tid, dtype, rank, layout, offset, size, (d0, d1, d2))

    def to_bytes(self) -> bytes:
        return ENTRY.pack(
            self.tensor_id,
            self.dtype_code,
            self.rank,
            self.layout_code,
            self.offset,
            self.size_bytes,
            *self.dims,
        )

    @property
    def dtype(self) -> str | None:
        return DTYPE_CODES.get(self.dtype_code)

    @property
    def layout(self) -> str | None:
        return LAYOUTS.get(self.layout_code)

    @property
    def end(self) -> int:
        return self.offset + self.size_bytes

    @property
    def table_offset(self) -> int:
        return HEADER_SIZE + ENTRY_SIZE * self.index

    @property
    def field(self) -> str:
        return f"tensor[{self.index}]"

    def direct_shape(self) -> tuple[int, ...] | None:
        return tuple(self.dims[: self.rank]) if self.rank <= DIRECT_RANK else None


class StbFile(Record):
    __slots__ = ("entries", "header", "problems", "size", "sound")

    def __init__(
        self,
        size: int,
        header: Header,
        entries: list[Entry] | None = None,
        sound: set[int] | None = None,
        problems: list[Problem] | None = None,
    ) -> None:
        self.size = size
        self.header = header
        self.entries: list[Entry] = [] if entries is None else entries
        self.sound: set[int] = set() if sound is None else sound  # entries that can be read
        self.problems: list[Problem] = [] if problems is None else problems

    @property
    def table_end(self) -> int:
        return HEADER_SIZE + ENTRY_SIZE * self.header.tensor_count

    def readable(self) -> list[Entry]:
        return sorted(
            (e for e in self.entries if e.index in self.sound), key=lambda e: (e.offset, e.index)
        )

    def add(self, rule: str, code: str, message: str, offset: int | None, where: str) -> None:
        self.problems.append(Problem(code, message, offset, where, rule))


R_HEADER = "header (rules 1-3)"
R_TABLE = "tensor table: ids, dtypes, layouts, ranks, sizes"
R_DATA = "tensor bounds, alignment, overlaps (rule 4)"


def parse(buf: Any, size: int) -> StbFile:
    if size < HEADER_SIZE:
        raise FormatError(
            STB_TRUNCATED,
            f"file is {size} bytes, the header alone needs {HEADER_SIZE}",
            offset=size,
            field="header",
        )
    h = Header.parse(bytes(buf[:HEADER_SIZE]))
    if h.version != VERSION:
        raise FormatError(
            STB_VERSION,
            f"version is 0x{h.version:02x}: this reader knows STB 0x01 only",
            offset=4,
            field="version",
        )
    f = StbFile(size, h)
    if h.flags:
        f.add(R_HEADER, STB_FLAGS, f"flags is 0x{h.flags:02x}, must be 0", 5, "flags")
    if h.reserved0 or h.reserved1:
        f.add(
            R_HEADER,
            STB_RESERVED,
            f"reserved0/reserved1 are 0x{h.reserved0:x}/0x{h.reserved1:x}",
            8,
            "reserved0",
        )
    if h.file_size != size:
        f.add(
            R_HEADER,
            STB_FILE_SIZE,
            f"file_size is {h.file_size:,}, the file has {size:,} bytes"
            + (" (truncated?)" if size < h.file_size else ""),
            24,
            "file_size",
        )
    if h.tensor_count > MAX_PER_FILE:
        f.add(
            R_HEADER,
            STB_COUNT,
            f"tensor_count is {h.tensor_count:,}; tensor ids are one byte (at most 256 tensors)",
            6,
            "tensor_count",
        )
    if not f.table_end <= h.data_offset <= h.file_size:
        f.add(
            R_HEADER,
            STB_DATA_OFFSET,
            f"data_offset {h.data_offset:,} must lie between the end of the tensor table "
            f"({f.table_end:,}) and file_size ({h.file_size:,})",
            16,
            "data_offset",
        )
    if h.data_offset % ALIGNMENT:
        f.add(
            R_HEADER,
            STB_DATA_OFFSET,
            f"data_offset {h.data_offset:,} is not a multiple of {ALIGNMENT}",
            16,
            "data_offset",
        )
    if f.table_end > size:
        f.add(
            R_HEADER,
            STB_TRUNCATED,
            f"the tensor table of {h.tensor_count:,} entries ends at {f.table_end:,}, past the "
            f"end of the file ({size:,})",
            6,
            "tensor_count",
        )
        return f
    raw = bytes(buf[HEADER_SIZE : f.table_end])
    f.entries = [Entry.parse(i, raw, i * ENTRY_SIZE) for i in range(h.tensor_count)]
    _check_entries(f)
    _check_data(f)
    return f


def _check_entries(f: StbFile) -> None:
    seen: dict[int, int] = {}
    for e in f.entries:
        at = e.table_offset
        ok = True
        first = seen.setdefault(e.tensor_id, e.index)
        if first != e.index:
            f.add(
                R_TABLE,
                STB_TENSOR_ID,
                f"entries {first} and {e.index} both have tensor_id {e.tensor_id}",
                at,
                f"{e.field}.tensor_id",
            )
        if e.dtype is None:
            f.add(
                R_TABLE,
                STB_DTYPE,
                f"tensor_id {e.tensor_id}: dtype {e.dtype_code} is not in the enum "
                "(0 float32, 1 float16, 2 int8, 3 int32): unsupported",
                at + 1,
                f"{e.field}.dtype",
            )
            ok = False
        if e.layout is None:
            f.add(
                R_TABLE,
                STB_LAYOUT,
                f"tensor_id {e.tensor_id}: layout {e.layout_code} is not in the enum "
                "(0 ROW_MAJOR, 1 COL_MAJOR, 2 CHANNELS_LAST): unsupported",
                at + 3,
                f"{e.field}.layout",
            )
            ok = False
        if e.rank > MAX_RANK:
            f.add(
                R_TABLE,
                STB_RANK,
                f"tensor_id {e.tensor_id}: rank {e.rank} is above {MAX_RANK}",
                at + 2,
                f"{e.field}.rank",
            )
            ok = False
        else:
            used = e.rank if e.rank <= DIRECT_RANK else 1
            if any(e.dims[used:]):
                f.add(
                    R_TABLE,
                    STB_RANK,
                    f"tensor_id {e.tensor_id}: rank {e.rank} but dims {list(e.dims)} (dims "
                    f"past {'the rank' if e.rank <= DIRECT_RANK else 'the shape index'} must "
                    "be 0)",
                    at + 20,
                    f"{e.field}.dims",
                )
        shape = e.direct_shape()
        if ok and shape is not None:
            want = element_count(shape) * DTYPES[e.dtype or "u8"].itemsize
            if want != e.size_bytes:
                f.add(
                    R_TABLE,
                    STB_SIZE,
                    f"tensor_id {e.tensor_id}: size_bytes is {e.size_bytes:,}, shape "
                    f"{list(shape)} of {SPEC_DTYPES[e.dtype_code]} needs {want:,}",
                    at + 12,
                    f"{e.field}.size_bytes",
                )
        elif ok and e.dtype is not None and e.size_bytes % DTYPES[e.dtype].itemsize:
            f.add(
                R_TABLE,
                STB_SIZE,
                f"tensor_id {e.tensor_id}: size_bytes {e.size_bytes:,} is not a whole number of "
                f"{SPEC_DTYPES[e.dtype_code]} elements",
                at + 12,
                f"{e.field}.size_bytes",
            )
        if ok:
            f.sound.add(e.index)


def _check_data(f: StbFile) -> None:
    h = f.header
    for e in f.entries:
        at = e.table_offset
        if e.offset < h.data_offset or e.end > min(h.file_size, f.size):
            f.add(
                R_DATA,
                STB_BOUNDS,
                f"tensor_id {e.tensor_id}: bytes [{e.offset:,}, {e.end:,}) are not inside the "
                f"data region [{h.data_offset:,}, {min(h.file_size, f.size):,})",
                at + 4,
                f"{e.field}.offset",
            )
            f.sound.discard(e.index)
            continue
        if e.offset % ALIGNMENT:
            f.add(
                R_DATA,
                STB_ALIGN,
                f"tensor_id {e.tensor_id}: offset {e.offset:,} is not a multiple of {ALIGNMENT}",
                at + 4,
                f"{e.field}.offset",
            )
    prev: Entry | None = None
    for e in sorted(
        (e for e in f.entries if e.index in f.sound and e.size_bytes), key=lambda e: e.offset
    ):
        if prev is not None and e.offset < prev.end:
            f.add(
                R_DATA,
                STB_OVERLAP,
                f"tensor_id {e.tensor_id} [{e.offset:,}, {e.end:,}) overlaps tensor_id "
                f"{prev.tensor_id} (ends at {prev.end:,})",
                e.table_offset + 4,
                f"{e.field}.offset",
            )
        if prev is None or e.end > prev.end:
            prev = e


def gaps(f: StbFile) -> list[tuple[int, int]]:
    """Bytes after the table that belong to no tensor: padding."""
    end = min(f.header.file_size, f.size)
    used = sorted((e.offset, e.end) for e in f.entries if e.index in f.sound)
    out = []
    pos = f.table_end
    for start, stop in used:
        if start > pos:
            out.append((pos, start))
        pos = max(pos, stop)
    if pos < end:
        out.append((pos, end))
    return out


def glyph_unreachable(f: StbFile) -> list[int]:
    return sorted(e.tensor_id for e in f.entries if e.tensor_id >= GLYPH_REACH)


# The sidecar --------------------------------------------------------------------------------


class SideTensor(Record):
    __slots__ = ("bin_file_id", "dtype", "layout", "name", "rank", "shape", "shape_id", "tensor_id")

    def __init__(
        self,
        name: str,
        bin_file_id: int,
        tensor_id: int,
        dtype: str,
        rank: int,
        shape: tuple[int, ...],
        layout: str,
        shape_id: int | None = None,
    ) -> None:
        self.name = name
        self.bin_file_id = bin_file_id
        self.tensor_id = tensor_id
        self.dtype = dtype  # spec name: float32 ...
        self.rank = rank
        self.shape = shape
        self.layout = layout
        self.shape_id = shape_id


class BinFile(Record):
    __slots__ = ("bin_file_id", "crc32", "file_size", "mmap_required", "path", "tensor_count")

    def __init__(
        self,
        bin_file_id: int,
        path: str,
        mmap_required: bool,
        tensor_count: int,
        file_size: int,
        crc32: int,
    ) -> None:
        self.bin_file_id = bin_file_id
        self.path = path  # relative to the sidecar's folder
        self.mmap_required = mmap_required
        self.tensor_count = tensor_count
        self.file_size = file_size
        self.crc32 = crc32


class Sidecar(Record):
    __slots__ = ("bin_files", "metadata", "shape_table", "tensors")

    def __init__(
        self,
        bin_files: list[BinFile],
        tensors: list[SideTensor],
        shape_table: list[tuple[int, ...]],
        metadata: dict[str, Any],
    ) -> None:
        self.bin_files = bin_files
        self.tensors = tensors
        self.shape_table = shape_table
        self.metadata = metadata


def sidecar_problem(message: str, where: str | None = None) -> FormatError:
    return FormatError(STB_SIDECAR, message, field=where)


def _uint(value: Any, what: str, limit: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise sidecar_problem(f"{what} must be a non-negative integer, got {value!r:.40}", what)
    if limit is not None and value > limit:
        raise sidecar_problem(f"{what} is {value:,}, above {limit:,}", what)
    return value


def safe_relative(path: str) -> bool:
    """A path inside the sidecar's folder: relative, no '..', no drive, no backslash tricks."""
    if not path or path.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", path):
        return False
    parts = re.split(r"[\\/]", path)
    return all(p not in ("", ".", "..") for p in parts)


def parse_sidecar(raw: bytes) -> Sidecar:
    """The sidecar's JSON, schema-checked (FormatError STB_SIDECAR naming the field)."""
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise sidecar_problem(f"sidecar is not UTF-8 JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != SIDECAR_MAGIC:
        raise sidecar_problem(f'sidecar must be a JSON object with "format": "{SIDECAR_MAGIC}"')
    if doc.get("version") != SIDECAR_VERSION:
        raise sidecar_problem(f"sidecar version {doc.get('version')!r} is not 1", "version")
    files_doc, tensors_doc = doc.get("bin_files"), doc.get("tensors")
    shapes_doc, meta = doc.get("shape_table", []), doc.get("metadata", {})
    if not isinstance(files_doc, list) or not isinstance(tensors_doc, list):
        raise sidecar_problem("bin_files and tensors must be lists", "bin_files")
    if not isinstance(shapes_doc, list) or not isinstance(meta, dict):
        raise sidecar_problem("shape_table must be a list, metadata an object", "shape_table")
    if len(files_doc) > MAX_FILES:
        raise sidecar_problem(f"{len(files_doc)} bin files: bin_file_id is 0-255", "bin_files")
    files: list[BinFile] = []
    for i, item in enumerate(files_doc):
        where = f"bin_files[{i}]"
        if not isinstance(item, dict):
            raise sidecar_problem(f"{where} is not an object", where)
        path = item.get("path")
        if not isinstance(path, str) or not safe_relative(path):
            raise sidecar_problem(
                f"{where}.path {path!r:.60} must be a relative path inside the sidecar's "
                "folder (never followed otherwise)",
                f"{where}.path",
            )
        crc_text = item.get("crc32")
        if not isinstance(crc_text, str) or not re.fullmatch(r"0x[0-9a-fA-F]{8}", crc_text):
            raise sidecar_problem(f"{where}.crc32 must be 0x + 8 hex digits", f"{where}.crc32")
        fid = _uint(item.get("bin_file_id"), f"{where}.bin_file_id", MAX_FILES - 1)
        if fid != i:
            raise sidecar_problem(f"{where}.bin_file_id is {fid}, expected {i}", where)
        files.append(
            BinFile(
                fid,
                path,
                bool(item.get("mmap_required", True)),
                _uint(item.get("tensor_count"), f"{where}.tensor_count", MAX_PER_FILE),
                _uint(item.get("file_size"), f"{where}.file_size"),
                int(crc_text, 16),
            )
        )
    shape_table: list[tuple[int, ...]] = []
    for i, item in enumerate(shapes_doc):
        if not isinstance(item, list) or len(item) > MAX_RANK:
            raise sidecar_problem(
                f"shape_table[{i}] must be a list of at most 8 dims", "shape_table"
            )
        shape_table.append(tuple(_uint(d, f"shape_table[{i}]", U32_MAX) for d in item))
    tensors: list[SideTensor] = []
    names: set[str] = set()
    keys: set[tuple[int, int]] = set()
    for i, item in enumerate(tensors_doc):
        where = f"tensors[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise sidecar_problem(f"{where} must be an object with a name", where)
        name = item["name"]
        if name in names:
            raise sidecar_problem(f"{where}: name {name!r} appears twice", f"{where}.name")
        names.add(name)
        fid = _uint(item.get("bin_file_id"), f"{where}.bin_file_id", len(files) - 1)
        tid = _uint(item.get("tensor_id"), f"{where}.tensor_id", MAX_PER_FILE - 1)
        if (fid, tid) in keys:
            raise sidecar_problem(
                f"{where}: bin file {fid} tensor_id {tid} is listed twice", f"{where}.tensor_id"
            )
        keys.add((fid, tid))
        dtype, layout = item.get("dtype"), item.get("layout", "ROW_MAJOR")
        if dtype not in SPEC_DTYPE_IDS or layout not in LAYOUT_IDS:
            raise sidecar_problem(f"{where}: unknown dtype or layout", f"{where}.dtype")
        shape_doc = item.get("shape")
        if not isinstance(shape_doc, list) or len(shape_doc) > MAX_RANK:
            raise sidecar_problem(f"{where}.shape must be a list of at most 8 dims", where)
        shape = tuple(_uint(d, f"{where}.shape", U32_MAX) for d in shape_doc)
        shape_id = item.get("shape_id")
        if len(shape) > DIRECT_RANK:
            sid = _uint(shape_id, f"{where}.shape_id", max(len(shape_table) - 1, 0))
            if sid >= len(shape_table) or shape_table[sid] != shape:
                raise sidecar_problem(
                    f"{where}: shape_id {sid} does not give shape {list(shape)}",
                    f"{where}.shape_id",
                )
            shape_id = sid
        elif shape_id is not None:
            raise sidecar_problem(f"{where}: shape_id is for ranks above 3", f"{where}.shape_id")
        tensors.append(SideTensor(name, fid, tid, dtype, len(shape), shape, layout, shape_id))
    return Sidecar(files, tensors, shape_table, meta)


def sidecar_for(path: str) -> str | None:
    """The sidecar beside a .stb file: NAME.stb.json for NAME.stb, and also for the parts
    NAME.K.stb that a split wrote; None when there is none."""
    if path == "-":
        return None
    candidates = [path + ".json"]
    m = re.fullmatch(r"(.*)\.(\d+)(\.[^./\\]+)", path)
    if m:
        candidates.append(m.group(1) + m.group(3) + ".json")
    for c in candidates:
        if os.path.isfile(c):
            return c
    return None


def read_sidecar(path: str) -> Sidecar:
    try:
        size = os.path.getsize(path)
        if size > MAX_SIDECAR:
            raise sidecar_problem(f"sidecar is {size:,} bytes, above the {MAX_SIDECAR:,} limit")
        with open(path, "rb") as fp:
            raw = fp.read(MAX_SIDECAR + 1)
    except OSError as exc:
        raise FormatError(
            STB_SIDECAR, f"sidecar cannot be read ({exc.strerror})", path=path
        ) from None
    return parse_sidecar(raw)


# Reading for convert ------------------------------------------------------------------------


def _row_major(entry: Entry, buf: Any, shape: tuple[int, ...]) -> Iterator[Any]:
    """A COL_MAJOR tensor's bytes in row-major order (one copy of the tensor)."""
    import numpy as np

    arr = storage_array(memoryview(buf)[entry.offset : entry.end], entry.dtype or "u8")
    out = np.ascontiguousarray(arr.reshape(shape[::-1]).T) if len(shape) > 1 else arr
    yield out.reshape(-1).view(np.uint8)


class _Member(Record):
    """A tensor of an opened file; `check` is the file's CRC check (None without a sidecar)."""

    __slots__ = ("check", "entry", "name", "shape", "source")

    def __init__(
        self,
        name: str,
        shape: tuple[int, ...],
        entry: Entry,
        source: Source,
        check: FileCheck | None = None,
    ) -> None:
        self.name = name
        self.shape = shape
        self.entry = entry
        self.source = source
        self.check = check


class _StbReader(TensorSource):
    """Tensors of one or more opened .stb files, named by a sidecar or as tensor_<id>."""

    def __init__(self) -> None:
        self.members: dict[str, _Member] = {}
        self.order: list[str] = []
        self.meta: dict[str, Any] = {}
        self.checks: list[FileCheck] = []

    def _check(self, src: Source, entry: BinFile) -> FileCheck:
        """The file's CRC check: run now, or left to the conversion's copy (`FileCheck`)."""
        check = file_check(src, entry)
        self.checks.append(check)
        check.opened()
        return check

    def finish_checks(self) -> None:
        for check in self.checks:
            check.finish()

    def _add(
        self,
        name: str,
        shape: tuple[int, ...],
        entry: Entry,
        source: Source,
        check: FileCheck | None = None,
    ) -> None:
        if entry.layout == "CHANNELS_LAST":
            raise FormatError(
                STB_LAYOUT,
                f"{name!r} is CHANNELS_LAST: the spec gives no element order to turn it into "
                "row-major, so it is not converted",
                path=source.name,
                offset=entry.table_offset + 3,
                field=f"{entry.field}.layout",
            )
        self.members[name] = _Member(name, shape, entry, source, check)
        self.order.append(name)

    def tensors(self) -> list[TensorInfo]:
        return [
            TensorInfo(n, self.members[n].entry.dtype or "u8", self.members[n].shape)
            for n in self.order
        ]

    def metadata(self) -> dict[str, Any]:
        return dict(self.meta)

    def stream(self, info: TensorInfo, role: str = "data") -> Iterator[Any]:
        m = self.members[info.name]
        if m.entry.layout == "COL_MAJOR":
            if m.check is not None:
                m.check.check()
            return _row_major(m.entry, m.source.buf, m.shape)
        if m.check is not None:
            return m.check.stored(m.entry.offset, m.entry.size_bytes)
        return mapped_chunks(m.source.buf, m.entry.offset, m.entry.size_bytes)

    def array(self, info: TensorInfo, role: str = "data", *, verify: bool = True) -> Any:
        m = self.members[info.name]
        if m.check is not None:
            m.check.check()
        if m.entry.layout == "COL_MAJOR":
            return super().array(info, role, verify=verify)
        view = memoryview(m.source.buf)[m.entry.offset : m.entry.end]
        return storage_array(view, m.entry.dtype or "u8")

    def release(self, info: TensorInfo) -> None:
        m = self.members[info.name]
        drop_pages(m.source.buf, m.entry.offset, m.entry.size_bytes)


def file_check(src: Source, entry: BinFile) -> FileCheck:
    """The file's CRC-32 against the sidecar's record (one pass, mapped pages dropped)."""

    def judge(got: int) -> None:
        if got != entry.crc32:
            raise FormatError(
                STB_SIDECAR_FILE,
                f"the sidecar records CRC-32 0x{entry.crc32:08x} for {entry.path}, the file's "
                f"is 0x{got:08x}: the file was changed or damaged",
                path=src.name,
                field=f"bin_files[{entry.bin_file_id}].crc32",
            )

    return FileCheck(src.buf, 0, src.size, judge)


def _check_shape(entry: Entry, shape: tuple[int, ...], where: str, path: str) -> None:
    want = element_count(shape) * DTYPES[entry.dtype or "u8"].itemsize
    if want != entry.size_bytes:
        raise FormatError(
            STB_SIZE,
            f"{where}: size_bytes is {entry.size_bytes:,}, shape {list(shape)} needs {want:,}",
            path=path,
            offset=entry.table_offset + 12,
            field=f"{entry.field}.size_bytes",
        )


class StbSource(_StbReader):
    """One .stb file. Names, rank > 3 shapes and metadata come from the sidecar beside it
    when there is one (`sidecar_for`); otherwise tensors are named tensor_<id>."""

    format = FORMAT

    def __init__(self, src: Source, checked: Any) -> None:
        super().__init__()
        self.stb: StbFile = checked.stb
        side_path = sidecar_for(src.path)
        named: dict[int, SideTensor] = {}
        check = None
        if side_path is not None:
            side = read_sidecar(side_path)
            base = os.path.basename(src.path)
            fid = next(
                (b.bin_file_id for b in side.bin_files if os.path.basename(b.path) == base), None
            )
            if fid is not None:
                check = self._check(src, side.bin_files[fid])
                named = {t.tensor_id: t for t in side.tensors if t.bin_file_id == fid}
                if len(side.bin_files) == 1:
                    self.meta = dict(side.metadata)
        for e in self.stb.readable():
            t = named.get(e.tensor_id)
            if t is not None:
                shape = t.shape
                _check_shape(e, shape, repr(t.name), src.name)
                name = t.name
            else:
                shape_or_none = e.direct_shape()
                if shape_or_none is None:
                    raise FormatError(
                        STB_RANK,
                        f"tensor_id {e.tensor_id} has rank {e.rank}: its shape is in the "
                        "sidecar's shape table, and there is no sidecar for this file",
                        path=src.name,
                        offset=e.table_offset + 2,
                        field=f"{e.field}.rank",
                    )
                shape, name = shape_or_none, f"tensor_{e.tensor_id}"
            self._add(name, shape, e, src, check)


class StbSidecarSource(_StbReader):
    """A set of .stb files through its sidecar: every file opened (mapped) and checked."""

    format = SIDECAR_FORMAT

    def __init__(self, src: Source, checked: Any) -> None:
        super().__init__()
        subject = checked
        self.subject = subject
        side: Sidecar = subject.sidecar
        self.meta = dict(side.metadata)
        checks = [self._check(opened.source, opened.entry) for opened in subject.files]
        for t in sorted(
            side.tensors,
            key=lambda t: (t.bin_file_id, subject.files[t.bin_file_id].by_id[t.tensor_id].offset),
        ):
            opened = subject.files[t.bin_file_id]
            check = checks[t.bin_file_id]
            self._add(t.name, t.shape, opened.by_id[t.tensor_id], opened.source, check)

    def close(self) -> None:
        self.subject.close()


# Writing ------------------------------------------------------------------------------------


def part_path(path: str, k: int) -> str:
    """File k of a split set: NAME.stb, NAME.1.stb, NAME.2.stb, ..."""
    if k == 0:
        return path
    stem, ext = os.path.splitext(path)
    return f"{stem}.{k}{ext}"


class _Planned(Record):
    __slots__ = ("bin_file_id", "info", "offset", "shape_id", "tensor_id")

    def __init__(
        self, info: TensorInfo, bin_file_id: int, tensor_id: int, offset: int, shape_id: int | None
    ) -> None:
        self.info = info
        self.bin_file_id = bin_file_id
        self.tensor_id = tensor_id
        self.offset = offset
        self.shape_id = shape_id


class _PartFile(Record):
    __slots__ = ("crc", "data_offset", "file_size", "fp", "path", "pos", "tensors")

    def __init__(
        self,
        path: str,
        fp: BinaryIO,
        tensors: list[_Planned],
        data_offset: int,
        file_size: int,
        crc: int = 0,
        pos: int = 0,
    ) -> None:
        self.path = path
        self.fp = fp
        self.tensors = tensors
        self.data_offset = data_offset
        self.file_size = file_size
        self.crc = crc
        self.pos = pos


class StbSink(TensorSink):
    """`convert` into STB: dense float32/float16/int8/int32 tensors of rank 0-8 (other dtypes
    are refused unless --dtype casts them), row-major, 64-aligned, zero padding; names, the
    shape table, the bin-file table and the metadata go to the sidecar NAME.stb.json; more than
    --per-file tensors are split over NAME.stb, NAME.1.stb, ..."""

    format = FORMAT
    dtypes = frozenset(DTYPE_IDS)
    keeps_names = False  # the sidecar keeps them
    keeps_metadata = True  # in the sidecar
    accepts = ("per_file",)
    writes_set = True  # the .stb files and the sidecar appear together (io.output_set)

    def refuse(self, info: TensorInfo) -> str | None:
        why = super().refuse(info)
        if why is not None:
            return why
        if len(info.shape) > MAX_RANK:
            return f"STB ranks are 0 to {MAX_RANK}, this tensor has rank {len(info.shape)}"
        if any(d > U32_MAX for d in info.shape):
            return "a dimension is above 4,294,967,295 (STB stores u32 dimensions)"
        return None

    def begin(self, out: Outputs, plan: list[TensorInfo], metadata: Mapping[str, Any]) -> None:
        per_file = self.options.get("per_file")
        per_file = MAX_PER_FILE if per_file is None else per_file
        if not 1 <= per_file <= MAX_PER_FILE:
            raise UsageError(f"--per-file must be 1 to {MAX_PER_FILE}, got {per_file}")
        groups = [plan[i : i + per_file] for i in range(0, len(plan), per_file)] or [[]]
        if len(groups) > MAX_FILES:
            raise FormatError(
                STB_COUNT,
                f"{len(plan):,} tensors at {per_file} per file need {len(groups)} files; "
                f"bin_file_id reaches {MAX_FILES}",
            )
        self._notes: list[str] = []
        self.shape_table: list[tuple[int, ...]] = []
        self.parts: list[_PartFile] = []
        self.planned: dict[str, _Planned] = {}
        self.metadata = dict(metadata)
        self.main_path = out.path
        for fid, group in enumerate(groups):
            data_offset = align(HEADER_SIZE + ENTRY_SIZE * len(group))
            pos = data_offset
            items = []
            for tid, info in enumerate(group):
                pos = align(pos)
                shape_id = None
                if len(info.shape) > DIRECT_RANK:
                    shape_id = len(self.shape_table)
                    self.shape_table.append(info.shape)
                item = _Planned(info, fid, tid, pos, shape_id)
                items.append(item)
                self.planned[info.name] = item
                pos += info.nbytes
            path = part_path(out.path, fid)
            fp = out.main if fid == 0 else out.sidecar(path)
            part = _PartFile(path, fp, items, data_offset, pos)
            self.parts.append(part)
            self._write(part, self._head(part))
        self.sidecar_fp = out.sidecar(out.path + ".json")
        self._stale = _stale_members(out.path, len(self.parts))
        far = [
            f"{p.path} ids {GLYPH_REACH}-{len(p.tensors) - 1}"
            for p in self.parts
            if len(p.tensors) > GLYPH_REACH
        ]
        if far or len(self.parts) > GLYPH_REACH:
            self._notes.append(
                "runtimes that address tensors in 4 bits (KHΛNARY's G_LOAD_BIN_TENSOR, the STB "
                "spec's loader) reach tensor ids and bin files 0-15 only: "
                + "; ".join(
                    far[:3]
                    + ([f"bin files {GLYPH_REACH}+"] if len(self.parts) > GLYPH_REACH else [])
                )
                + " need an extended scheme (--per-file 16 keeps every tensor addressable "
                "when there are at most 256)"
            )

    def _head(self, part: _PartFile) -> bytes:
        header = Header(VERSION, 0, len(part.tensors), 0, 0, part.data_offset, part.file_size)
        table = b""
        for item in part.tensors:
            shape = item.info.shape
            dims = (*shape, 0, 0, 0)[:3] if item.shape_id is None else (item.shape_id, 0, 0)
            table += Entry(
                0,
                item.tensor_id,
                DTYPE_IDS[item.info.dtype],
                len(shape),
                LAYOUT_IDS["ROW_MAJOR"],
                item.offset,
                item.info.nbytes,
                (int(dims[0]), int(dims[1]), int(dims[2])),
            ).to_bytes()
        head = header.to_bytes() + table
        return head + bytes(part.data_offset - len(head))

    def _write(self, part: _PartFile, data: Any) -> None:
        part.crc = crc.crc32(data, part.crc)  # first: faults a mapped source in, in batches
        part.fp.write(data)
        part.pos += memoryview(data).nbytes

    def add(self, info: TensorInfo, parts: PartStreams) -> None:
        item = self.planned[info.name]
        part = self.parts[item.bin_file_id]
        if item.offset > part.pos:
            self._write(part, bytes(item.offset - part.pos))

        def checksum(data: Any) -> None:
            # CRC first: it faults a mapped source in from user space, in batches.
            part.crc = crc.crc32(data, part.crc)

        part.pos += copy_stream(
            part.fp, parts("data"), info.nbytes, where=info.name, code=STB_SIZE, update=checksum
        )

    def finish(self) -> dict[str, Any]:
        for part in self.parts:
            if part.pos < part.file_size:  # an empty last tensor past the data
                self._write(part, bytes(part.file_size - part.pos))
        doc = sidecar_document(
            [
                BinFile(
                    i,
                    os.path.basename(p.path),
                    True,
                    len(p.tensors),
                    p.file_size,
                    p.crc,
                )
                for i, p in enumerate(self.parts)
            ],
            [
                SideTensor(
                    item.info.name,
                    item.bin_file_id,
                    item.tensor_id,
                    SPEC_DTYPES[DTYPE_IDS[item.info.dtype]],
                    len(item.info.shape),
                    item.info.shape,
                    "ROW_MAJOR",
                    item.shape_id,
                )
                for p in self.parts
                for item in p.tensors
            ],
            self.shape_table,
            self.metadata,
        )
        self.sidecar_fp.write(doc)
        return {
            "bytes": sum(p.file_size for p in self.parts),
            "files": [p.path for p in self.parts],
            "sidecar": self.main_path + ".json",
        }

    def notes(self) -> list[str]:
        return list(self._notes)

    def stale_members(self) -> list[str]:
        """Files of the set this one replaces that the new set has not (its NAME.k.stb for k
        at or above the new file count): the caller removes them once the new set is in
        place, so a smaller set leaves no member of the old one behind."""
        return list(self._stale)


def _stale_members(path: str, count: int) -> list[str]:
    """The previous set's members past `count`, as its sidecar (if it parses) lists them.
    Only the writer's own part names are taken (NAME.k.stb beside NAME.stb): a sidecar is
    input, and what else it lists is never removed."""
    try:
        old = read_sidecar(path + ".json")
    except (FormatError, OSError):
        return []
    listed = {f.path for f in old.bin_files}
    stale = []
    for k in range(count, MAX_FILES):
        member = part_path(path, k)
        if os.path.basename(member) in listed:
            stale.append(member)
    return stale


def _json_default(obj: Any) -> Any:
    if isinstance(obj, bytes):
        return obj.hex()
    return str(obj)


def sidecar_document(
    files: list[BinFile],
    tensors: list[SideTensor],
    shape_table: list[tuple[int, ...]],
    metadata: Mapping[str, Any],
) -> bytes:
    """The sidecar's bytes: fixed key order, metadata keys sorted, 1-space indent, UTF-8."""
    doc = {
        "format": SIDECAR_MAGIC,
        "version": SIDECAR_VERSION,
        "bin_files": [
            {
                "bin_file_id": f.bin_file_id,
                "path": f.path,
                "mmap_required": f.mmap_required,
                "tensor_count": f.tensor_count,
                "file_size": f.file_size,
                "crc32": f"0x{f.crc32:08x}",
            }
            for f in files
        ],
        "tensors": [
            {
                "name": t.name,
                "bin_file_id": t.bin_file_id,
                "tensor_id": t.tensor_id,
                "dtype": t.dtype,
                "shape": list(t.shape),
                "layout": t.layout,
                **({"shape_id": t.shape_id} if t.shape_id is not None else {}),
            }
            for t in tensors
        ],
        "shape_table": [list(s) for s in shape_table],
        "metadata": {str(k): metadata[k] for k in sorted(metadata, key=str)},
    }
    return (_layout_json(doc) + "\n").encode("utf-8")


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=_json_default)


def _layout_json(doc: dict[str, Any]) -> str:
    """One top-level key per line, one list item (bin file, tensor, shape) or metadata entry
    per line: readable in a diff, and the same bytes for the same input."""
    lines = []
    for key, value in doc.items():
        head = f" {_compact(key)}: "
        if isinstance(value, list) and value:
            items = ",\n".join(f"  {_compact(v)}" for v in value)
            lines.append(f"{head}[\n{items}\n ]")
        elif isinstance(value, dict) and value:
            items = ",\n".join(f"  {_compact(k)}: {_compact(v)}" for k, v in value.items())
            lines.append(f"{head}{{\n{items}\n }}")
        else:
            lines.append(head + _compact(value))
    return "{\n" + ",\n".join(lines) + "\n}"


TENSOR_IO = {FORMAT: (StbSource, StbSink), SIDECAR_FORMAT: (StbSidecarSource, None)}
