"""What every tensor container shares: the dtype table, tensor descriptors, and the two
protocols a container implements to take part in `matrixctl convert`.

- `DTYPES`: every element type, named as zTensor names it (`f32`, `bf16`, `f8_e4m3`, ...), with
  its width, the numpy dtype that holds its bytes, and its name in safetensors. This is the one
  vocabulary codecs translate to and from.
- `TensorInfo`: one tensor as a container describes it (name, dtype, shape, layout, components,
  attributes), without its data.
- `TensorSource`: a container opened for reading. It lists its tensors, gives file-level
  metadata, and streams one component of one tensor as little-endian bytes (zero-copy slices of
  the mapped file where the container stores raw data).
- `TensorSink`: a container being written. `begin` receives the whole plan (so a format whose
  header lists every tensor, like safetensors, can write it first), `add` receives one tensor at
  a time with a function that streams each component's bytes, `finish` completes the file.

docs/architecture.md ("Tensor containers and convert") explains how a new container plugs in.
numpy is imported inside functions only.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, BinaryIO

from matrixctl import codes, crc
from matrixctl.errors import FormatError, InputError
from matrixctl.io import (
    IO_CHANGED,
    check_inputs_unchanged,
    copy_file_range_all,
    drop_pages,
    mapped_fd,
    started_writeback,
)
from matrixctl.records import FrozenRecord

if TYPE_CHECKING:
    import numpy as np

CHUNK_BYTES = 8 << 20  # the unit every tensor stream moves in: memory stays ~ a few chunks
MAX_RANK = 64

G = "tensors"
TENSOR_SIZE = codes.define(
    "TENSOR_SIZE",
    "A tensor's shape gives an element count or byte size that overflows 64 bits.",
    group=G,
)


class DType(FrozenRecord):
    """One element type. `kind` is "float", "complex", "int", "uint" or "bool"; `storage` is a
    little-endian numpy dtype string holding the bytes; `numeric` is False where numpy has no
    such type (bf16, float8): their bytes travel as unsigned integers of the same width and only
    a cast needs `ml_dtypes`."""

    __slots__ = ("itemsize", "kind", "ml_dtypes", "name", "numeric", "safetensors", "storage")
    name: str
    itemsize: int
    kind: str
    storage: str
    numeric: bool
    ml_dtypes: str | None
    safetensors: str | None

    def __init__(
        self,
        name: str,
        itemsize: int,
        kind: str,
        storage: str,
        numeric: bool = True,
        ml_dtypes: str | None = None,
        safetensors: str | None = None,
    ) -> None:
        self._init(name, itemsize, kind, storage, numeric, ml_dtypes, safetensors)

    @property
    def bits(self) -> int:
        return self.itemsize * 8


DTYPES: dict[str, DType] = {
    d.name: d
    for d in (
        DType("f64", 8, "float", "<f8", safetensors="F64"),
        DType("f32", 4, "float", "<f4", safetensors="F32"),
        DType("f16", 2, "float", "<f2", safetensors="F16"),
        DType("bf16", 2, "float", "<u2", numeric=False, ml_dtypes="bfloat16", safetensors="BF16"),
        DType(
            "f8_e4m3",
            1,
            "float",
            "|u1",
            numeric=False,
            ml_dtypes="float8_e4m3fn",
            safetensors="F8_E4M3",
        ),
        DType(
            "f8_e5m2",
            1,
            "float",
            "|u1",
            numeric=False,
            ml_dtypes="float8_e5m2",
            safetensors="F8_E5M2",
        ),
        DType("complex64", 8, "complex", "<c8", safetensors="C64"),
        DType("complex128", 16, "complex", "<c16"),
        DType("i64", 8, "int", "<i8", safetensors="I64"),
        DType("i32", 4, "int", "<i4", safetensors="I32"),
        DType("i16", 2, "int", "<i2", safetensors="I16"),
        DType("i8", 1, "int", "|i1", safetensors="I8"),
        DType("u64", 8, "uint", "<u8", safetensors="U64"),
        DType("u32", 4, "uint", "<u4", safetensors="U32"),
        DType("u16", 2, "uint", "<u2", safetensors="U16"),
        DType("u8", 1, "uint", "|u1", safetensors="U8"),
        DType("bool", 1, "bool", "|b1", safetensors="BOOL"),
    )
}

# Other spellings people type for --dtype (numpy, torch, safetensors names).
ALIASES: dict[str, str] = {
    "float64": "f64",
    "double": "f64",
    "float32": "f32",
    "float": "f32",
    "float16": "f16",
    "half": "f16",
    "bfloat16": "bf16",
    "float8_e4m3fn": "f8_e4m3",
    "complex": "complex64",
    "int64": "i64",
    "int32": "i32",
    "int16": "i16",
    "int8": "i8",
    "uint64": "u64",
    "uint32": "u32",
    "uint16": "u16",
    "uint8": "u8",
}
for _d in DTYPES.values():
    if _d.safetensors:
        ALIASES.setdefault(_d.safetensors.lower(), _d.name)


def dtype_named(name: str) -> DType | None:
    key = name.strip().lower()
    return DTYPES.get(key) or DTYPES.get(ALIASES.get(key, ""))


def element_count(shape: tuple[int, ...] | list[int]) -> int:
    """Product of the dimensions, as a Python int (an empty shape is a scalar: 1)."""
    n = 1
    for dim in shape:
        n *= dim
    return n


class Component(FrozenRecord):
    """One stored part of a non-dense tensor (sparse indices, quantized scales, ...); `count`
    is in elements."""

    __slots__ = ("count", "dtype", "role")
    role: str
    dtype: str
    count: int

    def __init__(self, role: str, dtype: str, count: int) -> None:
        self._init(role, dtype, count)

    @property
    def nbytes(self) -> int:
        return self.count * DTYPES[self.dtype].itemsize


class TensorInfo(FrozenRecord):
    """A tensor as its container describes it.

    For `dense` the data is one component `data` of `dtype` with `element_count(shape)`
    elements, and `components` is empty. Other layouts list their components; `dtype` is then
    the dtype of the values (`values` for sparse, `packed_weight` for quantized_group).
    """

    __slots__ = ("attributes", "components", "dtype", "layout", "name", "shape")
    name: str
    dtype: str
    shape: tuple[int, ...]
    layout: str
    components: tuple[Component, ...]
    attributes: Mapping[str, Any]

    def __init__(
        self,
        name: str,
        dtype: str,
        shape: tuple[int, ...],
        layout: str = "dense",
        components: tuple[Component, ...] = (),
        attributes: Mapping[str, Any] | None = None,
    ) -> None:
        # One per tensor of every source: the fields set directly (what `_init` does, without
        # its loop, about a third of the instructions).
        set_ = object.__setattr__
        set_(self, "name", name)
        set_(self, "dtype", dtype)
        set_(self, "shape", shape)
        set_(self, "layout", layout)
        set_(self, "components", components)
        set_(self, "attributes", {} if attributes is None else attributes)

    @property
    def count(self) -> int:
        return element_count(self.shape)

    @property
    def nbytes(self) -> int:
        """Logical (dense, decoded) byte size."""
        return self.count * DTYPES[self.dtype].itemsize

    def parts(self) -> tuple[Component, ...]:
        """Every component, `data` included for dense tensors."""
        if self.layout == "dense":
            return (Component("data", self.dtype, self.count),)
        return self.components

    @property
    def stored_nbytes(self) -> int:
        return sum(c.nbytes for c in self.parts())


ByteStream = Iterator[Any]  # buffers (bytes, memoryview, numpy arrays) of little-endian bytes
PartStreams = Callable[[str], ByteStream]


class TensorSource(ABC):
    """A container opened for reading; `convert` and the tensor tables use only this."""

    format: str = ""

    @abstractmethod
    def tensors(self) -> list[TensorInfo]:
        """Every tensor, in the order its data is stored (reading in this order is sequential)."""

    def metadata(self) -> dict[str, Any]:
        """File-level metadata (safetensors `__metadata__`, zTensor root `attributes`)."""
        return {}

    @abstractmethod
    def stream(self, info: TensorInfo, role: str = "data") -> ByteStream:
        """The decoded little-endian bytes of one component, in chunks of at most CHUNK_BYTES.

        Raw stored data comes as zero-copy slices of the mapped file; encoded data is decoded
        as it streams, never beyond the size the descriptor declares. Digests, where the
        container has them, are checked by the time the stream ends (FormatError otherwise).
        """

    def array(self, info: TensorInfo, role: str = "data", *, verify: bool = True) -> np.ndarray:
        """One component as a 1-D numpy array of its storage dtype (bf16 and float8 as
        unsigned integers of their width). Sources override this with a zero-copy view of the
        mapped file for raw data; this default joins the stream (one copy). `verify=False`
        skips digest checks where the container has digests."""
        import numpy as np

        part = next(p for p in info.parts() if p.role == role)
        data = b"".join(bytes(memoryview(p).cast("B")) for p in self.stream(info, role))
        return np.frombuffer(data, dtype=np.dtype(DTYPES[part.dtype].storage))

    def release(self, info: TensorInfo) -> None:  # noqa: B027 - optional hook
        """Done with `info`: a mapped source drops its pages from memory here."""

    def finish_checks(self) -> None:  # noqa: B027 - optional hook
        """Settle the checks left to the copy (`FileCheck`, `deferred_checks`); raises the
        source's error for a damaged file. A conversion calls it before committing."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the input."""


