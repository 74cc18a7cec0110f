"""safetensors: a JSON header and one byte buffer (https://github.com/huggingface/safetensors).

Byte layout (integers little-endian):

    0       8   N, the header size (u64)
    8       N   UTF-8 JSON object: {"__metadata__"?: {text: text},
                 name: {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...}
                 (writers pad it with spaces to a multiple of 8)
    8 + N   ..  the byte buffer; offsets are relative to its start, and the tensors' ranges
                 tile it exactly: sorted by begin, no hole, no overlap, the last ending at EOF

This is a bounds-checked reader of its own rather than the `safetensors` package, because it
maps the file and hands out zero-copy views (the package's numpy API copies every tensor), it
names the byte and the field of every problem, and it streams for `convert`. The writer gives
byte-for-byte what `safetensors` 0.8 writes for the same tensors (tests pin it): tensors sorted
by dtype (widest first, in the package's order) then name, header padded to 8 bytes.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from matrixctl import codes
from matrixctl.errors import FormatError
from matrixctl.findings import Problem
from matrixctl.records import Record
from matrixctl.tensors import (
    DTYPES,
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
    text_metadata,
)

if TYPE_CHECKING:
    from matrixctl.io import Source

FORMAT = "safetensors"
PREFIX = 8
MAX_HEADER = 100_000_000  # the safetensors package's own limit
HEADER_ALIGN = 8
METADATA_KEY = "__metadata__"
BY_NAME = {d.safetensors: d.name for d in DTYPES.values() if d.safetensors}
# The package's dtype order, widest first: its writer sorts tensors by it, then by name.
WRITE_ORDER = [
    "U64",
    "I64",
    "F64",
    "C64",
    "F32",
    "U32",
    "I32",
    "BF16",
    "F16",
    "U16",
    "I16",
    "F8_E4M3",
    "F8_E5M2",
    "I8",
    "U8",
    "BOOL",
]

G = FORMAT
ST_HEADER_SIZE = codes.define(
    "ST_HEADER_SIZE",
    "The header size is above the 100 MB limit or larger than the file.",
    group=G,
)
ST_JSON = codes.define(
    "ST_JSON",
    "The header is not a JSON object in UTF-8 (or uses NaN/Infinity).",
    group=G,
)
ST_DUPLICATE_KEY = codes.define(
    "ST_DUPLICATE_KEY",
    "The header repeats a key (a warning: the safetensors package reads the last one, and so "
    "does matrixctl; other readers may read the first).",
    group=G,
    severity=codes.Severity.WARNING,
)
ST_SCHEMA = codes.define(
    "ST_SCHEMA",
    "A header entry lacks dtype, shape or data_offsets, or one has the wrong type.",
    group=G,
)
ST_DTYPE = codes.define("ST_DTYPE", "A tensor's dtype is not one matrixctl knows.", group=G)
ST_METADATA = codes.define("ST_METADATA", "__metadata__ is not a map of text to text.", group=G)
ST_OFFSETS = codes.define(
    "ST_OFFSETS",
    "A tensor's data_offsets are reversed or end past the byte buffer.",
    group=G,
)
ST_LENGTH = codes.define(
    "ST_LENGTH",
    "A tensor's byte range disagrees with its shape and dtype.",
    group=G,
)
ST_LAYOUT = codes.define(
    "ST_LAYOUT",
    "The tensors' byte ranges do not tile the buffer: a hole, an overlap, or bytes after the "
    "last tensor.",
    group=G,
)
ST_BOOL = codes.define(
    "ST_BOOL",
    "A BOOL element is a byte other than 0x00 or 0x01 (a warning: the safetensors package reads "
    "it; convert writes it as 0x01).",
    group=G,
    severity=codes.Severity.WARNING,
)
ST_NOT_TENSOR = codes.define(
    "ST_NOT_TENSOR",
    "The file is intact, but a tensor's dtype is one safetensors knows and matrixctl has no "
    "type for (F4, F6_E2M3, F6_E3M2, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ): verify passes it, "
    "convert refuses it.",
    group=G,
    unsupported=True,
)
# dtypes the safetensors package knows (0.8) and matrixctl has no type for: bits per element.
# Their byte ranges are still checked (a sub-byte tensor ends on a byte boundary, as the
# package requires).
FOREIGN_BITS = {
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
}
_JSON_SPACE = b" \t\n\r"


def sniff(head: bytes, size: int) -> bool:
    """A u64 header size, then `{` (after JSON whitespace, which the package's reader skips)
    and a byte that is no control character: safetensors' length-plus-`{` shape, cheap and
    specific enough. The size is not compared with the file here, and the JSON is not parsed,
    so a truncated file or a broken header is still named safetensors (and reported
    ST_HEADER_SIZE or ST_JSON) rather than unknown. A GGUF whose tensor count's low byte is
    `{` is not taken."""
    if len(head) < PREFIX + 2 or head.startswith(b"GGUF"):
        return False
    n = struct.unpack_from("<Q", head)[0]
    rest = head[PREFIX : PREFIX + min(n, len(head) - PREFIX)].lstrip(_JSON_SPACE)
    if n < 2 or rest[:1] != b"{":
        return False
    after = rest[1:2]
    return after == b"" or after[0] >= 0x20 or after in _JSON_SPACE


class StTensor(Record):
    """One header entry: `dtype` is the zTensor name of `st_dtype`."""

    __slots__ = ("begin", "data_start", "dtype", "end", "name", "shape", "st_dtype")

    def __init__(
        self,
        name: str,
        dtype: str,
        st_dtype: str,
        shape: tuple[int, ...],
        begin: int,
        end: int,
        data_start: int,
    ) -> None:
        """`dtype` is "" for a dtype of `FOREIGN_BITS` (no tensor matrixctl converts)."""
        self.name = name
        self.dtype = dtype
        self.st_dtype = st_dtype
        self.shape = shape
        self.begin = begin
        self.end = end
        self.data_start = data_start

    @property
    def offset(self) -> int:
        return self.data_start + self.begin

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def expected(self) -> int:
        """The byte length shape and dtype need (-1 for a sub-byte dtype whose elements do not
        end on a byte boundary: no length fits)."""
        if self.dtype:
            return element_count(self.shape) * DTYPES[self.dtype].itemsize
        bits = element_count(self.shape) * FOREIGN_BITS[self.st_dtype]
        return bits // 8 if bits % 8 == 0 else -1

    @property
    def field(self) -> str:
        return f"header/{self.name}"


class StFile(Record):
    """The parsed header: `tensors` sorted by begin."""

    __slots__ = ("header_size", "metadata", "problems", "size", "tensors")

    def __init__(
        self,
        size: int,
        header_size: int,
        metadata: dict[str, Any],
        tensors: list[StTensor],
        problems: list[Problem] | None = None,
    ) -> None:
        self.size = size
        self.header_size = header_size
        self.metadata = metadata
        self.tensors = tensors
        self.problems: list[Problem] = [] if problems is None else problems

    @property
    def data_start(self) -> int:
        return PREFIX + self.header_size


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _pairs_keeping_last(seen: list[str]) -> Any:
    """A JSON object hook that keeps the last value of a repeated key, as the package's reader
    does (serde into a map), and records the repeated keys in `seen`."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                seen.append(key)
            out[key] = value
        return out

    return pairs


def parse(buf: Any, size: int) -> StFile:
    """Header and schema; FormatError when nothing can be checked, otherwise problems with
    single entries are collected and those entries left out."""
    if size < PREFIX:
        raise FormatError(
            ST_HEADER_SIZE, f"file is {size} bytes, the header size alone needs 8", offset=0
        )
    n = struct.unpack_from("<Q", buf, 0)[0]
    if n > MAX_HEADER:
        raise FormatError(
            ST_HEADER_SIZE,
            f"header size {n:,} exceeds the {MAX_HEADER:,}-byte limit",
            offset=0,
            field="header_size",
        )
    if n > size - PREFIX:
        raise FormatError(
            ST_HEADER_SIZE,
            f"header size {n:,} is larger than the {size - PREFIX:,} bytes after it (file is "
            f"{size:,} bytes, the header alone needs {PREFIX + n:,})",
            offset=0,
            field="header_size",
        )
    raw = bytes(buf[PREFIX : PREFIX + n])
    repeated: list[str] = []
    try:
        text = raw.decode("utf-8")
        header = json.loads(
            text, object_pairs_hook=_pairs_keeping_last(repeated), parse_constant=_no_constants
        )
    except UnicodeDecodeError as exc:
        raise FormatError(
            ST_JSON,
            f"header is not UTF-8 ({exc.reason})",
            offset=PREFIX + exc.start,
            field="header",
        ) from None
    except json.JSONDecodeError as exc:
        raise FormatError(
            ST_JSON,
            f"header is not valid JSON: {exc.msg}",
            offset=PREFIX + len(text[: exc.pos].encode("utf-8")),
            field="header",
        ) from None
    except (ValueError, RecursionError) as exc:
        raise FormatError(
            ST_JSON, f"header refused: {exc}", offset=PREFIX, field="header"
        ) from None
    if not isinstance(header, dict):
        raise FormatError(ST_JSON, "header is not a JSON object", offset=PREFIX, field="header")
    st = StFile(size, n, {}, [])
    for key in dict.fromkeys(repeated):
        st.problems.append(
            Problem(
                ST_DUPLICATE_KEY,
                f"the header repeats the key {key!r:.80}; the last one is read, as the "
                "safetensors package reads it",
                offset=PREFIX,
                field=f"header/{key}",
            )
        )
    meta = header.pop(METADATA_KEY, None)
    if meta is None:  # absent, or null (the package reads `"__metadata__": null` as none)
        meta = {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        st.problems.append(
            Problem(
                ST_METADATA, "__metadata__ must map text to text", offset=PREFIX, field=METADATA_KEY
            )
        )
    else:
        st.metadata = meta
    for name, entry in header.items():
        t = _entry(st, name, entry)
        if t is not None:
            st.tensors.append(t)
    st.tensors.sort(key=lambda t: (t.begin, t.end, t.name))
    return st


def _entry(st: StFile, name: str, entry: Any) -> StTensor | None:
    where = f"header/{name}"
    if not isinstance(entry, dict):
        st.problems.append(
            Problem(ST_SCHEMA, f"{name}: entry is not an object", offset=PREFIX, field=where)
        )
        return None
    st_dtype = entry.get("dtype")
    shape = entry.get("shape")
    offsets = entry.get("data_offsets")
    if not isinstance(st_dtype, str):
        st.problems.append(
            Problem(
                ST_SCHEMA,
                f"{name}: dtype (text) is required",
                offset=PREFIX,
                field=f"{where}/dtype",
            )
        )
        return None
    if st_dtype not in BY_NAME and st_dtype not in FOREIGN_BITS:
        st.problems.append(
            Problem(
                ST_DTYPE,
                f"{name}: dtype {st_dtype!r:.30} is not one matrixctl reads",
                offset=PREFIX,
                field=f"{where}/dtype",
            )
        )
        return None
    if (
        not isinstance(shape, list)
        or len(shape) > 64
        or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
        or element_count(shape) >= 1 << 64
    ):
        st.problems.append(
            Problem(
                ST_SCHEMA,
                f"{name}: shape must be a list of non-negative integers",
                offset=PREFIX,
                field=f"{where}/shape",
            )
        )
        return None
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)
    ):
        st.problems.append(
            Problem(
                ST_SCHEMA,
                f"{name}: data_offsets must be [begin, end]",
                offset=PREFIX,
                field=f"{where}/data_offsets",
            )
        )
        return None
    return StTensor(
        name,
        BY_NAME.get(st_dtype, ""),
        st_dtype,
        tuple(shape),
        offsets[0],
        offsets[1],
        st.data_start,
    )


