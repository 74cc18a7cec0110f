"""Work units of `ingest docs`: one planner and one cutter for every executor.

A work unit is either a run of consecutive small files or one `Piece` of a large file: whole
lines of a JSON Lines file, a stretch of a plain text file cut where the tokenizer says a cut
changes no id, or a run of row groups of a Parquet file. A piece is self-contained and its id
(`ORDINAL:START-END`, the range in the decompressed stream) is the same whatever the executor
or `--jobs`, so its result can be checked, staged and reused (Dask `--resume`).

The executors differ only in the parameters they hand the planner (`Cutting`): the size of a
unit, how a file as stored is read (its pieces as byte ranges the worker reads itself, or with
their bytes from one read of the file), and whether decompression runs on a helper thread.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from matrixctl import codes
from matrixctl.errors import InputError, from_os_error
from matrixctl.ingest import kinds
from matrixctl.ingest.kinds.base import HashingReader, Options, too_long
from matrixctl.ingest.sources import SourceFile
from matrixctl.io import IO_CHANGED

INGEST_CHANGED = codes.define(
    "INGEST_CHANGED",
    "An input file became shorter while it was ingested (a worker found fewer bytes than the "
    "file held when it was cut into pieces).",
    group="ingest",
)
UNIT_MAX_BYTES = 4 << 20  # a unit of small files: consecutive files up to this many bytes...
UNIT_MIN_BYTES = 64 << 10
UNIT_MAX_FILES = 256  # ...and at most this many files
UNITS_PER_JOB = 32  # aim: this many units per worker, so the last ones end close together
PIECE_BYTES = 4 << 20  # a piece of one large file: about this many bytes
SPLIT_MIN = 2 * PIECE_BYTES  # files from this size on are cut into pieces


@dataclass(frozen=True)
class Cutting:
    """An executor's parameters for the planner and the cutter."""

    unit_bytes: int = 0  # a unit of small files: at most this many bytes (0: UNIT_MAX_BYTES)
    units_per_job: int = UNITS_PER_JOB
    piece_bytes: int = 0  # a piece: about this many bytes (0: PIECE_BYTES)
    read_bytes: int = 0  # at most this many bytes per read while cutting (0: the piece size)
    keep_stored: bool = False  # a stored file's pieces carry their bytes (one read of the file)
    ahead: bool = False  # decompress on a helper thread while the pieces are tokenized
    defer_hash: bool = False  # a Parquet file's last piece carries its running hash

    def piece(self) -> int:
        return self.piece_bytes or PIECE_BYTES

    def unit(self) -> int:
        return self.unit_bytes or UNIT_MAX_BYTES


@dataclass
class Piece:
    """A work unit inside one source (see the module doc). `first_line` is the number of lines
    before it, or -1 when they were not counted (a file as stored: the worker counts its
    piece's lines and the writer adds those before it). The last piece carries the file's
    totals (hash and size as stored, compression)."""

    id: str
    source: SourceFile
    index: int
    start: int
    first_line: int
    lines: int
    data: bytes | bytearray
    stored_end: int  # stored bytes of the file read when the piece was cut (progress)
    last: bool = False
    file_sha256: str = ""
    file_size: int = 0
    compression: str | None = None
    decompressed: int | None = None
    kind: str = "jsonl"
    groups: tuple[int, int] | None = None  # Parquet: the row groups [first, stop)
    # A piece of a file as stored may travel without its bytes: `data` is then empty and the
    # worker reads these `length` bytes at `start` itself.
    length: int = 0
    # The piece's bytes are the first `data_size` of `data` (a buffer the cutter reuses once
    # the piece is done), or all of it (-1).
    data_size: int = -1
    # The last piece of a Parquet file under `defer_hash`: the file's hash still running on a
    # helper thread (an `io.FileHash`), taken once the piece is tokenized (never pickled).
    digest: Any = None
    # A piece of a file as stored: the file's (size, mtime_ns, inode) when the planner opened
    # it to hash and cut it. A worker reads its range only from that file (`read_range`), so
    # the tokens and the manifest's SHA-256 come from the same bytes.
    identity: tuple[int, int, int] | None = None

    def bare(self) -> Piece:
        """The piece without its bytes and running hash (what a result carries)."""
        return dataclasses.replace(self, data=b"", digest=None)


Unit = list[SourceFile] | Piece


