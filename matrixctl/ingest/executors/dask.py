"""`ingest docs --executor dask`: the work units as tasks on a Dask distributed cluster.

The units are those of the local executors (`ingest/units.py`), larger: runs of small files,
and byte ranges of whole lines of a large JSON Lines file, cut by the client while it hashes
the file. A task names its inputs, never carries them:
workers open whole files by path and read a range by offset and length, checking the file's
identity (size, mtime_ns, inode) before and after the read against what the client saw
(IO_CHANGED otherwise). A compressed source cannot be read by range: the client writes each
decompressed range to the staging folder and the worker reads that file; stdin is first
spooled to the pack's temporary folder, as for `--jobs N`, and is then a file like any other.

Each task runs the one step (`step.process_file` / `process_piece`, with a `StagingSink`:
tokens go to a file in the pack's dtype as they come, with their CRC-32 and largest id) and
stages its results in the staging folder beside the destination: the tokens file (renamed
into place), the records file (every document record), then the completion
record (JSON: the unit, its key, where its tokens are, the extent, CRC-32 and largest id of
each file's tokens and records), renamed last. The task returns that small record, never
tokens; the client reads it from the staging folder once the task is done. The client checks
the staged bytes against it (CRC-32, at memory speed) and copies the tokens into the pack
inside the kernel (`copy_file_range`), in unit order, through the same ordered writer as a
local run, so the pack is byte-identical to `--jobs 1`. A merged unit's record is then pointed
at its tokens' copy in the pack's atom file (hard-linked into the staging folder) and its own
tokens file removed. Nothing is fsync'd: as every staged byte is checked before use, a unit
torn by a crash is redone, not trusted. `--resume` reuses every unit whose record parses and
whose bytes match it; anything else is redone (see docs/scale-out.md).

`dask` / `distributed` are imported only here, only when this executor is used.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import mmap
import os
import pickle
import shutil
import threading
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from matrixctl import codes
from matrixctl.errors import InputError, MatrixError, UsageError, from_os_error
from matrixctl.ingest import units
from matrixctl.ingest.executors import Output
from matrixctl.ingest.sources import SourceFile
from matrixctl.ingest.step import (
    FileResult,
    Step,
    TokenSink,
    error_payload,
    process_file,
    process_piece,
    reraise,
)
from matrixctl.io import IO_CHANGED

INGEST_DASK_MISSING = codes.define(
    "INGEST_DASK_MISSING",
    "--executor dask needs the optional Dask extra (pip install 'matrixctl[dask]').",
    group="ingest",
)
INGEST_DASK_CLUSTER = codes.define(
    "INGEST_DASK_CLUSTER",
    "The Dask cluster could not be reached or started, or lost the build's tasks.",
    group="ingest",
)
SCHEMA = "matrixctl-dask-unit/4"
ENV_SCHEDULER = "DASK_SCHEDULER_ADDRESS"
UNIT_MAX_BYTES = 32 << 20  # a Dask unit: up to this many input bytes (local: 4 MiB)...
UNITS_PER_JOB = 8  # ...aiming at this many units per worker (local: 32)
READ_BYTES = 8 << 20  # the client reads a JSON Lines file it cuts in reads of this size
RECORD = 16  # bytes of one staged document record: length, item (<u8 each)

Identity = tuple[int, int, int]  # size, mtime_ns, inode


# Merged units' tokens files kept in the staging folder for the workers to overwrite: their
# pages are in the page cache already, and writing into them is cheaper than into new pages
# (`StagingSink`). At most RECYCLE_FILES per worker, so the page cache holds a few units'
# tokens besides the pack's, not all of them.
RECYCLE = "recycle"
RECYCLE_FILES = 2


def staging_dir(out_dir: str) -> str:
    """The staging folder beside the destination (same file system, stable name)."""
    out = os.path.abspath(out_dir.rstrip("/\\") or out_dir)
    return os.path.join(os.path.dirname(out), f".{os.path.basename(out)}.dask-staging")


def _import_distributed() -> Any:
    try:
        import distributed
    except ImportError:
        raise UsageError(
            "--executor dask needs Dask distributed, which is not installed",
            code=INGEST_DASK_MISSING,
            hint="pip install 'matrixctl[dask]'",
        ) from None
    return distributed


def _fingerprint(step: Step, recipe: Any) -> dict[str, Any]:
    """Everything besides the unit's inputs that decides its results."""
    return {
        "tokenizer": recipe.fingerprint,
        "eos": step.eos_id,
        "dtype": step.out_dtype,
        "options": asdict(step.opts),
        "on_error": step.on_error,
        "strict": step.strict,
    }


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


