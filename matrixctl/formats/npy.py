"""NumPy `.npy` (one array) and `.npz` (a ZIP of `.npy` members), for `convert`.

.npy byte layout (numpy/lib/format.py, "NEP 1"):

    0    6   magic b"\\x93NUMPY"
    6    1   major version (1, 2 or 3)
    7    1   minor version (0)
    8    2|4 header length H (u16 LE in 1.0; u32 LE in 2.0 and 3.0)
    ..   H   a Python dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
             padded with spaces and a final newline so the data starts at a multiple of 64
    ..       the data, count x itemsize bytes

Only plain numeric and bool dtypes are tensors here. Object arrays (which need pickle) are
never read: numpy's `np.load` refuses them too unless `allow_pickle=True`. Every other dtype
numpy reads (structured, record, padded, string, bytes, void, datetime64, timedelta64) is
understood well enough to check the file (its item size from numpy's own `descr_to_dtype`):
such a file is intact but not a tensor (`NpyHeader.unsupported` says why), which `verify`
reports as an info finding and `convert` refuses. The header is parsed with
`ast.literal_eval` (literals only, no code) after a size limit, like numpy does; a Python 2
header's long integers (`(2L,)`) are read as numpy reads them.
Big-endian and Fortran-ordered arrays are read and converted to little-endian C order (both
lossless). The writers give what `numpy.save` gives; `.npz` members are stored (not deflated)
with a fixed timestamp, so the same tensors give the same bytes.
"""

from __future__ import annotations

import contextlib
import os
import re
import struct
import threading
import zipfile
import zlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from matrixctl import codes, crc
from matrixctl.errors import FormatError
from matrixctl.io import started_writeback
from matrixctl.records import FrozenRecord, Record
from matrixctl.tensors import (
    CHUNK_BYTES,
    DTYPES,
    Outputs,
    PartStreams,
    TensorInfo,
    TensorSink,
    TensorSource,
    chunked,
    copy_stream,
    drop_pages,
    element_count,
    mapped_chunks,
    plain_fileno,
)

if TYPE_CHECKING:
    import numpy as np

    from matrixctl.io import Source

NPY = "npy"
NPZ = "npz"
MAGIC = b"\x93NUMPY"
MAX_HEADER = 10_000  # numpy's own default limit for untrusted headers
ALIGN = 64
GROWTH_AXIS_MAX_DIGITS = 21  # numpy pads the header so the growth axis can be rewritten in place
ZIP_MAGIC = b"PK\x03\x04"
ZIP_DATE = (1980, 1, 1, 0, 0, 0)  # the earliest a ZIP can say: no wall-clock time in outputs
DEFLATE_MAX_RATIO = 1032  # deflate cannot expand beyond ~1032:1
# numpy descr (after normalising byte order) -> dtype name
BY_DESCR = {
    np_str: d.name
    for d in DTYPES.values()
    if d.numeric
    for np_str in {d.storage, d.storage.replace("<", ">")}
}

G = "npy"
NPY_HEADER = codes.define(
    "NPY_HEADER",
    "The .npy header is malformed: bad magic or version, too long, not a dict literal, or "
    "missing descr, fortran_order or shape.",
    group=G,
)
NPY_DTYPE = codes.define(
    "NPY_DTYPE",
    "The array's dtype is not a valid numpy dtype descriptor, or holds Python objects (pickled: "
    "never read, as np.load refuses them without allow_pickle).",
    group=G,
)
NPY_NOT_TENSOR = codes.define(
    "NPY_NOT_TENSOR",
    "The file is intact, but its dtype (structured, record, string, bytes, void, datetime64, "
    "timedelta64) is not a tensor dtype: verify passes it, convert refuses it.",
    group=G,
    unsupported=True,
)
NPY_SIZE = codes.define("NPY_SIZE", "The data is shorter than shape and dtype require.", group=G)
NPY_TRAILING = codes.define(
    "NPY_TRAILING",
    "Bytes follow the array data.",
    group=G,
    severity=codes.Severity.WARNING,
)
NPY_BOOL = codes.define(
    "NPY_BOOL",
    "A bool element is a byte other than 0x00 or 0x01 (a warning: numpy reads it; convert "
    "writes it as 0x01).",
    group=G,
    severity=codes.Severity.WARNING,
)
NPZ_ZIP = codes.define(
    "NPZ_ZIP",
    "The .npz is not a readable ZIP archive (damaged directory, encrypted or unsupported "
    "member, CRC mismatch).",
    group=G,
)
NPZ_MEMBER = codes.define(
    "NPZ_MEMBER",
    "A .npz member is not an .npy file, or two members have the same name.",
    group=G,
)
NPZ_NON_NPY = codes.define(
    "NPZ_NON_NPY",
    "A member of the .npz does not end in .npy; it is not a tensor and is ignored.",
    group=G,
    severity=codes.Severity.WARNING,
)