# The cutter ------------------------------------------------------------------------------------


@dataclass
class Cut:
    start: int  # offset in the (decompressed) stream
    end: int
    data: bytearray | None  # with `keep`: a buffer whose first end - start bytes are the piece's
    lines: int  # line feeds in the piece (with `keep`), else -1
    read_to: int  # stream bytes read when it was cut
    last: bool = False


def text_cut(data: bytearray, lo: int, hi: int, followers: bytes) -> int:
    """The index just after the last line feed in `data[lo:hi - 1]` after which a text file may
    be cut (the byte after it is ASCII, not a carriage return, not one of `followers`), or
    -1."""
    at = hi - 1
    while True:
        at = data.rfind(b"\n", lo, at)
        if at < 0:
            return -1
        nxt = data[at + 1]
        if nxt < 0x80 and nxt != 0x0D and nxt not in followers:  # CR is read as a line feed
            return at + 1


def cut(
    fill: Callable[[memoryview], int],
    piece_bytes: int,
    max_doc: int,
    on_too_long: Callable[[int, int], Exception],
    *,
    read_bytes: int = 0,
    followers: bytes | None = None,
    keep: bool = False,
    sha: Any = None,
) -> Iterator[Cut]:
    """The one cutter: a stream read in order by `fill(view) -> bytes read` (0 at its end),
    cut into pieces of at least `piece_bytes` that end at a line end: any line end
    (`followers` None: JSON Lines), or one `text_cut` allows (plain text). A line longer than
    `max_doc` (JSON Lines) raises `on_too_long(its offset, the lines before it or -1 when not
    counted)`, before more than that is held.

    With `keep`, each piece carries its bytes: they are read straight into one of two buffers
    that take turns, valid until the piece after it is asked for (the bytes after its last line
    end move over to the other buffer), and its lines are counted. Without, pieces are ranges
    and no byte is kept. `sha`: every read is hashed into it on a helper thread (hashlib
    releases the GIL) while the next one is searched and read; all are hashed when this ends.
    """
    chunk = min(read_bytes, piece_bytes) if read_bytes else piece_bytes
    bufs = [bytearray(), bytearray()]
    hashing: list[Any] = [None, None]  # the hash of each buffer's last read, in flight
    cur = filled = start = pos = 0
    mark = 0  # stream offset of the last place a piece may end (>= start)
    lines_cut = 0  # line feeds in the pieces cut so far (with `keep`)
    pending: Cut | None = None
    pool = ThreadPoolExecutor(1, thread_name_prefix="matrixctl-hash") if sha is not None else None
    with pool if pool is not None else nullcontext() as hasher:

        def free(i: int) -> None:
            if hashing[i] is not None:
                hashing[i].result()
                hashing[i] = None

        while True:
            buf = bufs[cur]
            if len(buf) < filled + chunk:  # first use, or a piece longer than the buffer
                free(cur)
                grown = bytearray(max(filled + chunk, 2 * len(buf)))
                grown[:filled] = buf[:filled]
                bufs[cur] = buf = grown
            n = fill(memoryview(buf)[filled : filled + chunk])
            if n and hasher is not None:  # hashed in order: the newest future is the last
                hashing[cur] = hasher.submit(sha.update, memoryview(buf)[filled : filled + n])
            base = pos - filled  # the stream offset of buf[0]
            pos += n
            end = filled + n
            if n:
                lo = max(0, filled - 1) if keep else 0
                if followers is None:
                    at = buf.rfind(b"\n", lo, end) + 1 or -1
                else:
                    at = text_cut(buf, lo, end, followers)
                if at >= 0:
                    mark = base + at
                elif followers is None and pos - mark > max_doc + 1:
                    before = lines_cut + buf.count(b"\n", 0, mark - base) if keep else -1
                    raise on_too_long(mark, before)
                if pos - start < piece_bytes or mark == start:
                    if keep:
                        filled = end
                    else:
                        cur, filled = 1 - cur, 0
                        free(cur)
                    continue
                stop = mark
            else:
                stop = pos
                if stop == start and pending is not None:
                    break
            lines = buf.count(b"\n", 0, stop - start) if keep else -1
            piece = Cut(start, stop, buf if keep else None, lines, pos)
            lines_cut += max(0, lines)
            if pending is not None:
                yield pending  # its buffer, the other one, is free once this returns
            pending = piece
            start = mark = stop
            if not n:
                break
            other = 1 - cur
            free(other)
            if keep:
                rest = end - (stop - base)
                if len(bufs[other]) < rest + chunk:
                    bufs[other] = bytearray(rest + chunk)
                bufs[other][:rest] = buf[stop - base : end]
                filled = rest
            else:
                filled = 0
            cur = other
        for i in (0, 1):
            free(i)
    assert pending is not None
    pending.last = True
    yield pending