def _identity(st: os.stat_result) -> Identity:
    return st.st_size, st.st_mtime_ns, st.st_ino


def _changed(recorded: str, offset: int | None = None) -> InputError:
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
    if size > 2 * UNIT_MAX_BYTES:
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
        raise _changed(recorded) from None
    except OSError as exc:
        raise from_os_error(exc, recorded) from None
    try:
        if _identity(os.fstat(fd)) != rp.identity:
            raise _changed(recorded, rp.piece.start)
        got = 0
        with memoryview(into) as view:
            while got < rp.length:
                n = os.preadv(fd, [view[got : rp.length]], rp.offset + got)
                if not n:
                    break
                got += n
        if got != rp.length or _identity(os.fstat(fd)) != rp.identity:
            raise _changed(recorded, rp.piece.start)
    except OSError as exc:
        raise from_os_error(exc, recorded) from None
    finally:
        os.close(fd)
    return into


CUTTING = units.Cutting(
    unit_bytes=UNIT_MAX_BYTES, units_per_job=UNITS_PER_JOB, read_bytes=READ_BYTES
)


def _ranges(sf: SourceFile, pieces: Iterator[units.Piece | None], staging: str) -> Iterator[Any]:
    """A large file's pieces as Dask units: a piece of a file as stored names its byte range
    and the file's identity (size, mtime_ns, inode), checked by the worker before and after it
    reads; a decompressed piece's bytes are spooled to the staging folder and named there. A
    Parquet piece goes as it is (read by path). The file must still be the one it was when
    the cutting started, whole, at its path (the workers open the path)."""
    try:
        ident = _identity(os.stat(sf.path))
    except OSError as exc:
        raise from_os_error(exc, sf.recorded) from None
    for piece in pieces:
        if piece is None or piece.kind == "parquet":
            yield piece
            continue
        if piece.length or not piece.data_size:
            rp = RangePiece(piece, sf.path, piece.start, piece.length, ident, ident)
        else:
            end = piece.start + piece.data_size
            spool = os.path.join(staging, f"in-{sf.ordinal}-{piece.start}-{end}")
            with open(spool, "wb") as out, memoryview(piece.data) as view:
                out.write(view[: piece.data_size])
            rp = RangePiece(
                piece.bare(), spool, 0, piece.data_size, _identity(os.stat(spool)), ident
            )
            rp.piece.data_size = -1
        if piece.last:
            try:
                same = _identity(os.stat(sf.path)) == ident
            except OSError:
                same = False
            if not same:
                raise _changed(sf.recorded)
        yield rp