class Outputs:
    """The files a sink writes: the main output and any sidecars, all atomic together."""

    def __init__(self, main: BinaryIO, path: str, open_extra: Callable[[str], BinaryIO]) -> None:
        self.main = main
        self.path = path
        self._open_extra = open_extra

    def sidecar(self, path: str) -> BinaryIO:
        """A further output file (for example a names file beside a container that stores no
        names); it appears only if the whole conversion succeeds, like the main output."""
        return self._open_extra(path)


class TensorSink(ABC):
    """A container being written, one tensor at a time."""

    format: str = ""
    dtypes: frozenset[str] = frozenset(DTYPES)
    layouts: frozenset[str] = frozenset({"dense"})
    max_tensors: int | None = None  # e.g. 1 for .npy
    min_tensors: int = 0  # e.g. 1 for .npy: an empty .npy cannot exist
    keeps_names: bool = True
    keeps_metadata: bool = False

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.options = options

    def refuse(self, info: TensorInfo) -> str | None:
        """Why this sink cannot store `info` as it is (None if it can). Checked for every tensor
        before anything is written."""
        if info.layout not in self.layouts:
            return f"its layout {info.layout} has no equivalent in {self.format}"
        for part in info.parts():
            if part.dtype not in self.dtypes:
                return f"{self.format} has no dtype {part.dtype}"
        return None

    def leave_out(self, info: TensorInfo) -> str | None:
        """Why this sink leaves `info` out with a note instead of refusing it (None: keep it).
        Checked after casts are planned; a `--dtype` cast can bring a tensor back in. EMBD
        uses it for buffers such as the int64 `embeddings.position_ids`."""
        return None

    def order(self, plan: list[TensorInfo]) -> list[TensorInfo]:
        """The order tensors are written in (default: the source's)."""
        return plan

    @abstractmethod
    def begin(self, out: Outputs, plan: list[TensorInfo], metadata: Mapping[str, Any]) -> None:
        """Start the output; `plan` is every tensor that will be added, in `order`."""

    @abstractmethod
    def add(self, info: TensorInfo, parts: PartStreams) -> None:
        """Write one tensor; `parts(role)` streams that component's little-endian bytes."""

    @abstractmethod
    def finish(self) -> dict[str, Any]:
        """Complete the output; return a summary for the report."""

    def notes(self) -> list[str]:
        """Warnings for the person (metadata dropped, interoperability limits, ...)."""
        return []