# Reading a file as stored ----------------------------------------------------------------------


def open_raw(sf: SourceFile) -> Any:
    if sf.path == "-":
        from matrixctl.io import open_input_stream

        return open_input_stream("-")  # never closes stdin; bounded by the spool limit
    return open(sf.path, "rb")


def identity(st: os.stat_result) -> tuple[int, int, int]:
    """What tells a file rewritten (in place or replaced) from the one that was read."""
    return st.st_size, st.st_mtime_ns, st.st_ino


def changed(sf: SourceFile, offset: int | None = None) -> InputError:
    return InputError(
        IO_CHANGED,
        "changed while the build read it (its size, modification time or inode differ from "
        "when it was hashed and cut into pieces); nothing was written",
        path=sf.recorded,
        offset=offset,
        hint="rerun once the file is stable",
    )


def check_identity(piece: Piece) -> None:
    """IO_CHANGED unless the file at the piece's path is still the one the planner cut and
    hashed (pieces of files as stored; a no-op for the others)."""
    if piece.identity is None:
        return
    try:
        now = identity(os.stat(piece.source.path))
    except OSError:
        raise changed(piece.source) from None
    if now != piece.identity:
        raise changed(piece.source)


def read_range(
    sf: SourceFile, start: int, length: int, ident: tuple[int, int, int] | None = None
) -> bytes:
    """The bytes of a ranged piece, read by the worker from the file as stored; with `ident`,
    only from the file the planner hashed (checked before and after the read: IO_CHANGED)."""
    try:
        with open(sf.path, "rb") as fp:
            if ident is not None and identity(os.fstat(fp.fileno())) != ident:
                raise changed(sf, start)
            fp.seek(start)
            data = fp.read(length)
            if ident is not None and identity(os.fstat(fp.fileno())) != ident:
                raise changed(sf, start)
    except InputError:
        raise
    except OSError as exc:
        if ident is not None and isinstance(exc, FileNotFoundError):
            raise changed(sf, start) from None  # removed or renamed away since it was cut
        raise from_os_error(exc, sf.recorded) from None
    if len(data) != length:
        raise InputError(
            INGEST_CHANGED,
            f"changed while it was read: {length:,} bytes expected at byte {start:,}, "
            f"{len(data):,} found",
            path=sf.recorded,
            offset=start,
        )
    return data


def lines_before(sf: SourceFile, end: int) -> int:
    """The line feeds in the first `end` bytes of a file as stored."""
    count = 0
    try:
        with open(sf.path, "rb") as fp:
            while end > 0:
                block = fp.read(min(end, 8 << 20))
                if not block:
                    break
                count += block.count(b"\n")
                end -= len(block)
    except OSError as exc:
        raise from_os_error(exc, sf.recorded) from None
    return count


class RangeReader:
    """`length` bytes of a file from `start`, read as a stream (a piece of a text file)."""

    def __init__(
        self, sf: SourceFile, start: int, length: int, ident: tuple[int, int, int] | None = None
    ) -> None:
        self.sf = sf
        self.pos = start
        self.left = length
        self.ident = ident

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        if n <= 0:
            return b""
        data = read_range(self.sf, self.pos, n, self.ident)
        self.pos += n
        self.left -= n
        return data


class ReadAhead:
    """`read(size)` of a stream done on a helper thread (`io.Ahead`), up to two reads ahead of
    the caller; an exception the stream raises is raised by the `fill` that reaches it.
    `close` stops the thread (the caller may stop early)."""

    def __init__(self, stream: Any, size: int) -> None:
        import functools

        from matrixctl.io import Ahead

        self.ahead = Ahead(iter(functools.partial(stream.read, size), b""), "matrixctl-read")
        self.chunks = iter(self.ahead)
        self.rest = memoryview(b"")

    def fill(self, view: memoryview) -> int:
        if not self.rest:
            try:
                self.rest = memoryview(next(self.chunks))
            except StopIteration:
                return 0
        n = min(len(view), len(self.rest))
        view[:n] = self.rest[:n]
        self.rest = self.rest[n:]
        return n

    def close(self) -> None:
        self.ahead.close()