def plan(files: list[SourceFile], step: Step, jobs: int, staging: str) -> Iterator[Unit]:
    """The Dask work units in input order: the units' planner with larger units (fewer round
    trips) and pieces at least as large as a unit; JSON Lines pieces as range pieces. Plain
    text is not cut here (a piece of text is read by path and range, as a local worker does,
    but each would be one more staged unit for little gain)."""
    total = sum(f.size for f in files)
    target = min(UNIT_MAX_BYTES, max(units.UNIT_MIN_BYTES, total // max(1, jobs * UNITS_PER_JOB)))
    cutting = dataclasses.replace(CUTTING, piece_bytes=max(units.PIECE_BYTES, target))
    return units.plan(
        files,
        jobs,
        cutting,
        can_cut=step.on_error == "fail",
        split=lambda sf: _ranges(sf, units.split_file(sf, step.opts, cutting, None), staging),
    )


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
            ident: list[int] | None = list(_identity(os.stat(unit.source.path)))
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
            ident = list(_identity(st))
        except OSError:
            ident = None
        files.append([sf.ordinal, sf.path, sf.recorded, sf.size, sf.named, ident])
    return f"files {unit[0].ordinal}-{unit[-1].ordinal}", files


def unit_key(fingerprint: dict[str, Any], unit: Unit) -> str:
    _, inputs = _describe(unit)
    blob = json.dumps([SCHEMA, fingerprint, inputs], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


# In a Dask worker -----------------------------------------------------------------------------


def _write_whole(path: str, data: bytes) -> None:
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


def _prime_step(state_key: str, step: Step, recipe: Any) -> None:
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
        # this to its copy in a pack's atom file once merged (see DaskWorkers._merged).
        "tokens": [f"{key}.tokens", 0, pos],
        "records": rpos,
        "files": entries,
    }
    _write_whole(os.path.join(staging, f"{key}.done"), json.dumps(record).encode())
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
        except MatrixError as err:
            return "error", error_payload(err)
        return "ok", _stage(results, unit, key, staging, work, step.out_dtype)
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
    loaded = _load(staging, key, record)
    return None if loaded is None else loaded[1]


def _load(
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


def _drop_unit(staging: str, key: str) -> None:
    """Forget a unit before it is (re)done: without its record it is never read; the task
    then replaces its files by rename (O(1): no listing of a folder of many units)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(staging, f"{key}.done"))


# The own LocalCluster's Dask settings (docs/scale-out.md): the nannies fork the workers from
# this process, which has imported distributed and matrixctl already, instead of starting fresh
# interpreters (the start-up is a fraction of a second instead of one to four). The rest are
# Dask's background chores, whose cost grows with the build's wall time: the workers'
# statistical profiler (it takes the GIL from the tokenizer 100 times a second), the event
# loops' 20 ms ticks, the 0.5 s system monitor and the nannies' 0.1 s memory polls. Together
# they cost about 0.07 CPU seconds a second on an idle two-worker cluster, 0.02 with these
# values.
QUIET_WORKERS = {
    "distributed.worker.profile.enabled": False,
    "distributed.admin.tick.interval": "1s",
    "distributed.admin.system-monitor.interval": "5s",
    "distributed.worker.memory.monitor-interval": "1s",
}
LOCAL_CLUSTER_CONFIG = {"distributed.worker.multiprocessing-method": "fork", **QUIET_WORKERS}


def _local_cluster(distributed: Any, jobs: int) -> Any:
    """A LocalCluster of `jobs` single-threaded worker processes on 127.0.0.1.

    Its processes log nothing below CRITICAL: the build reports its own errors, one line each,
    and a worker's traceback (for example a heartbeat that meets the scheduler closing at the
    end of the build) would break that contract on the user's terminal (docs/scale-out.md)."""
    import logging

    import dask

    with dask.config.set(LOCAL_CLUSTER_CONFIG):
        return distributed.LocalCluster(
            n_workers=jobs,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=":0",
            silence_logs=logging.CRITICAL,
        )


class DaskExecutor:
    """The executor over a Dask cluster (local or at an address)."""

    def __init__(
        self,
        step: Step,
        jobs: int,
        out_dir: str,
        scheduler: str | None = None,
        resume: bool = False,
        recipe: Any = None,
    ) -> None:
        self.step = step
        self.jobs = jobs
        self.staging = staging_dir(out_dir)
        self.resume = resume
        self.reused = self.redone = 0
        self.ok = self.input_error = False
        self.cluster: Any = None
        self.client: Any = None
        self.distributed: Any = None
        self.starting: Any = None  # the thread starting the own cluster (`_start_own`)
        self.start_error: BaseException | None = None
        address = scheduler or os.environ.get(ENV_SCHEDULER) or None
        self.address = address
        bare = dataclasses.replace(step, tok=None, sink=TokenSink(), on_bytes=None)
        blob = pickle.dumps((bare, recipe), protocol=pickle.HIGHEST_PROTOCOL)
        # The workers read the state (the tokenizer's recipe: for π the symbol map, about
        # 1 MB, and its bytes as read; and the options) from the staging folder once each:
        # the tasks carry only its path and hash.
        self.state_key = hashlib.sha256(blob).hexdigest()
        self.fingerprint = _fingerprint(step, recipe)
        if address is None:
            import importlib.util
            import threading

            if importlib.util.find_spec("distributed") is None:
                _import_distributed()  # the one error line naming the extra
            # The own cluster's workers are forked from this process: they inherit the state
            # with its tokenizer, built once here, and start their first unit at once.
            _prime_step(self.state_key, bare, recipe)
            self._stage(blob)
            # Importing `distributed` and starting the cluster (about 0.6 s) overlap with
            # the cutting and hashing of the first units (`results`), which need neither.
            self.starting = threading.Thread(
                target=self._start_own, name="matrixctl-dask-start", daemon=True
            )
            self.starting.start()
            return
        distributed = _import_distributed()
        self.distributed = distributed
        import gc

        # This process lives for one build: what it holds now (distributed, the symbol map)
        # stays to the end, so the collector need not walk it again and again.
        gc.freeze()
        try:
            self.client = distributed.Client(address, timeout="30s")
        except (OSError, TimeoutError, ValueError) as exc:
            self._shutdown()
            gc.unfreeze()
            raise self._unreachable(exc) from None
        self._stage(blob)

    def _stage(self, blob: bytes) -> None:
        """The staging folder (emptied unless resuming) with the build's state in it."""
        if not self.resume and os.path.isdir(self.staging):
            shutil.rmtree(self.staging)
        os.makedirs(os.path.join(self.staging, RECYCLE), exist_ok=True)
        self.state_path = os.path.join(self.staging, f"state-{self.state_key}.pickle")
        _write_whole(self.state_path, blob)

    def _unreachable(self, exc: BaseException) -> InputError:
        return InputError(
            INGEST_DASK_CLUSTER,
            f"cannot reach the Dask scheduler: {exc}",
            path=self.address or "LocalCluster",
            hint="start one with `dask scheduler` or leave out --scheduler",
        )

    def _start_own(self) -> None:
        """On a helper thread: import `distributed` and start the own LocalCluster and its
        client. What this process holds by then (distributed, the symbol map) stays to the
        end of the build, so it is frozen for the collector before the workers are forked:
        their collectors skip it too and its pages stay shared."""
        import gc

        try:
            self.distributed = _import_distributed()
            gc.freeze()
            self.cluster = _local_cluster(self.distributed, self.jobs)
            self.client = self.distributed.Client(self.cluster)
        except BaseException as exc:  # raised on the main thread by `_ready`
            self.start_error = exc

    def _ready(self) -> None:
        """Wait for the own cluster (`_start_own`); its failure is INGEST_DASK_CLUSTER."""
        if self.starting is None:
            return
        self.starting.join()
        self.starting = None
        exc = self.start_error
        if exc is None:
            return
        if isinstance(exc, MatrixError):
            raise exc
        if isinstance(exc, (OSError, TimeoutError, ValueError)):
            raise self._unreachable(exc) from None
        raise exc

    def results(self, files: list[SourceFile], out: Output) -> Iterator[FileResult]:
        """Each file's result, in input order: staged units are reused, the rest are tasks."""
        window: deque[tuple[str, Unit, Any]] = deque()  # (key, unit, future or None: staged)
        self.window = window
        spill_dir = out.spill_dir
        pending = plan(files, self.step, self.jobs, self.staging)
        if self.starting is not None:  # the own cluster: `jobs` workers
            workers = self.jobs
            # The first window is cut (and its sources hashed) while the cluster starts.
            early = list(itertools.islice(pending, 4 * workers + 4))
            while self.starting.is_alive():
                more = next(pending, None)
                if more is None:
                    break
                early.append(more)
            pending = itertools.chain(early, pending)
            self._ready()
        else:
            workers = len(self.client.scheduler_info().get("workers", {}))
        limit = 4 * max(self.jobs, workers) + 4  # units carry no data: a deep window is cheap
        batch = max(self.jobs, workers)  # submitted together once this many are merged

        def task(unit: Unit, key: str) -> Any:
            _drop_unit(self.staging, key)
            return self.client.submit(
                run_unit,
                self.state_key,
                self.state_path,
                unit,
                key,
                self.staging,
                key=f"matrixctl-unit-{key}",
                pure=False,
            )

        def submit(units: list[Unit]) -> None:
            """Append units to the window; those not staged already go to the scheduler in
            one message (one graph update for the batch)."""
            entries: list[tuple[str, Unit, bool]] = []  # in unit order: (key, unit, staged)
            for unit in units:
                key = unit_key(self.fingerprint, unit)
                staged = self.resume and os.path.exists(os.path.join(self.staging, f"{key}.done"))
                if not staged:
                    _drop_unit(self.staging, key)
                entries.append((key, unit, staged))
            todo = [(key, unit) for key, unit, staged in entries if not staged]
            futures = iter(
                self.client.map(
                    run_unit,
                    [self.state_key] * len(todo),
                    [self.state_path] * len(todo),
                    [unit for _, unit in todo],
                    [key for key, _ in todo],
                    [self.staging] * len(todo),
                    key=[f"matrixctl-unit-{key}" for key, _ in todo],
                    pure=False,
                )
                if todo
                else ()
            )
            for key, unit, staged in entries:
                window.append((key, unit, None if staged else next(futures)))

        def refill(room: int) -> None:
            # A batch at a time: the workers start on the first units while the client cuts
            # the next ones (a first batch of the whole window would wait for all of it).
            while room > 0:
                units = list(itertools.islice(pending, min(batch, room)))
                if not units:
                    return
                submit(units)
                room -= len(units)

        refill(limit)
        link, at = self._link_atoms(spill_dir)
        while window:
            key, unit, future = window.popleft()
            loaded = None
            if future is None:
                loaded = _load(self.staging, key)
                if loaded is not None:
                    self.reused += 1
                else:  # a record or file that does not check out: the unit is redone
                    future = task(unit, key)
            if future is not None:
                loaded = self._collect(key, future)
                self.redone += 1
            if isinstance(unit, RangePiece) and unit.path != unit.piece.source.path:
                with contextlib.suppress(OSError):
                    os.unlink(unit.path)  # a decompressed range, read
            if len(window) <= limit - batch:
                refill(limit - len(window))
            assert loaded is not None
            record, staged = loaded
            yield from staged
            # The writer asks for the next result only once it has copied these: the unit's
            # tokens are now in the pack's atom file too (which the staging folder links).
            size = record["tokens"][2]
            if link is not None:
                self._merged(key, record, link, at)
            at += size
        self.ok = True

    def _link_atoms(self, spill_dir: str) -> tuple[str | None, int]:
        """Hard-link the pack's atom file, still being written, into the staging folder; and
        the offset where the next unit's tokens go in it. Each merged unit's record then names
        its tokens' copy in that file, and its own tokens file is given to the workers to
        overwrite or removed at once (`_recycle`): the page cache holds every token once (in
        the pack, besides a few recycled units) instead of twice until the end, and a
        build resumed after its client was killed still finds the merged units' tokens, in
        the killed build's atom file (whose own folder the next build removes). Without hard
        links (some file systems) the tokens files stay until the build ends."""
        from matrixctl.formats import ingest_pack, matrix_atom

        atoms = os.path.join(os.path.dirname(os.path.abspath(spill_dir)), ingest_pack.ATOMS)
        link = f"atoms-{uuid.uuid4().hex}.bin"
        try:
            os.link(atoms, os.path.join(self.staging, link))
        except OSError:
            return None, matrix_atom.HEADER_SIZE
        return link, matrix_atom.HEADER_SIZE

    def _merged(self, key: str, record: dict[str, Any], link: str, at: int) -> None:
        """Point a merged unit's record at its tokens in the atom file (`link`, offset `at`),
        then drop its tokens file. A record pointing at the wrong bytes only costs a redo:
        every extent is checked by its CRC-32 before use (load_unit)."""
        name, _, size = record["tokens"]
        if name == link:
            return
        moved = dict(record, tokens=[link, at, size])
        _write_whole(os.path.join(self.staging, f"{key}.done"), json.dumps(moved).encode())
        if name == f"{key}.tokens":
            self._recycle(os.path.join(self.staging, name))

    def _recycle(self, path: str) -> None:
        """A merged unit's tokens file, no record naming it any more: into the recycle folder
        for a worker's next unit to overwrite (`StagingSink`), while it holds fewer than
        RECYCLE_FILES per worker; else removed."""
        folder = os.path.join(self.staging, RECYCLE)
        with contextlib.suppress(OSError):
            if len(os.listdir(folder)) < RECYCLE_FILES * max(1, self.jobs):
                os.replace(path, os.path.join(folder, os.path.basename(path)))
                return
        with contextlib.suppress(OSError):
            os.unlink(path)

    def _collect(self, key: str, future: Any) -> tuple[dict[str, Any], list[FileResult]]:
        distributed = self.distributed
        killed = getattr(distributed, "KilledWorker", None) or distributed.scheduler.KilledWorker
        try:
            # The task's record is also in the staging folder: read from there once the task
            # is done, it costs no fetch from the worker through the scheduler. Only a unit
            # whose record is missing or does not check out (a bad input's error, a staging
            # folder the client does not see) asks for the task's result.
            distributed.wait(future)
            if future.status == "finished":
                loaded = _load(self.staging, key)
                if loaded is not None:
                    return loaded
            status, payload = future.result()
        except (killed, distributed.client.FutureCancelledError, OSError, TimeoutError) as exc:
            raise InputError(
                INGEST_DASK_CLUSTER,
                f"the cluster lost unit {key}: {type(exc).__name__}: {exc}",
                path=self.address or "LocalCluster",
                hint="rerun with --resume to reuse the finished units",
            ) from None
        if status == "error":
            self.input_error = True
            reraise(payload)
        loaded = _load(self.staging, key, payload)
        if loaded is None:
            raise InputError(
                INGEST_DASK_CLUSTER,
                f"unit {key} reported done but its staged results do not check out",
                path=self.staging,
                hint="the staging folder must be on a file system shared by every worker "
                "and this client (docs/scale-out.md)",
            )
        return loaded

    def report(self) -> dict[str, Any]:
        return {
            "name": "dask",
            "scheduler": self.address or "LocalCluster",
            "units": self.reused + self.redone,
            "reused": self.reused,
            "redone": self.redone,
        }

    def _shutdown(self) -> None:
        for obj in (getattr(self, "client", None), self.cluster):
            if obj is not None:
                with contextlib.suppress(Exception):
                    obj.close()

    def _drain(self) -> None:
        """Let the units still in flight finish: a task already running on a worker cannot be
        stopped, and one that ended after the staging folder was removed would create it again."""
        futures = [future for _, _, future in getattr(self, "window", ()) if future is not None]
        if futures:
            with contextlib.suppress(Exception):
                self.distributed.wait(futures, timeout=120)

    def close(self) -> None:
        import gc

        if self.starting is not None:  # the build stopped before it needed the cluster
            self.starting.join()
            self.starting = None
        if not self.ok and self.input_error:
            self._drain()
        self._shutdown()
        gc.unfreeze()
        # A bad input: rerun after fixing it, no resume; a cluster that never started: nothing
        # was staged.
        never_started = self.start_error is not None and not self.resume
        if self.ok or self.input_error or never_started:
            shutil.rmtree(self.staging, ignore_errors=True)