class NpyHeader(FrozenRecord):
    """A `.npy` header: `dtype` is the zTensor name, `data_offset` relative to the start of the
    `.npy`. A dtype numpy reads that is no tensor dtype has `dtype` "" and `unsupported`, the
    reason (then `itemsize` is numpy's item size for it)."""

    __slots__ = (
        "big_endian",
        "data_offset",
        "descr",
        "dtype",
        "fortran",
        "itemsize",
        "shape",
        "unsupported",
        "version",
    )
    version: tuple[int, int]
    dtype: str
    descr: Any
    big_endian: bool
    fortran: bool
    shape: tuple[int, ...]
    data_offset: int
    itemsize: int
    unsupported: str | None

    def __init__(
        self,
        version: tuple[int, int],
        dtype: str,
        descr: str,
        big_endian: bool,
        fortran: bool,
        shape: tuple[int, ...],
        data_offset: int,
        itemsize: int | None = None,
        unsupported: str | None = None,
    ) -> None:
        size = DTYPES[dtype].itemsize if itemsize is None else itemsize
        self._init(
            version, dtype, descr, big_endian, fortran, shape, data_offset, size, unsupported
        )

    @property
    def nbytes(self) -> int:
        return element_count(self.shape) * self.itemsize


# The header text numpy.save writes (and header_bytes below): the dict literal in its one
# spelling, then spaces and a newline. Parsed here without ast.literal_eval (which compiles the
# text: ~60 us a header, most of a many-tensor .npz open); any other spelling goes to it.
_CANONICAL = re.compile(
    r"\{'descr': '([<>|=]?[a-zA-Z][0-9]*)', 'fortran_order': (False|True), "
    r"'shape': \((|(?:0|[1-9][0-9]*),|(?:0|[1-9][0-9]*)(?:, (?:0|[1-9][0-9]*))+)\), \} *\n?\Z"
)


def _canonical_header(text: str) -> dict[str, Any] | None:
    """The header dict when `text` is in numpy's canonical spelling (the value
    ast.literal_eval gives for it), else None."""
    m = _CANONICAL.match(text)
    if m is None:
        return None
    descr, fortran, dims = m.groups()
    shape = tuple(int(x) for x in dims.split(",") if x.strip())
    return {"descr": descr, "fortran_order": fortran == "True", "shape": shape}