# Helpers for codecs ---------------------------------------------------------------------------


def check_shape(
    shape: Any, where: str, *, code: str, offset: int | None = None, field_name: str = "shape"
) -> tuple[int, ...]:
    """A shape read from a file: a list of non-negative ints, rank <= 64, count < 2**64."""
    if not isinstance(shape, list | tuple) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise FormatError(
            code,
            f"{where}: shape must be a list of non-negative integers, got {shape!r:.80}",
            offset=offset,
            field=field_name,
        )
    if len(shape) > MAX_RANK:
        raise FormatError(
            code, f"{where}: rank {len(shape)} exceeds {MAX_RANK}", offset=offset, field=field_name
        )
    if element_count(shape) >= 1 << 64:
        raise FormatError(
            TENSOR_SIZE,
            f"{where}: shape {list(shape)} has more than 2**64 elements",
            offset=offset,
            field=field_name,
        )
    return tuple(shape)


def chunked(view: Any, chunk_bytes: int = CHUNK_BYTES) -> Iterator[memoryview]:
    """Slices of a bytes-like object (zero-copy)."""
    mv = memoryview(view).cast("B")
    for start in range(0, len(mv), chunk_bytes):
        yield mv[start : start + chunk_bytes]


class StoredBytes:
    """The bytes a source stores unchanged at `offset` of its mapping `buf` (what
    `mapped_chunks` returns). As an iterator it gives zero-copy slices of at most `chunk`
    bytes and drops each slice's pages once the next one is asked for; `copy_stream` copies
    the range inside the kernel instead when the sink does not look at the bytes. `tick`, if
    set, is told every byte count moved (convert's progress). `check`, if given, runs before
    the first byte is handed out or copied (a source's digest check: it may raise).

    `verify`, given with `check`, is the same check split in two, `(update, finish)` from a
    fresh call: `copy_stream`, when it reads the bytes through its buffer (for a sink that
    checksums them, or for zipfile's member writer), feeds each piece to `update` and calls
    `finish` (which raises as `check` would) before it returns, instead of reading the bytes
    twice. The pieces have then reached the sink's output before the check ends; every output
    is atomic, so an output of damaged bytes never appears."""

    def __init__(
        self,
        buf: Any,
        offset: int,
        length: int,
        chunk: int = CHUNK_BYTES,
        check: Callable[[], None] | None = None,
        verify: Callable[[], tuple[Callable[[Any], Any], Callable[[], None]]] | None = None,
    ) -> None:
        self.buf = buf
        self.offset = offset
        self.length = length
        self.chunk = chunk
        self.tick: Callable[[int], None] | None = None
        self._check = check
        self._verify = verify
        self._pieces: Iterator[memoryview] | None = None

    @property
    def checks_as_read(self) -> bool:
        """A check is left that can run on the bytes as they are read (`verify`)."""
        return self._check is not None and self._verify is not None

    def take_verify(self) -> tuple[Callable[[Any], Any], Callable[[], None]] | None:
        """`(update, finish)` of the check, which then no longer runs by itself; None when
        there is no check left to run or it cannot be split."""
        if self._check is None or self._verify is None:
            return None
        self._check = None
        return self._verify()

    def start(self) -> None:
        """Run the check (once); iterating and `copy_stream` call it first."""
        if self._check is not None:
            check, self._check = self._check, None
            check()

    @property
    def fresh(self) -> bool:
        """Nothing was read from it yet."""
        return self._pieces is None

    def __iter__(self) -> StoredBytes:
        return self

    def __next__(self) -> memoryview:
        if self._pieces is None:
            self.start()
            self._pieces = self._slices()
        return next(self._pieces)

    def _slices(self) -> Iterator[memoryview]:
        view = memoryview(self.buf)
        end = self.offset + self.length
        for start in range(self.offset, end, self.chunk):
            stop = min(end, start + self.chunk)
            yield view[start:stop]
            drop_pages(self.buf, start, stop - start)
            if self.tick is not None:
                self.tick(stop - start)