def sound(st: StFile, t: StTensor) -> bool:
    return t.begin <= t.end <= st.size - st.data_start and t.nbytes == t.expected


class StSource(TensorSource):
    format = FORMAT

    def __init__(self, src: Source, checked: Any) -> None:
        self.src = src
        self.st: StFile = checked.st
        self._by_name = {t.name: t for t in self.st.tensors}

    def tensors(self) -> list[TensorInfo]:
        return [TensorInfo(t.name, t.dtype, t.shape) for t in self.st.tensors]

    def metadata(self) -> dict[str, Any]:
        return dict(self.st.metadata)

    def stream(self, info: TensorInfo, role: str = "data") -> Iterator[Any]:
        t = self._by_name[info.name]
        return mapped_chunks(self.src.buf, t.offset, t.nbytes)

    def array(self, info: TensorInfo, role: str = "data", *, verify: bool = True) -> Any:
        """Zero-copy view of the tensor's bytes in the mapped file."""
        t = self._by_name[info.name]
        return storage_array(memoryview(self.src.buf)[t.offset : t.offset + t.nbytes], t.dtype)

    def release(self, info: TensorInfo) -> None:
        t = self._by_name[info.name]
        drop_pages(self.src.buf, t.offset, t.nbytes)


def header_bytes(plan: list[TensorInfo], metadata: Mapping[str, str]) -> bytes:
    """The 8-byte size and the space-padded JSON header for tensors in `plan` order."""
    header: dict[str, Any] = {}
    if metadata:
        header[METADATA_KEY] = {k: metadata[k] for k in sorted(metadata)}
    pos = 0
    for info in plan:
        end = pos + info.nbytes
        header[info.name] = {
            "dtype": DTYPES[info.dtype].safetensors,
            "shape": list(info.shape),
            "data_offsets": [pos, end],
        }
        pos = end
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    raw += b" " * ((-len(raw)) % HEADER_ALIGN)
    return struct.pack("<Q", len(raw)) + raw