def parse_header(head: bytes, where: str = "header", base: int = 0) -> NpyHeader:
    """Parse an .npy header from its first bytes (at least 10, plus the header length)."""

    def bad(message: str, offset: int = 0, code: str = NPY_HEADER) -> FormatError:
        return FormatError(code, f"{where}: {message}", offset=base + offset, field="header")

    if head[:6] != MAGIC[: len(head)] or len(head) < 6:
        raise bad("does not start with the .npy magic \\x93NUMPY")
    if len(head) < 8:
        raise bad(f"ends inside the version (file is {len(head)} bytes)", len(head))
    version = (head[6], head[7])
    if version not in HEADER_LENGTH:
        raise bad(f"version {version[0]}.{version[1]} is not 1.0, 2.0 or 3.0", 6)
    length_format, encoding = HEADER_LENGTH[version]
    start = 8 + struct.calcsize(length_format)
    if len(head) < start:
        raise bad(
            f"ends inside the {start - 8}-byte header length (file is {len(head)} bytes)",
            len(head),
        )
    hlen = struct.unpack_from(length_format, head, 8)[0]
    if hlen > MAX_HEADER:
        raise bad(f"header length {hlen:,} is above the {MAX_HEADER:,}-byte limit", 8)
    if len(head) < start + hlen:
        raise bad(f"ends inside the {hlen}-byte header", len(head))
    raw = head[start : start + hlen]
    try:
        text = raw.decode(encoding)
        d = _canonical_header(text)
        if d is None:
            d = _literal(text, version)
    except (ValueError, SyntaxError, MemoryError, RecursionError, UnicodeDecodeError) as exc:
        raise bad(f"header is not a Python dict literal ({type(exc).__name__})", start) from None
    if not isinstance(d, dict) or set(d) != {"descr", "fortran_order", "shape"}:
        raise bad("header must have exactly the keys descr, fortran_order and shape", start)
    descr, fortran, shape = d["descr"], d["fortran_order"], d["shape"]
    if not isinstance(fortran, bool):
        raise bad("fortran_order is not True or False", start)
    if (
        not isinstance(shape, tuple)
        or len(shape) > 64
        or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in shape)
        or element_count(shape) >= 1 << 64
    ):
        raise bad(f"shape {shape!r:.60} is not a tuple of non-negative integers", start)
    norm = descr if isinstance(descr, str) else ""
    if len(norm) >= 2 and norm[0] in "=|<>" and norm[1:] in ("u1", "i1", "b1"):
        norm = "|" + norm[1:]
    elif norm[:1] == "=":
        norm = "<" + norm[1:]
    name = BY_DESCR.get(norm)
    if name is None:
        itemsize, why = _foreign_dtype(descr, bad, start)
        return NpyHeader(version, "", descr, False, fortran, shape, start + hlen, itemsize, why)
    return NpyHeader(version, name, descr, norm.startswith(">"), fortran, shape, start + hlen)


# (major, minor) -> (the header length's struct format, the header text's encoding)
HEADER_LENGTH = {(1, 0): ("<H", "latin1"), (2, 0): ("<I", "latin1"), (3, 0): ("<I", "utf-8")}


def _literal(text: str, version: tuple[int, int]) -> Any:
    """The header's dict literal in a spelling other than numpy's canonical one. A header
    Python 2 wrote may spell integers with an `L` suffix (`(2L,)`): numpy reads those in
    versions 1.0 and 2.0 by dropping the suffix, and so does this."""
    import ast  # another spelling (not numpy's): rare, and ast costs start-up time

    try:
        return ast.literal_eval(text)
    except SyntaxError:
        if version > (2, 0):
            raise
        return ast.literal_eval(_drop_long_suffix(text))


def _drop_long_suffix(text: str) -> str:
    """`text` without the `L` that follows a number token (Python 2 long literals)."""
    import io
    import tokenize

    out: list[tuple[int, str]] = []
    last = None
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.NAME and tok.string in ("L", "l") and last == tokenize.NUMBER:
                last = tok.type
                continue
            out.append((tok.type, tok.string))
            last = tok.type
    except (tokenize.TokenError, IndentationError):
        return text
    return tokenize.untokenize(out)


_KINDS = {
    "U": "a unicode string",
    "S": "a bytes string",
    "a": "a bytes string",
    "V": "a void (raw bytes)",
    "M": "a datetime64",
    "m": "a timedelta64",
    "c": "a complex",
    "f": "a float",
    "i": "an integer",
    "u": "an unsigned integer",
}