def mapped_chunks(buf: Any, offset: int, length: int, chunk: int = CHUNK_BYTES) -> StoredBytes:
    """Zero-copy slices of `buf[offset:offset+length]`; each slice's pages are dropped from the
    process once the consumer asks for the next one (a `StoredBytes`)."""
    return StoredBytes(buf, offset, length, chunk)


def plain_fileno(fp: Any) -> int | None:
    """The descriptor of a plain binary file object (not a wrapper that sees the bytes)."""
    import io

    if type(fp) in (io.BufferedRandom, io.BufferedWriter, io.FileIO):
        try:
            return int(fp.fileno())
        except (OSError, ValueError):
            return None
    return None


def _byte_view(piece: Any) -> memoryview:
    """A flat unsigned-byte view of a piece (bytes, memoryview or numpy array), no copy."""
    view = memoryview(piece)
    if view.format == "B" and view.ndim == 1:
        return view
    try:
        return view.cast("B")
    except TypeError:  # formats memoryview cannot cast (numpy complex): a numpy byte view
        return memoryview(piece.reshape(-1).view("u1"))


def copy_stream(
    fp: Any,
    stream: Iterator[Any],
    nbytes: int,
    *,
    where: str,
    code: str,
    update: Callable[[Any], Any] | None = None,
    write: Callable[[Any], Any] | None = None,
    piece_done: Callable[[], Any] | None = None,
    write_copies: bool = False,
) -> int:
    """The copy loop of every sink: write one component's byte stream to `fp` and return the
    count; a count other than `nbytes` (the size the descriptor declares) is FormatError
    `code` naming `where` (reading stops one piece past `nbytes`).

    - Stored bytes (`StoredBytes`, untouched) going to a plain file with no checksum to compute
      (neither the sink's nor a source's) are copied inside the kernel
      (`io.copy_file_range_all`: no page faults, no copy through Python), and `fp` is left
      positioned after them. Stored bytes whose source check can run as they are read
      (`StoredBytes.verify`) go through the buffer instead (below): one read of the source,
      where the check and then the kernel's copy read it twice (74 against 45 ms of system
      time for an STB file of 75 MB into safetensors).
    - Otherwise each piece goes whole to one write, `update(piece)` (the destination's
      checksum) running just before it (it faults a mapped source in from user space, in
      batches). Whole pieces, not small slices: the page cache keeps a file written in large
      writes in large folios, and a later mapped read of it takes far fewer page faults
      (docs/benchmarks.md, "convert against cp, zTensor reads"). `write` replaces `fp.write`
      (a writer that counts or writes on a helper thread); `piece_done()` runs after each.
    - Stored bytes the sink checksums, or that go to a writer other than a plain file which
      is done with a piece when its `write` returns (`write_copies=True`: zipfile's member
      writer), are read with `pread` into one reused buffer (READ_BUFFER_BYTES, 1 MiB),
      checksummed there and written from it: two copies through a buffer that stays in the
      core's cache, where writing from the mapping took a page fault per page and cost 1-5x as
      much CPU, varying from run to run (docs/benchmarks.md, "convert and zTensor reads"). Not
      with `write` (it may queue the piece to a helper thread that reads it later).
    """
    out_fd = plain_fileno(fp)
    if isinstance(stream, StoredBytes) and stream.fresh and stream.length == nbytes:
        src_fd = mapped_fd(stream.buf)
        kernel = update is None and not stream.checks_as_read
        if src_fd is not None and out_fd is not None and kernel:
            import os

            stream.start()
            fp.flush()
            start = fp.tell()
            os.lseek(out_fd, start, os.SEEK_SET)
            copy_file_range_all(src_fd, stream.offset, nbytes, out_fd, stream.tick)
            fp.seek(start + nbytes)
            return nbytes
        if src_fd is not None and write is None and (out_fd is not None or write_copies):
            return _copy_read(stream, src_fd, fp, update, out_fd, piece_done)
    put = write if write is not None else fp.write
    # A plain output file starts its write-out as it grows (what a helper thread has written
    # by then, when `write` queues to one).
    got = 0
    for piece in stream:
        view = _byte_view(piece)
        got += view.nbytes
        if got > nbytes:
            break
        if update is not None:
            update(view)
        put(view)
        if out_fd is not None:
            started_writeback(out_fd, view.nbytes)
        if piece_done is not None:
            piece_done()
    if got != nbytes:
        raise FormatError(
            code,
            f"{where}: {got:,} bytes arrived, shape and dtype give {nbytes:,}",
            field=where,
        )
    return got