class StSink(TensorSink):
    format = FORMAT
    dtypes = frozenset(d.name for d in DTYPES.values() if d.safetensors)
    keeps_metadata = True

    def refuse(self, info: TensorInfo) -> str | None:
        if info.name == METADATA_KEY:
            return f"safetensors reserves the name {METADATA_KEY} for file metadata"
        return super().refuse(info)

    def order(self, plan: list[TensorInfo]) -> list[TensorInfo]:
        rank = {name: i for i, name in enumerate(WRITE_ORDER)}
        return sorted(plan, key=lambda i: (rank[DTYPES[i.dtype].safetensors or ""], i.name))

    def begin(self, out: Outputs, plan: list[TensorInfo], metadata: Mapping[str, Any]) -> None:
        self._notes: list[str] = []
        meta, converted = text_metadata(metadata)
        if converted:
            self._notes.append(
                f"metadata {', '.join(converted)} stored as JSON text (safetensors __metadata__ "
                "holds text)"
            )
        self.fp = out.main
        head = header_bytes(plan, meta)
        self.fp.write(head)
        self.size = len(head)
        self.count = 0

    def add(self, info: TensorInfo, parts: PartStreams) -> None:
        self.size += copy_stream(
            self.fp, parts("data"), info.nbytes, where=info.name, code=ST_LENGTH
        )
        self.count += 1

    def finish(self) -> dict[str, Any]:
        return {"bytes": self.size}

    def notes(self) -> list[str]:
        return list(self._notes)


TENSOR_IO = {FORMAT: (StSource, StSink)}