def stream_fill(stream: Any) -> Callable[[memoryview], int]:
    """`fill` over a stream that has only `read` (decompressed data, stdin)."""

    def fill(view: memoryview) -> int:
        data = stream.read(len(view))
        view[: len(data)] = data
        return len(data)

    return fill


# Splitting one file ----------------------------------------------------------------------------


def _pieces(
    sf: SourceFile,
    cuts: Iterator[Cut],
    kind: str,
    ranged: bool,
) -> Iterator[Piece]:
    lines = 0
    for index, c in enumerate(cuts):
        piece = Piece(
            f"{sf.ordinal}:{c.start}-{c.end}",
            sf,
            index,
            c.start,
            -1 if c.lines < 0 else lines,
            c.lines,
            b"" if c.data is None else c.data,
            c.read_to,
            last=c.last,
            kind=kind,
        )
        if ranged:
            piece.length = c.end - c.start
        else:
            piece.data_size = c.end - c.start
            lines += c.lines
        yield piece


def split_parquet(sf: SourceFile, size: int, defer: bool = False) -> Iterator[Piece]:
    """The pieces of one large Parquet file: runs of row groups. The file is hashed on a
    helper thread while its pieces are tokenized (hashlib and reads release the GIL); the
    last piece waits for the digest, or with `defer` carries the running hash, which
    `step.process_piece` takes once the piece is tokenized."""
    from matrixctl.ingest.kinds import columnar
    from matrixctl.io import FileHash

    try:
        ident = identity(os.stat(sf.path))
    except OSError as exc:
        raise from_os_error(exc, sf.recorded) from None
    ranges = columnar.row_group_pieces(sf.path, sf.recorded, size)
    ends = columnar.row_group_ends(sf.path, sf.recorded)
    hashing: FileHash | None = FileHash(sf.path)
    try:
        for index, (first, stop, rows) in enumerate(ranges):
            piece = Piece(f"{sf.ordinal}:rg{first}-{stop}", sf, index, first, rows, 0, b"", 0)
            piece.kind = "parquet"
            piece.groups = (first, stop)
            piece.identity = ident  # the workers read by path: `check_identity`
            piece.stored_end = ends[stop - 1] if stop > 0 else 0  # progress by bytes
            if index == len(ranges) - 1:
                piece.last = True
                assert hashing is not None
                if defer:
                    piece.digest, hashing = hashing, None
                else:
                    piece.file_sha256 = hashing.result()
                    check_identity(piece)  # the hash is of the file the pieces were cut from
                piece.file_size = piece.stored_end = os.path.getsize(sf.path)
            yield piece
    finally:
        if hashing is not None:
            hashing.cancel()


def split_file(
    sf: SourceFile,
    opts: Options,
    cutting: Cutting,
    cut_followers: Callable[[], bytes | None] | None,
) -> Iterator[Piece | None]:
    """Cut one source into pieces if its kind can be cut: yields None (and nothing else) when
    it cannot, so the caller hands it out whole. Runs in the process that plans, reading the
    stream once, in order: it hashes the stored bytes as it cuts. A file as stored (not
    compressed, not stdin) is cut into byte ranges the worker reads itself, or with
    `keep_stored` pieces that carry their bytes; a stream's pieces always carry theirs.
    `cut_followers`: where the tokenizer lets plain text be cut (`IngestTokenizer.
    cut_followers`, asked only when a plain text file could be cut: it may walk the whole
    vocabulary); None: never."""
    try:
        opened = open_raw(sf)
    except OSError as exc:
        raise from_os_error(exc, sf.recorded) from None
    with opened as raw:
        reader = HashingReader(raw)
        try:
            inp = kinds.open_input(reader, "" if sf.path == "-" else sf.path, sf.recorded, opts)
            stored = inp.compression is None and sf.path != "-"
            how = kinds.get(inp.kind).cut if inp.kind in kinds.REGISTRY else None
            if how == "row-groups" and stored:
                yield from split_parquet(sf, cutting.piece(), cutting.defer_hash)
                return
            followers = None
            if how == "text" and stored and cut_followers is not None:
                followers = cut_followers()
            if how == "text" and followers is None:
                how = None
            if how not in ("lines", "text"):
                yield None
                return

            def long_line(offset: int, before: int) -> Exception:
                line = (lines_before(sf, offset) if before < 0 else before) + 1
                return too_long(sf.recorded, line, offset, opts.max_doc)

            followers = followers if how == "text" else None
            if stored:
                yield from _split_stored(sf, cutting, opts, followers, long_line, how)
                return
            ahead = ReadAhead(inp.stream, cutting.piece()) if cutting.ahead else None
            try:
                fill = stream_fill(inp.stream) if ahead is None else ahead.fill
                cuts = cut(fill, cutting.piece(), opts.max_doc, long_line, keep=True)
                last: Piece | None = None
                for piece in _pieces(sf, cuts, how_kind(how), False):
                    piece.stored_end = reader.size  # progress: the stored bytes read so far
                    if piece.last:
                        last = piece
                        break
                    yield piece
            finally:
                if ahead is not None:
                    ahead.close()
            assert last is not None
            reader.drain()
            last.file_sha256 = "sha256:" + reader.sha.hexdigest()
            last.file_size = last.stored_end = reader.size
            last.compression = inp.compression
            last.decompressed = None if inp.decompressor is None else inp.decompressor.produced
            yield last
        except OSError as exc:
            raise from_os_error(exc, sf.recorded) from None