# The buffer stored bytes are read into (`pread`) and written or checksummed from: small
# enough to stay in a core's L2 cache (1 MiB here) between the read and the write. With 8 MiB
# pieces the write's copy into the page cache (copy_folio_from_iter_atomic) took 54 % of a
# 256 MiB convert into STB (perf), 12 % with 1 MiB pieces: 250-500 ms of system time against
# 100-135 ms (docs/benchmarks.md, "convert: the whole process (conv18small; provisional)").
READ_BUFFER_BYTES = 1 << 20
_READ_BUFFERS: list[memoryview] = []  # reused by _copy_read, one per copy at a time


def _read_buffer() -> memoryview:
    """A reused READ_BUFFER_BYTES buffer, or a new one: anonymous memory the kernel hands out
    zeroed page by page as it is first written, so a copy of small tensors touches a few pages
    of it (a bytearray is zeroed whole when made)."""
    try:
        return _READ_BUFFERS.pop()
    except IndexError:
        import mmap

        return memoryview(mmap.mmap(-1, READ_BUFFER_BYTES))


def _copy_read(
    stream: StoredBytes,
    src_fd: int,
    fp: Any,
    update: Callable[[Any], Any] | None,
    out_fd: int | None,
    piece_done: Callable[[], Any] | None,
) -> int:
    """`copy_stream` of stored bytes through a reused buffer (see there). A source that ends
    early changed underneath: IO_CHANGED, as for the kernel copy."""
    import os

    verify = stream.take_verify()
    if verify is None:
        stream.start()
    buf = _read_buffer()
    try:
        step = min(stream.chunk, len(buf))
        done = 0
        while done < stream.length:
            view = buf[: min(step, stream.length - done)]
            got = os.preadv(src_fd, [view], stream.offset + done)
            if got == 0:
                check_inputs_unchanged()
                raise InputError(
                    IO_CHANGED,
                    f"ended at byte {stream.offset + done:,} while "
                    f"{stream.offset + stream.length:,} were expected",
                )
            piece = view[:got]
            if verify is not None:
                verify[0](piece)
            if update is not None:
                update(piece)
            fp.write(piece)
            done += got
            if out_fd is not None:
                started_writeback(out_fd, got)
            if stream.tick is not None:
                stream.tick(got)
            if piece_done is not None:
                piece_done()
    finally:
        _READ_BUFFERS.append(buf)
    if verify is not None:
        verify[1]()
    return done