def _foreign_dtype(descr: Any, bad: Any, start: int) -> tuple[int, str]:
    """(item size, why it is no tensor) for a dtype numpy reads that is no tensor dtype, asking
    numpy itself (`numpy.lib.format.descr_to_dtype`, what `np.load` uses). A descriptor numpy
    refuses, or one holding Python objects (pickled: np.load refuses them by default), is
    NPY_DTYPE."""
    import numpy as np

    try:
        dt = np.lib.format.descr_to_dtype(descr)
    except Exception as exc:  # numpy raises many types for a bad descriptor
        raise bad(
            f"descr {descr!r:.60} is not a numpy dtype ({type(exc).__name__})", start, NPY_DTYPE
        ) from None
    if dt.hasobject:
        raise bad(
            f"dtype {descr!r:.40} holds Python objects (pickled): never read, as np.load "
            "refuses them without allow_pickle",
            start,
            NPY_DTYPE,
        )
    if dt.names is not None:
        fields = ", ".join(repr(n) for n in dt.names[:4]) + (", ..." if len(dt.names) > 4 else "")
        why = (
            f"a structured dtype (fields {fields}; descr {descr!r:.60})"
            if dt.names
            else "an empty structured dtype"
        )
    elif dt.subdtype is not None:
        why = "a subarray dtype"
    else:
        why = _KINDS.get(dt.kind, "a dtype") + f" dtype ({dt.str})"
    return dt.itemsize, f"{why}: not a tensor dtype"


def header_bytes(dtype: str, shape: tuple[int, ...]) -> bytes:
    """The header `numpy.save` writes for a C-ordered little-endian array. The storage string
    of a numeric dtype is numpy's `dtype.str` for it (tests/formats/test_containers.py
    checks), so no
    numpy import is needed to write one."""
    descr = DTYPES[dtype].storage
    text = "{" + f"'descr': {descr!r}, 'fortran_order': False, 'shape': {shape!r}, " + "}"
    if shape:
        text += " " * (GROWTH_AXIS_MAX_DIGITS - len(repr(shape[0])))
    raw = text.encode("latin1")
    for version, fmt in (((1, 0), "<H"), ((2, 0), "<I")):
        prefix = len(MAGIC) + 2 + struct.calcsize(fmt)
        hlen = len(raw) + 1
        pad = ALIGN - ((prefix + hlen) % ALIGN)
        if hlen + pad < 1 << (8 * struct.calcsize(fmt)):
            return MAGIC + bytes(version) + struct.pack(fmt, hlen + pad) + raw + b" " * pad + b"\n"
    raise ValueError("header too long")  # pragma: no cover - 4 GiB headers


