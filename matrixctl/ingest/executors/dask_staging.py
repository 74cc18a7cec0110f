"""The Dask executor's staging: what a task does in a worker and what the client reads back.

A task names its inputs, never carries them (`Unit`): a run of small files, a Parquet piece,
or a `RangePiece` (a byte range of whole lines of a JSON Lines file, checked against the
file's identity before and after the read). In the worker, `run_unit` runs the one step with a
`StagingSink` (tokens go to a file in the pack's dtype as they come, one taken from the
recycle folder when there is one) and stages the unit's results in the staging folder: the
tokens file (renamed into place), the records file (every document record), then the
completion record (JSON: the unit, its key, where its tokens are, the extent, CRC-32 and
largest id of each file's tokens and records), renamed last. In the client, `load_unit`
trusts a staged unit only if its record parses and every extent's CRC-32 matches; anything
else is redone. The key of a unit (`unit_key`) covers the schema, the build's fingerprint and
its inputs' identities, so `--resume` reuses exactly the units whose results would not change.

The client side of the executor (planning, the cluster, merging in order) is `dask.py`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import mmap
import os
import pickle
import shutil
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from matrixctl.errors import InputError, MatrixError, from_os_error
from matrixctl.ingest import units
from matrixctl.ingest.sources import SourceFile
from matrixctl.ingest.step import (
    FileResult,
    Step,
    TokenSink,
    error_payload,
    process_file,
    process_piece,
)
from matrixctl.io import IO_CHANGED

SCHEMA = "matrixctl-dask-unit/4"

RECORD = 16  # bytes of one staged document record: length, item (<u8 each)
# A worker keeps its range buffer from unit to unit up to this size: twice the largest unit
# (dask.UNIT_MAX_BYTES; a test ties the two).
KEEP_BUFFER_MAX = 64 << 20

Identity = tuple[int, int, int]  # size, mtime_ns, inode


# Merged units' tokens files kept in the staging folder for the workers to overwrite: their
# pages are in the page cache already, and writing into them is cheaper than into new pages
# (`StagingSink`). At most RECYCLE_FILES per worker, so the page cache holds a few units'
# tokens besides the pack's, not all of them.
RECYCLE = "recycle"
RECYCLE_FILES = 2


# Range pieces ---------------------------------------------------------------------------------


@dataclass
class RangePiece:
    """A piece of a JSON Lines source named by where its bytes are, not carried: `length`
    bytes at `offset` of `path` (the source itself, or for a compressed source the piece's
    decompressed bytes spooled to the staging folder), whose identity was `identity` when
    the client read it. `piece` is the piece without its data."""

    piece: units.Piece
    path: str
    offset: int
    length: int
    identity: Identity
    source_identity: Identity  # of the file as stored (the same as identity when uncompressed)


Unit = list[SourceFile] | units.Piece | RangePiece


def identity(st: os.stat_result) -> Identity:
    return st.st_size, st.st_mtime_ns, st.st_ino


def changed(recorded: str, offset: int | None = None) -> InputError:
    return InputError(
        IO_CHANGED,
        "changed while the build read it (its size, modification time or inode differ from "
        "when the client cut it); nothing was written",
        path=recorded,
        offset=offset,
        hint="rerun once the file is stable",
    )


_UNIT_BUFFERS = threading.local()


def _unit_buffer(size: int) -> bytearray:
    """This worker thread's buffer for the bytes of its range pieces, reused from unit to
    unit (a unit is tokenized before its task returns). A new buffer per unit was a new
    mapping of up to 32 MiB each time (above the allocator's mmap threshold), faulted in and
    zeroed page by page: about 1 GB of new memory per GB of input. A piece larger than
    twice the largest unit (one long line) gets a buffer of its own, so a worker that lives
    on after the build does not keep that much."""
    if size > KEEP_BUFFER_MAX:
        return bytearray()
    buf: bytearray | None = getattr(_UNIT_BUFFERS, "buffer", None)
    if buf is None:
        buf = _UNIT_BUFFERS.buffer = bytearray()
    return buf


def read_range(rp: RangePiece, into: bytearray | None = None) -> bytearray:
    """A range piece's bytes, read in a worker: the file must be the one the client read
    (same size, mtime_ns and inode) before and after the read, else IO_CHANGED. They are read
    into `into` (`_unit_buffer`, grown as needed), which is returned: its first `rp.length`
    bytes are the piece's, the rest is left from earlier units; without it, into a buffer of
    exactly their size."""
    if into is None:
        into = bytearray(rp.length)
    elif len(into) < rp.length:
        into.extend(bytes(rp.length - len(into)))
    recorded = rp.piece.source.recorded
    try:
        fd = os.open(rp.path, os.O_RDONLY)
    except FileNotFoundError:
        raise changed(recorded) from None
    except OSError as exc:
        raise from_os_error(exc, recorded) from None
    try:
        if identity(os.fstat(fd)) != rp.identity:
            raise changed(recorded, rp.piece.start)
        got = 0
        with memoryview(into) as view:
            while got < rp.length:
                n = os.preadv(fd, [view[got : rp.length]], rp.offset + got)
                if not n:
                    break
                got += n
        if got != rp.length or identity(os.fstat(fd)) != rp.identity:
            raise changed(recorded, rp.piece.start)
    except OSError as exc:
        raise from_os_error(exc, recorded) from None
    finally:
        os.close(fd)
    return into


def _describe(unit: Unit) -> tuple[str, Any]:
    """A unit's readable id and what identifies its inputs (for its key)."""
    if isinstance(unit, RangePiece):
        p = unit.piece
        return p.id, [
            p.id,
            p.source.path,
            p.source.recorded,
            list(unit.source_identity),
            p.first_line,
            p.last,
            p.file_sha256,
            p.file_size,
            p.compression,
        ]
    if isinstance(unit, units.Piece):
        try:
            ident: list[int] | None = list(identity(os.stat(unit.source.path)))
        except OSError:
            ident = None
        return unit.id, [
            unit.id,
            ident,
            unit.source.recorded,
            unit.source.path,
            unit.kind,
            list(unit.groups) if unit.groups else None,
            unit.last,
            unit.file_sha256,
            unit.file_size,
        ]
    files = []
    for sf in unit:
        try:
            st = os.stat(sf.path)
            ident = list(identity(st))
        except OSError:
            ident = None
        files.append([sf.ordinal, sf.path, sf.recorded, sf.size, sf.named, ident])
    return f"files {unit[0].ordinal}-{unit[-1].ordinal}", files


def unit_key(fingerprint: dict[str, Any], unit: Unit) -> str:
    _, inputs = _describe(unit)
    blob = json.dumps([SCHEMA, fingerprint, inputs], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


# In a Dask worker -----------------------------------------------------------------------------


def write_whole(path: str, data: bytes) -> None:
    """Temp name, write, rename: `path` is whole or absent (after a process kill; after a
    crash of the machine its content is checked before use, see load_unit)."""
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    try:
        with open(tmp, "wb") as fp:
            fp.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class StagingSink(TokenSink):
    """A Dask worker's sink: every unit's tokens go to a file (staged as it is, see `_stage`),
    one taken from the recycle folder when there is one: renamed away (so no other worker gets
    it), overwritten from its start and cut to size. Its pages are in the page cache already:
    writing into them cost 0.2 s of system time for 660 MB on the benchmark machine, writing a
    new file 0.45-2.5 s (new pages, zeroed)."""

    files_only = True

    def __init__(self, recycle: str) -> None:
        self.recycle = recycle

    def claim(self, path: str) -> bool:
        return _claim(self.recycle, path)


def _claim(folder: str, dest: str) -> bool:
    """Move one file of `folder` to `dest` (a rename: of workers racing for the same file,
    one gets it); False when there is none to take. Only a regular file with no other link
    is written into: a symbolic link or a hard link put there (the staging folder may be on
    a shared file system) would have the tokens written over some other file."""
    import stat

    try:
        entries = list(os.scandir(folder))
    except OSError:
        return False
    for entry in entries:
        if not entry.is_file(follow_symlinks=False):
            continue
        try:
            os.replace(entry.path, dest)
            st = os.lstat(dest)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
            return True
        with contextlib.suppress(OSError):
            os.unlink(dest)  # swapped for something else since the listing: not ours
    return False


# In each Dask worker process: the step with its tokenizer, built once per build.
_WORKER_STEPS: dict[str, Step] = {}


def _worker_step(state_key: str, state_path: str) -> Step:
    """The build's step (options) with its tokenizer: read from the staging folder and built
    once per worker process and build (`state_key` is its SHA-256). The state file holds the
    tokenizer's recipe (for π: the map and its bytes, so a worker takes its matcher from its
    machine's map cache like a local build)."""
    step = _WORKER_STEPS.get(state_key)
    if step is None:
        with open(state_path, "rb") as fp:
            blob = fp.read()
        if hashlib.sha256(blob).hexdigest() != state_key:
            raise OSError(f"{state_path} is not the state of this build")
        step, recipe = pickle.loads(blob)
        step.tok = recipe.build()
        _WORKER_STEPS.clear()
        _WORKER_STEPS[state_key] = step
    return step


def prime_step(state_key: str, step: Step, recipe: Any) -> None:
    """In the client, before it forks its own cluster's workers: the step of this build with
    its tokenizer, as `_worker_step` would build it in each worker."""
    _WORKER_STEPS.clear()
    _WORKER_STEPS[state_key] = dataclasses.replace(step, tok=recipe.build())


def _record_blocks(res: FileResult) -> Iterator[bytes]:
    import numpy as np

    if res.spill_records is not None:
        with open(res.spill_records, "rb") as fp:
            while block := fp.read(16 << 20):
                yield block
    elif res.records:
        yield np.array(res.records, dtype="<u8").tobytes()


RESULT_FIELDS = (
    "kind",
    "sha256",
    "size",
    "skip_reason",
    "skip_code",
    "compression",
    "decompressed",
    "documents",
    "empty_documents",
    "skipped_records",
    "tokens",
    "lines",
)


def _stage(
    results: list[FileResult], unit: Unit, key: str, staging: str, work: str, dtype: str
) -> dict[str, Any]:
    """Write a unit's tokens file, records file and completion record; return the record.

    The tokens are already in files in the pack's dtype, each with its count, largest id and
    CRC-32 computed as it was written (`StagingSink`): a
    unit of one result renames its file into place; several results' files are copied into
    one inside the kernel. No token is read again here."""
    from matrixctl.crc import crc32
    from matrixctl.io import copy_file_range_all

    width = 2 if dtype == "<u2" else 4
    entries: list[dict[str, Any]] = []
    first = results[0].raw_ids if len(results) == 1 else None
    tokens = first or os.path.join(work, "tokens")
    pos = 0
    with contextlib.ExitStack() as stack:
        out = None if first else stack.enter_context(open(tokens, "wb"))
        for res in results:
            nbytes = res.raw_count * width if res.raw_ids else 0
            if res.raw_ids and out is not None:
                with open(res.raw_ids, "rb") as src:
                    copy_file_range_all(src.fileno(), 0, nbytes, out.fileno())
            entries.append({"ids": [pos, nbytes, res.raw_max, res.raw_crc if nbytes else 0]})
            pos += nbytes
    records = os.path.join(work, "records")
    rpos = 0
    with open(records, "wb") as fp:
        for res, entry in zip(results, entries, strict=True):
            crc, start = 0, rpos
            for block in _record_blocks(res):
                crc = crc32(block, crc)
                fp.write(block)
                rpos += len(block)
            entry["records"] = [start, rpos - start, crc]
    os.replace(tokens, os.path.join(staging, f"{key}.tokens"))
    os.replace(records, os.path.join(staging, f"{key}.records"))
    for res, entry in zip(results, entries, strict=True):
        sf = res.source
        entry["source"] = [sf.ordinal, sf.path, sf.recorded, sf.size, sf.named]
        entry["result"] = {name: getattr(res, name) for name in RESULT_FIELDS}
        if res.piece is not None:
            entry["piece"] = {
                f.name: getattr(res.piece, f.name)
                for f in dataclasses.fields(res.piece)
                if f.name not in ("source", "data")
            }
    record = {
        "schema": SCHEMA,
        "unit": _describe(unit)[0],
        "key": key,
        "dtype": dtype,
        # Where the tokens are: (file in the staging folder, offset, bytes). The client moves
        # this to its copy in a pack's atom file once merged (see dask.DaskExecutor._merged).
        "tokens": [f"{key}.tokens", 0, pos],
        "records": rpos,
        "files": entries,
    }
    write_whole(os.path.join(staging, f"{key}.done"), json.dumps(record).encode())
    return record


def run_unit(
    state_key: str, state_path: str, unit: Unit, key: str, staging: str
) -> tuple[str, Any]:
    """A Dask task: one unit to its staged results; returns its completion record (never its
    tokens). Idempotent (a rerun writes the same files under fresh temporary names). A
    deterministic input error is returned, not raised, so the scheduler does not retry it; a
    lost worker raises nothing and is rescheduled."""
    import gc

    step = dataclasses.replace(
        _worker_step(state_key, state_path), sink=StagingSink(os.path.join(staging, RECYCLE))
    )
    work = os.path.join(staging, f"tmp-{key}-{uuid.uuid4().hex}")
    os.makedirs(work)
    # Tokenizing makes no reference cycles, but in a worker's large heap (distributed's own
    # objects) the collector's passes cost several per cent of the task: off while it runs.
    collecting = gc.isenabled()
    gc.disable()
    try:
        step.spill_dir = work
        try:
            if isinstance(unit, RangePiece):
                data = read_range(unit, _unit_buffer(unit.length))
                piece = dataclasses.replace(unit.piece, data=data, data_size=unit.length)
                results = [process_piece(piece, step)]
            elif isinstance(unit, units.Piece):
                results = [process_piece(unit, step)]
            else:
                results = [process_file(sf, step) for sf in unit]
            staged = _stage(results, unit, key, staging, work, step.out_dtype)
        except MatrixError as err:
            return "error", error_payload(err)
        except OSError as exc:
            # A full disk under the staging folder: the output error it is, named (a rerun
            # on another worker would meet the same disk), not a lost worker.
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                raise
            return "error", error_payload(from_os_error(exc, exc.filename or staging, writing=True))
        return "ok", staged
    finally:
        if collecting:
            gc.enable()
        shutil.rmtree(work, ignore_errors=True)


# In the client --------------------------------------------------------------------------------


def load_unit(
    staging: str, key: str, record: dict[str, Any] | None = None
) -> list[FileResult] | None:
    """A staged unit's results if its completion record (read from the staging folder when
    not given) parses and its tokens and records match it (the CRC-32 of every extent), else
    None. The tokens stay in their file: each result names its extent (`staged_ids`)."""
    loaded = load_staged(staging, key, record)
    return None if loaded is None else loaded[1]


def load_staged(
    staging: str, key: str, record: dict[str, Any] | None = None
) -> tuple[dict[str, Any], list[FileResult]] | None:
    import numpy as np

    from matrixctl.crc import crc32

    try:
        if record is None:
            with open(os.path.join(staging, f"{key}.done"), "rb") as fp:
                record = json.loads(fp.read())
        if not isinstance(record, dict) or record.get("schema") != SCHEMA:
            return None
        if record.get("key") != key:
            return None
        dtype = record["dtype"]
        name, base, size = record["tokens"]
        rsize = record["records"]
        if (
            dtype not in ("<u2", "<u4")
            or not isinstance(name, str)
            or os.path.basename(name) != name
            or not all(isinstance(v, int) and v >= 0 for v in (base, size, rsize))
        ):
            return None
        path = os.path.join(staging, name)
        with open(os.path.join(staging, f"{key}.records"), "rb") as fp:
            recs_data = fp.read(rsize + 1)
        if len(recs_data) != rsize:
            return None
        results: list[FileResult] = []
        with contextlib.ExitStack() as stack:
            view = memoryview(b"")
            if size:
                fp = stack.enter_context(open(path, "rb"))
                if os.fstat(fp.fileno()).st_size < base + size:
                    return None
                at = base - base % mmap.ALLOCATIONGRANULARITY
                mm = stack.enter_context(
                    mmap.mmap(fp.fileno(), base + size - at, access=mmap.ACCESS_READ, offset=at)
                )
                view = stack.enter_context(memoryview(mm))[base - at :]
            with view:
                for entry in record["files"]:
                    start, nbytes, _, crc = entry["ids"]
                    rstart, rbytes, rcrc = entry["records"]
                    if (
                        min(start, nbytes, rstart, rbytes) < 0
                        or start + nbytes > size
                        or rstart + rbytes > rsize
                        or rbytes % RECORD
                        or crc32(view[start : start + nbytes]) != crc
                        or crc32(recs_data[rstart : rstart + rbytes]) != rcrc
                    ):
                        return None
                    res = _result(entry, path, base, dtype)
                    recs = np.frombuffer(recs_data, dtype="<u8", count=rbytes // 8, offset=rstart)
                    res.records = recs.reshape(-1, 2).tolist()  # type: ignore[assignment]
                    results.append(res)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, BufferError):
        return None
    return record, results


def _result(entry: dict[str, Any], path: str, base: int, dtype: str) -> FileResult:
    ordinal, src_path, recorded, size, named = entry["source"]
    sf = SourceFile(ordinal, src_path, recorded, size, named)
    res = FileResult(sf, "")
    for name in RESULT_FIELDS:
        setattr(res, name, entry["result"][name])
    piece = entry.get("piece")
    if piece is not None:
        groups = piece.pop("groups")
        res.piece = units.Piece(
            source=sf, data=b"", groups=tuple(groups) if groups else None, **piece
        )
    start, nbytes, top, crc = entry["ids"]
    if nbytes:
        res.staged_ids = (path, base + start, nbytes, dtype, top, crc)
    return res


def drop_unit(staging: str, key: str) -> None:
    """Forget a unit before it is (re)done: without its record it is never read; the task
    then replaces its files by rename (O(1): no listing of a folder of many units)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(staging, f"{key}.done"))