def read_pieces(buf: Any, start: int, length: int, chunk: int = CHUNK_BYTES) -> Iterator[Any]:
    """`buf[start:start+length]` in pieces of at most `chunk` bytes, for a checksum: read by
    `pread` into one reused buffer when `buf` maps a file (each piece is valid until the next
    is asked for), else slices of `buf`. Reading a mapped file through its mapping takes a page
    fault per page; `pread` copies from the page cache without one (docs/benchmarks.md,
    "convert and zTensor reads"). A file that ends early changed underneath: IO_CHANGED."""
    src_fd = mapped_fd(buf)
    if src_fd is None:
        with memoryview(buf) as view:
            for pos in range(start, start + length, chunk):
                stop = min(pos + chunk, start + length)
                yield view[pos:stop]
                drop_pages(buf, pos, stop - pos)
        return
    import os

    mine = _read_buffer()
    try:
        done = 0
        step = min(chunk, len(mine))
        while done < length:
            view = mine[: min(step, length - done)]
            got = os.preadv(src_fd, [view], start + done)
            if got == 0:
                check_inputs_unchanged()
                raise InputError(
                    IO_CHANGED,
                    f"ended at byte {start + done:,} while {start + length:,} were expected",
                )
            yield view[:got]
            done += got
    finally:
        _READ_BUFFERS.append(mine)