def how_kind(how: str) -> str:
    return "jsonl" if how == "lines" else "text"


def _split_stored(
    sf: SourceFile,
    cutting: Cutting,
    opts: Options,
    followers: bytes | None,
    long_line: Callable[[int, int], Exception],
    how: str,
) -> Iterator[Piece]:
    """The pieces of a file as stored, from one more pass over it from its start (unbuffered
    reads; each hashed on a helper thread)."""
    sha = hashlib.sha256()
    with open(sf.path, "rb", buffering=0) as fp:
        ident = identity(os.fstat(fp.fileno()))
        keep = cutting.keep_stored and how == "lines"
        cuts = cut(
            fp.readinto,
            cutting.piece(),
            opts.max_doc,
            long_line,
            read_bytes=cutting.read_bytes,
            followers=followers,
            keep=keep,
            sha=sha,
        )
        for piece in _pieces(sf, cuts, how_kind(how), not keep):
            if keep:  # lines counted by the worker, as for ranges (the writer adds the base)
                piece.first_line = piece.lines = -1
            piece.identity = ident
            if piece.last:
                # Hashed to the end: the file must still be the one opened, or the hash mixes
                # two versions (the workers check their ranges against `ident` too).
                if identity(os.fstat(fp.fileno())) != ident:
                    raise changed(sf)
                piece.file_sha256 = "sha256:" + sha.hexdigest()
                piece.file_size = piece.stored_end = piece.start + (piece.length or piece.data_size)
            yield piece


# The planner -------------------------------------------------------------------------------------


def plan(
    files: list[SourceFile],
    jobs: int,
    cutting: Cutting,
    *,
    can_cut: bool,
    split: Callable[[SourceFile], Iterator[Any]],
) -> Iterator[Any]:
    """The work units in input order: runs of consecutive small files of about equal size in
    bytes, and the pieces of every large file that can be cut (`split(sf)`, which yields None
    alone for a file that cannot), so one big file keeps every worker busy. The target size of
    a run shrinks for small inputs so every worker gets many units and the workers finish
    close together. Files are cut only when `can_cut` (under --on-error fail: a file left out
    must leave no token behind); stdin is never cut here (with several workers it is spooled
    to a file first)."""
    total = sum(f.size for f in files)
    target = min(cutting.unit(), max(UNIT_MIN_BYTES, total // max(1, jobs * cutting.units_per_job)))
    unit: list[SourceFile] = []
    size = 0
    for sf in files:
        if can_cut and sf.size >= SPLIT_MIN and sf.path != "-":
            pieces = split(sf)
            first = next(pieces)
            if first is not None:
                if unit:
                    yield unit
                    unit, size = [], 0
                yield first
                yield from (p for p in pieces if p is not None)
                continue
        if unit and (size + sf.size > target or len(unit) >= UNIT_MAX_FILES):
            yield unit
            unit, size = [], 0
        unit.append(sf)
        size += sf.size
    if unit:
        yield unit