def _ordered(view: Any, h: NpyHeader, chunk: int = CHUNK_BYTES) -> Iterator[Any]:
    """The array's bytes as little-endian C order (byteswapped / transposed as needed)."""
    import numpy as np

    if not h.big_endian and (not h.fortran or len(h.shape) < 2):
        yield from chunked(view, chunk)
        return
    storage = np.dtype(DTYPES[h.dtype].storage)
    src_dtype = storage.newbyteorder(">") if h.big_endian else storage
    if h.fortran and len(h.shape) >= 2:
        arr = np.frombuffer(view, dtype=src_dtype).reshape(h.shape, order="F")
        data = np.ascontiguousarray(arr, dtype=storage)
        yield from chunked(data.reshape(-1).view(np.uint8), chunk)
        return
    flat = np.frombuffer(view, dtype=src_dtype)
    step = max(1, chunk // storage.itemsize)
    for i in range(0, flat.size, step):
        yield flat[i : i + step].astype(storage)


def tensor_name(path: str) -> str:
    """A .npy holds no name: use the file's stem (`arr_0`, numpy's default, for stdin)."""
    if path in ("-", ""):
        return "arr_0"
    return os.path.splitext(os.path.basename(path))[0] or "arr_0"


class NpySource(TensorSource):
    format = NPY

    def __init__(self, src: Source, checked: Any) -> None:
        self.src = src
        self.h: NpyHeader = checked.header
        self.name = tensor_name(src.path)

    def tensors(self) -> list[TensorInfo]:
        return [TensorInfo(self.name, self.h.dtype, self.h.shape)]

    def stream(self, info: TensorInfo, role: str = "data") -> Iterator[Any]:
        h = self.h
        if not h.big_endian and (not h.fortran or len(h.shape) < 2):
            return mapped_chunks(self.src.buf, h.data_offset, h.nbytes)
        return _ordered(memoryview(self.src.buf)[h.data_offset : h.data_offset + h.nbytes], h)

    def release(self, info: TensorInfo) -> None:
        drop_pages(self.src.buf, self.h.data_offset, self.h.nbytes)


class NpySink(TensorSink):
    format = NPY
    dtypes = frozenset(d.name for d in DTYPES.values() if d.numeric)
    max_tensors = 1
    min_tensors = 1

    def begin(self, out: Outputs, plan: list[TensorInfo], metadata: Mapping[str, Any]) -> None:
        self.fp = out.main
        self.size = 0

    def add(self, info: TensorInfo, parts: PartStreams) -> None:
        head = header_bytes(info.dtype, info.shape)
        self.fp.write(head)
        got = copy_stream(self.fp, parts("data"), info.nbytes, where=info.name, code=NPY_SIZE)
        self.size = len(head) + got

    def finish(self) -> dict[str, Any]:
        return {"bytes": self.size}


# .npz ---------------------------------------------------------------------------------------


class _MapFile:
    """A read-only file object over a mapped buffer, for zipfile (no copy of the archive)."""

    def __init__(self, buf: Any, size: int) -> None:
        self.buf = buf
        self.size = size
        self.pos = 0

    def read(self, n: int = -1) -> bytes:
        end = self.size if n is None or n < 0 else min(self.size, self.pos + n)
        data = bytes(self.buf[self.pos : end])
        self.pos = max(self.pos, end)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.pos, 2: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def seekable(self) -> bool:
        return True


class NpzMember(Record):
    """One member: `name` is the tensor's (the member's without .npy), `data_offset` the
    absolute offset of a stored member's array data."""

    __slots__ = ("data_offset", "header", "info", "name", "problem")

    def __init__(
        self,
        name: str,
        info: zipfile.ZipInfo,
        header: NpyHeader | None,
        data_offset: int | None,
        problem: FormatError | None = None,
    ) -> None:
        self.name = name
        self.info = info
        self.header = header
        self.data_offset = data_offset
        self.problem = problem

    @property
    def stored(self) -> bool:
        return self.info.compress_type == zipfile.ZIP_STORED


ZIP_EMPTY = b"PK\x05\x06"  # the end record, first: a ZIP with no member


def sniff_npz(head: bytes, size: int) -> bool:
    """A ZIP whose first member is named *.npy (or too long to see: then no '/' in view), or
    an empty ZIP: `np.savez(f)` with no arrays writes one, and `np.load` reads it (no arrays)."""
    if head.startswith(ZIP_EMPTY) and len(head) >= 22:
        return head[10:12] == b"\x00\x00" and size == 22 + int.from_bytes(head[20:22], "little")
    if not head.startswith(ZIP_MAGIC) or len(head) < 30:
        return False
    n = struct.unpack_from("<H", head, 26)[0]
    name = head[30 : 30 + n]
    if len(name) == n:
        return name.endswith(b".npy")
    return b"/" not in name


NPZ_TRUNCATED = codes.define(
    "NPZ_TRUNCATED",
    "The .npz ends inside a member or before the ZIP central directory (a cut file).",
    group=G,
)


def _zip_cut(buf: Any, size: int) -> tuple[int, str] | None:
    """Where a ZIP that has lost its end record was cut: walk the local member headers from the
    start (sizes from the header or its ZIP64 extra) and return (bytes needed, what) for the
    first member or directory that runs past the end; None when the start is not members."""
    if 0 < size < 4 and bytes(buf[:size]) == ZIP_MAGIC[:size]:
        return 30, "the header of the member at 0 is cut"  # inside the first magic
    pos = 0
    while pos + 4 <= size and bytes(buf[pos : pos + 4]) == b"PK\x03\x04":
        if pos + 30 > size:
            return pos + 30, f"the header of the member at {pos:,} is cut"
        flags, csize, nlen, xlen = struct.unpack_from("<2xH10xI4xHH", buf, pos + 4)
        if flags & 0x08:
            return None  # sizes follow the data: the walk cannot skip it
        name_end = pos + 30 + nlen
        if name_end + xlen > size:
            return name_end + xlen, f"the header of the member at {pos:,} is cut"
        name = bytes(buf[pos + 30 : name_end]).decode("utf-8", "replace")
        x = name_end
        while csize == 0xFFFFFFFF and x + 4 <= name_end + xlen:
            tag, n = struct.unpack_from("<HH", buf, x)
            if tag == 1 and n >= 16:
                csize = struct.unpack_from("<Q", buf, x + 12)[0]
            x += 4 + n
        end = name_end + xlen + csize
        if end > size:
            return end, f"member {name!r:.60} is cut"
        pos = end
    if pos == 0:
        return None
    while pos + 4 <= size and bytes(buf[pos : pos + 4]) == b"PK\x01\x02":
        if pos + 46 > size:
            return pos + 46 + 22, "the ZIP central directory is cut"
        nlen, xlen, clen = struct.unpack_from("<HHH", buf, pos + 28)
        pos += 46 + nlen + xlen + clen
    if pos + 22 <= size:
        return None  # room for the end record: damaged, not cut
    return pos + 22, "the ZIP central directory's end record is cut"


def open_zip(src: Source) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(_MapFile(src.buf, src.size))
    except (zipfile.BadZipFile, ValueError, OSError, struct.error, NotImplementedError) as exc:
        cut = _zip_cut(src.buf, src.size)
        if cut is not None:
            need, what = cut
            raise FormatError(
                NPZ_TRUNCATED,
                f"file is {src.size:,} bytes, expected at least {need:,}: {what}",
                offset=src.size,
                field="zip",
            ) from None
        raise FormatError(
            NPZ_ZIP, f"not a readable ZIP archive ({exc})", offset=0, field="zip"
        ) from None


def read_members(src: Source, zf: zipfile.ZipFile) -> tuple[list[NpzMember], list[str]]:
    """The .npy members (header parsed) and the names of other members."""
    members: list[NpzMember] = []
    others: list[str] = []
    for info in zf.infolist():
        if not info.filename.endswith(".npy"):
            others.append(info.filename)
            continue
        name = info.filename[: -len(".npy")]
        try:
            if info.flag_bits & 0x1:
                raise FormatError(NPZ_ZIP, f"member {info.filename!r} is encrypted", field=name)
            if info.compress_type == zipfile.ZIP_STORED:
                header, offset = _stored_header(src, info)
            else:
                header, offset = _deflated_header(zf, info), None
            members.append(NpzMember(name, info, header, offset))
        except FormatError as err:
            members.append(NpzMember(name, info, None, None, err))
    return members, others


def _stored_header(src: Source, info: zipfile.ZipInfo) -> tuple[NpyHeader, int]:
    at = info.header_offset
    if at + 30 > src.size or bytes(src.buf[at : at + 4]) != ZIP_MAGIC:
        raise FormatError(
            NPZ_ZIP, f"{info.filename}: local header missing at {at}", offset=at, field="zip"
        )
    n, m = struct.unpack_from("<HH", src.buf, at + 26)
    start = at + 30 + n + m
    end = start + info.compress_size
    if info.compress_size != info.file_size or end > src.size:
        raise FormatError(
            NPZ_ZIP,
            f"{info.filename}: stored member runs past the file or sizes disagree",
            offset=at,
            field="zip",
        )
    head = bytes(src.buf[start : min(end, start + 12 + MAX_HEADER)])
    h = parse_header(head, info.filename, start)
    if h.data_offset + h.nbytes > info.file_size:
        raise FormatError(
            NPY_SIZE,
            f"{info.filename}: {info.file_size - h.data_offset:,} data bytes, shape "
            f"{list(h.shape)} of {h.dtype} needs {h.nbytes:,}",
            offset=start,
            field=info.filename,
        )
    return h, start + h.data_offset


def _deflated_header(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> NpyHeader:
    if info.file_size > info.compress_size * DEFLATE_MAX_RATIO + 1024:
        raise FormatError(
            NPZ_ZIP,
            f"{info.filename}: declares {info.file_size:,} bytes from {info.compress_size:,} "
            "compressed: more than deflate can produce",
            offset=info.header_offset,
            field=info.filename,
        )
    try:
        with zf.open(info) as fp:
            head = fp.read(12 + MAX_HEADER)
    except (
        zipfile.BadZipFile,
        OSError,
        NotImplementedError,
        RuntimeError,
        EOFError,
        zlib.error,
        UnicodeDecodeError,  # a local header's name that is not the UTF-8 it claims
    ) as exc:
        raise FormatError(
            NPZ_ZIP, f"{info.filename}: cannot be read ({exc})", offset=info.header_offset
        ) from None
    h = parse_header(head, info.filename, info.header_offset)
    if h.data_offset + h.nbytes != info.file_size:
        raise FormatError(
            NPY_SIZE,
            f"{info.filename}: holds {info.file_size - h.data_offset:,} data bytes, shape "
            f"{list(h.shape)} of {h.dtype} needs {h.nbytes:,}",
            offset=info.header_offset,
            field=info.filename,
        )
    return h


def member_stream(
    src: Source, zf: zipfile.ZipFile, m: NpzMember, chunk: int = CHUNK_BYTES
) -> Iterator[Any]:
    """The member's array bytes, little-endian C order. A stored member already in that order
    is its mapped bytes (`StoredBytes`: a sink may copy them inside the kernel); deflated
    members are inflated in chunks (zipfile stops at the declared size and checks the CRC at
    the end)."""
    h = m.header
    assert h is not None
    in_order = not h.big_endian and (not h.fortran or len(h.shape) < 2)
    if m.stored and m.data_offset is not None and in_order:
        return mapped_chunks(src.buf, m.data_offset, h.nbytes, chunk)
    return _member_pieces(src, zf, m, chunk)


def _member_pieces(src: Source, zf: zipfile.ZipFile, m: NpzMember, chunk: int) -> Iterator[Any]:
    h = m.header
    assert h is not None
    if m.stored and m.data_offset is not None:
        yield from _ordered(memoryview(src.buf)[m.data_offset : m.data_offset + h.nbytes], h)
        return
    try:
        with zf.open(m.info) as fp:
            fp.read(h.data_offset)
            if h.big_endian or (h.fortran and len(h.shape) >= 2):
                data = fp.read(h.nbytes)
                yield from _ordered(data, h, chunk)
                fp.read()  # to the end: the CRC check
                return
            left = h.nbytes
            while left:
                piece = fp.read(min(chunk, left))
                if not piece:
                    raise FormatError(NPY_SIZE, f"{m.info.filename}: data ends early")
                left -= len(piece)
                yield piece
            fp.read()
    except (zipfile.BadZipFile, OSError, EOFError, RuntimeError, zlib.error) as exc:
        raise FormatError(
            NPZ_ZIP,
            f"{m.info.filename}: {exc}",
            offset=m.info.header_offset,
            field=m.info.filename,
        ) from None


class NpzSource(TensorSource):
    format = NPZ

    def __init__(self, src: Source, checked: Any) -> None:
        self.src = src
        subject = checked
        self.zf: zipfile.ZipFile = subject.zf
        self.members = {m.name: m for m in subject.members}

    def tensors(self) -> list[TensorInfo]:
        out = []
        for m in self.members.values():
            assert m.header is not None
            out.append(TensorInfo(m.name, m.header.dtype, m.header.shape))
        return out

    def stream(self, info: TensorInfo, role: str = "data") -> Iterator[Any]:
        return member_stream(self.src, self.zf, self.members[info.name])

    def release(self, info: TensorInfo) -> None:
        m = self.members[info.name]
        if m.data_offset is not None and m.header is not None:
            drop_pages(self.src.buf, m.data_offset, m.header.nbytes)

    def close(self) -> None:
        self.zf.close()


def zip_date() -> tuple[int, int, int, int, int, int]:
    """1980-01-01 00:00:00, or SOURCE_DATE_EPOCH when it is set (and after 1980)."""
    import time

    from matrixctl.epoch import source_date_epoch

    epoch = source_date_epoch()
    if epoch is not None:
        t = time.gmtime(epoch)
        if t.tm_year >= 1980:
            return (t.tm_year, t.tm_mon, t.tm_mday, t.tm_hour, t.tm_min, t.tm_sec - t.tm_sec % 2)
    return ZIP_DATE


_ZIP_CRC_LOCK = threading.Lock()
_ZIP_CRC: dict[str, Any] = {"users": 0, "saved": None}  # blocks running, zipfile's own crc32


@contextlib.contextmanager
def fast_zip_crc() -> Iterator[None]:
    """While the block runs, zipfile computes members' CRC-32 with matrixctl's (`crc.crc32`:
    zlib-ng's PCLMUL folding, 13 GiB/s against 3.5 GiB/s for zlib's on one core here); the
    values are the same (both are the zlib CRC-32). zipfile looks the function up as its
    module-level name `crc32` on every write, so that name is swapped for the block and put
    back when the last concurrent block ends. For a stored .npz member the CRC is the only
    pass over the bytes besides the copy (docs/benchmarks.md, "convert and zTensor reads")."""
    with _ZIP_CRC_LOCK:
        if _ZIP_CRC["users"] == 0:
            _ZIP_CRC["saved"] = zipfile.crc32  # type: ignore[attr-defined]
            zipfile.crc32 = crc.crc32  # type: ignore[attr-defined]
        _ZIP_CRC["users"] += 1
    try:
        yield
    finally:
        with _ZIP_CRC_LOCK:
            _ZIP_CRC["users"] -= 1
            if _ZIP_CRC["users"] == 0:
                zipfile.crc32 = _ZIP_CRC["saved"]  # type: ignore[attr-defined]


class _WritebackMember:
    """zipfile's writer of one member, starting the output file's write-out as the member
    grows (`io.started_writeback`, as a plain output's copy does). Without it a stored .npz
    piled its dirty pages up until the commit's fsync and the kernel throttled the writes:
    a 300-tensor, 75 MiB convert into .npz took 110-140 ms in-process against 85-94 ms with
    it (docs/benchmarks.md, "convert into .npz")."""

    __slots__ = ("fd", "member")

    def __init__(self, member: Any, fd: int) -> None:
        self.member = member
        self.fd = fd

    def write(self, data: Any) -> int:
        n: int = self.member.write(data)
        started_writeback(self.fd, n)
        return n


class NpzSink(TensorSink):
    format = NPZ
    dtypes = frozenset(d.name for d in DTYPES.values() if d.numeric)

    def begin(self, out: Outputs, plan: list[TensorInfo], metadata: Mapping[str, Any]) -> None:
        self.zf = zipfile.ZipFile(out.main, mode="w", compression=zipfile.ZIP_STORED)
        self.fd = plain_fileno(out.main)
        self.plain = self.fd is not None
        self.count = 0
        self.date = zip_date()

    def add(self, info: TensorInfo, parts: PartStreams) -> None:
        head = header_bytes(info.dtype, info.shape)
        member = zipfile.ZipInfo(info.name + ".npy", date_time=self.date)
        member.compress_type = zipfile.ZIP_STORED
        member.external_attr = 0o644 << 16
        member.file_size = len(head) + info.nbytes
        try:
            with fast_zip_crc(), self.zf.open(member, "w") as zfp:
                fp = zfp if self.fd is None else _WritebackMember(zfp, self.fd)
                fp.write(head)
                # zipfile computes the member's CRC-32 as it writes; its writer is done with a
                # piece when `write` returns, when it writes to a plain file.
                copy_stream(
                    fp,
                    parts("data"),
                    info.nbytes,
                    where=info.name,
                    code=NPY_SIZE,
                    write_copies=self.plain,
                )
        except BaseException:
            # The output is discarded: keep ZipFile.__del__ from writing its central directory
            # into a closed temporary file later (a traceback on stderr).
            self.zf.fp = None
            raise
        self.count += 1

    def finish(self) -> dict[str, Any]:
        self.zf.close()
        return {"members": self.count}


def as_array(chunks: Iterator[Any], dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Join a stream into one array (tests and small tensors)."""
    import numpy as np

    data = b"".join(bytes(memoryview(c).cast("B")) for c in chunks)
    return np.frombuffer(data, dtype=np.dtype(DTYPES[dtype].storage)).reshape(shape)


TENSOR_IO = {NPY: (NpySource, NpySink), NPZ: (NpzSource, NpzSink)}