def crc_range(buf: Any, start: int, end: int, chunk: int = 8 << 20, value: int = 0) -> int:
    """CRC-32 of `buf[start:end]` (`read_pieces`: no page faults on a mapped file), continuing
    from `value`."""
    for piece in read_pieces(buf, start, end - start, chunk):
        value = crc.crc32(piece, value)
    return value


_DEFERRED: ContextVar[bool] = ContextVar("deferred_checks", default=False)


@contextlib.contextmanager
def deferred_checks() -> Iterator[None]:
    """Sources opened inside the block let their whole-file checks (`FileCheck`) run on the
    bytes a conversion copies, finished by `TensorSource.finish_checks` before the output is
    committed; elsewhere a source checks its file when it is opened."""
    token = _DEFERRED.set(True)
    try:
        yield
    finally:
        _DEFERRED.reset(token)


def _ignore(piece: Any) -> None:
    return None


def _nothing() -> None:
    return None


class FileCheck:
    """A CRC-32 a source checks over `[start, end)` of its mapped file (an STB file's CRC in
    its sidecar, EMBD's data checksum); `judge(value)` raises the source's error for a wrong
    value. Computed one of two ways:

    - `check()` reads the whole range (`crc_range`) the first time it is called. A source
      calls it before it hands out a byte of the file (StoredBytes' `check`, array views), or
      when it is opened outside `deferred_checks`.
    - In a conversion (`deferred_checks`), from the bytes `copy_stream` reads anyway: each
      tensor's stored bytes are `verify`-ed through `verifier`, which continues a running CRC
      over the file in order (reading the few bytes between tensors: alignment, tables), and
      `finish()`, called before the output is committed, reads only what no copy read (the
      tail, or everything when tensors came out of file order or a copy went by the kernel).
      The same value, the file read once instead of twice.
    """

    def __init__(self, buf: Any, start: int, end: int, judge: Callable[[int], None]) -> None:
        self.buf = buf
        self.start = start
        self.end = end
        self.judge = judge
        self.value = 0
        self.pos = start  # the running CRC covers [start, pos)
        self.broken = False  # a range came out of order: finish() reads the whole range
        self.done = False
        self.error: BaseException | None = None
        self.deferred = _DEFERRED.get()  # made inside deferred_checks: left to the copy

    def opened(self) -> None:
        """What a source does with its check when it opens its file: run it, unless the check
        is left to the copy of a conversion."""
        if not self.deferred:
            self.check()

    def _settle(self, value: int) -> None:
        self.done = True
        try:
            self.judge(value)
        except BaseException as exc:
            self.error = exc
            raise

    def check(self) -> None:
        if self.error is not None:
            raise self.error
        if not self.done:
            self._settle(crc_range(self.buf, self.start, self.end))

    def verifier(self, offset: int, length: int) -> tuple[Callable[[Any], Any], Callable[[], None]]:
        """`(update, finish)` for the stored bytes `[offset, offset + length)` (StoredBytes'
        `verify`): their pieces continue the running CRC when they start where it stands."""
        if self.done or self.broken or offset < self.pos or offset + length > self.end:
            self.broken = self.broken or not self.done
            return _ignore, _nothing
        if offset > self.pos:
            self.value = crc_range(self.buf, self.pos, offset, value=self.value)
        self.pos = offset
        running = [self.value]

        def update(piece: Any) -> None:
            running[0] = crc.crc32(piece, running[0])

        def finish() -> None:
            self.value = running[0]
            self.pos = offset + length

        return update, finish

    def stored(self, offset: int, length: int, chunk: int = CHUNK_BYTES) -> StoredBytes:
        """The stored bytes `[offset, offset + length)` of the file, checked by this check:
        first, or as they are copied (see the class)."""
        if self.deferred and not self.done:
            return StoredBytes(
                self.buf, offset, length, chunk, self.check, lambda: self.verifier(offset, length)
            )
        return StoredBytes(self.buf, offset, length, chunk, self.check)

    def finish(self) -> None:
        """Settle the check (raising as `check` would) from what the copies read."""
        if self.error is not None:
            raise self.error
        if self.done:
            return
        if self.broken or self.pos == self.start:
            self.check()
            return
        self._settle(crc_range(self.buf, self.pos, self.end, value=self.value))


def storage_array(buf: Any, dtype: str, offset: int = 0, nbytes: int | None = None) -> np.ndarray:
    """A 1-D numpy view of little-endian bytes in the dtype's storage type: all of `buf`, or
    its `nbytes` bytes from `offset` (no intermediate memoryview)."""
    import numpy as np

    storage = _STORAGE_DTYPES.get(dtype)
    if storage is None:
        storage = _STORAGE_DTYPES[dtype] = np.dtype(DTYPES[dtype].storage)
    if nbytes is None:
        return np.frombuffer(buf, dtype=storage, offset=offset)
    return np.frombuffer(buf, dtype=storage, count=nbytes // storage.itemsize, offset=offset)


_STORAGE_DTYPES: dict[str, np.dtype[Any]] = {}  # matrixctl dtype -> numpy storage dtype, once


def text_metadata(metadata: Mapping[str, Any]) -> tuple[dict[str, str], list[str]]:
    """Metadata as text values, for containers whose metadata is text only: non-text values are
    stored as canonical JSON text. Returns the map and the keys that were converted."""
    import json

    out: dict[str, str] = {}
    converted = []
    for key, value in metadata.items():
        if isinstance(value, str):
            out[str(key)] = value
        else:
            out[str(key)] = json.dumps(value, sort_keys=True, ensure_ascii=False)
            converted.append(str(key))
    return out, converted


def human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


# The tensor row of every `--json` description (docs/json.md) ------------------------------

UNKNOWN_DTYPE = "unknown"


def dtype_label(name: str | None) -> str:
    """One spelling of an element type for every format's JSON rows: the zTensor names above
    (`f32`, `bf16`, `i8`, `f8_e4m3`, ...) for any alias a format uses (`F32`, `float32`, `BF16`),
    lower-case ggml names for quantized GGUF types (`q4_k`, `q8_0`), `unknown` for none."""
    if not name:
        return UNKNOWN_DTYPE
    known = dtype_named(name)
    return known.name if known is not None else name.strip().lower()


def tensor_row(
    name: str | None,
    dtype: str | None,
    shape: tuple[int, ...] | list[int] | None,
    offset: int | None,
    nbytes: int | None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One tensor as every format's description lists it (docs/json.md, "Tensor rows").

    `offset`/`nbytes` are the absolute byte range of the tensor's stored data in its file;
    `offset` is None where there is no single range (a compressed npz member, a zTensor tensor
    of several components), `shape`/`nbytes` None only where the file does not tell them.
    Everything format-specific goes under `extra`, so the top-level keys never vary."""
    return {
        "name": name,
        "dtype": dtype_label(dtype),
        "shape": None if shape is None else [int(d) for d in shape],
        "offset": offset,
        "nbytes": nbytes,
        "extra": dict(extra or {}),
    }
