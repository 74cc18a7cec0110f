"""`ingest docs --executor dask`: the work units as tasks on a Dask distributed cluster.

The units are those of the local executors (`ingest/units.py`), larger: runs of small files,
and byte ranges of whole lines of a large JSON Lines file, cut by the client while it hashes
the file. A task names its inputs, never carries them:
workers open whole files by path and read a range by offset and length, checking the file's
identity (size, mtime_ns, inode) before and after the read against what the client saw
(IO_CHANGED otherwise). A compressed source cannot be read by range: the client writes each
decompressed range to the staging folder and the worker reads that file; stdin is first
spooled to the pack's temporary folder, as for `--jobs N`, and is then a file like any other.

Each task runs the one step in a worker and stages its results beside the destination
(`dask_staging.py`: the staging format, the worker side, the checked read-back). The task
returns a small completion record, never tokens. The client checks the staged bytes against
it (CRC-32, at memory speed) and copies the tokens into the pack inside the kernel
(`copy_file_range`), in unit order, through the same ordered writer as a local run, so the
pack is byte-identical to `--jobs 1`. A merged unit's record is then pointed at its tokens'
copy in the pack's atom file (hard-linked into the staging folder) and its own tokens file
removed. Nothing is fsync'd: as every staged byte is checked before use, a unit torn by a
crash is redone, not trusted. `--resume` reuses every unit whose record parses and whose bytes
match it; anything else is redone (see docs/scale-out.md).

`dask` / `distributed` are imported only here, only when this executor is used.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import os
import pickle
import shutil
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

from matrixctl import codes
from matrixctl.errors import InputError, MatrixError, UsageError, from_os_error
from matrixctl.ingest import units
from matrixctl.ingest.executors import Output
from matrixctl.ingest.executors.dask_staging import (
    RECYCLE,
    RECYCLE_FILES,
    RangePiece,
    Unit,
    changed,
    drop_unit,
    identity,
    load_staged,
    prime_step,
    run_unit,
    unit_key,
    write_whole,
)
from matrixctl.ingest.sources import SourceFile
from matrixctl.ingest.step import FileResult, Step, TokenSink, reraise

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
INGEST_DASK_ADDRESS = codes.define(
    "INGEST_DASK_ADDRESS",
    "--scheduler (or DASK_SCHEDULER_ADDRESS) is not an address matrixctl can connect to: "
    "tcp://HOST:PORT, tls://HOST:PORT or HOST:PORT.",
    group="ingest",
)
ENV_SCHEDULER = "DASK_SCHEDULER_ADDRESS"
# How long the client waits for the scheduler to answer (connecting, and a probe whenever no
# unit has finished for that long) before INGEST_DASK_CLUSTER (docs/scale-out.md).
ENV_TIMEOUT = "MATRIXCTL_DASK_TIMEOUT"
DEFAULT_TIMEOUT = 30.0
SCHEMES = ("tcp", "tls")  # ucx:// needs ucx-py, inproc:// one process, ws:// websockets
UNIT_MAX_BYTES = 32 << 20  # a Dask unit: up to this many input bytes (local: 4 MiB)...
UNITS_PER_JOB = 8  # ...aiming at this many units per worker (local: 32)
READ_BYTES = 8 << 20  # the client reads a JSON Lines file it cuts in reads of this size


def staging_dir(out_dir: str) -> str:
    """The staging folder beside the destination (same file system, stable name)."""
    out = os.path.abspath(out_dir.rstrip("/\\") or out_dir)
    return os.path.join(os.path.dirname(out), f".{os.path.basename(out)}.dask-staging")


def answer_timeout() -> float:
    """The bound on every wait for the scheduler's answer (MATRIXCTL_DASK_TIMEOUT seconds)."""
    text = os.environ.get(ENV_TIMEOUT, "").strip()
    if not text:
        return DEFAULT_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 86400:
        raise UsageError(
            f"{ENV_TIMEOUT}={text!r}: expected seconds, more than 0 and at most 86400",
            hint=f"unset it for the default, {DEFAULT_TIMEOUT:g} s",
        )
    return value


def check_address(address: str, from_env: bool) -> None:
    """A scheduler address matrixctl can connect to (a usage error otherwise, before any
    work): Dask's ucx:// needs ucx-py and gave an INTERNAL error."""
    where = ENV_SCHEDULER if from_env else "--scheduler"
    scheme, sep, rest = address.partition("://")
    if not sep:
        scheme, rest = "tcp", address
    if scheme.lower() not in SCHEMES or not rest.strip() or address != address.strip():
        raise UsageError(
            f"{where} {address!r}: not a Dask scheduler address matrixctl connects to "
            "(tcp://HOST:PORT, tls://HOST:PORT or HOST:PORT)",
            code=INGEST_DASK_ADDRESS,
            hint="`dask scheduler` prints its address, e.g. tcp://10.0.0.5:8786",
        )


def _one_line(exc: BaseException) -> str:
    """An exception of Dask's as one line (some messages span several)."""
    text = " ".join(str(exc).split())
    if len(text) > 200:
        text = text[:199] + "…"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


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
        ident = identity(os.stat(sf.path))
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
                piece.bare(), spool, 0, piece.data_size, identity(os.stat(spool)), ident
            )
            rp.piece.data_size = -1
        if piece.last:
            try:
                same = identity(os.stat(sf.path)) == ident
            except OSError:
                same = False
            if not same:
                raise changed(sf.recorded)
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
        self.timeout = answer_timeout()
        self._quiet: list[tuple[Any, int]] = []
        if address is not None:
            check_address(address, from_env=not scheduler)
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
            prime_step(self.state_key, bare, recipe)
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
        self._silence_client_logs()
        try:
            self.client = self._connect(distributed, address)
        except BaseException:
            self._shutdown()
            gc.unfreeze()
            raise
        self._stage(blob)

    def _silence_client_logs(self) -> None:
        """Dask's client logs a traceback when it loses the scheduler (its reconnection):
        the build reports that as its one error line, so Dask's handlers show only CRITICAL
        while the build runs (restored by `close`)."""
        import logging

        for handler in logging.getLogger("distributed").handlers:
            self._quiet.append((handler, handler.level))
            handler.setLevel(logging.CRITICAL)

    def _connect(self, distributed: Any, address: str) -> Any:
        """A client of the scheduler at `address`, connected within the timeout. Dask's own
        timeout covers the TCP connection only: a scheduler that accepts it and never answers
        (frozen by SIGSTOP, or not a scheduler) kept Client() waiting forever, so the client
        is made on a helper thread that is abandoned after the timeout."""
        import threading

        box: dict[str, Any] = {}

        def connect() -> None:
            try:
                box["client"] = distributed.Client(address, timeout=f"{self.timeout}s")
            except BaseException as exc:  # raised on the main thread below
                box["error"] = exc

        thread = threading.Thread(target=connect, name="matrixctl-dask-connect", daemon=True)
        thread.start()
        thread.join(self.timeout + 5)
        if thread.is_alive():
            raise self._silent()
        exc = box.get("error")
        if exc is not None:
            if isinstance(exc, MatrixError):
                raise exc
            if isinstance(exc, Exception):
                raise self._unreachable(exc) from None
            raise exc
        return box["client"]

    def _silent(self) -> InputError:
        return InputError(
            INGEST_DASK_CLUSTER,
            f"the Dask scheduler did not answer within {self.timeout:g} s (frozen, overloaded, "
            "not a Dask scheduler, or the network to it is cut)",
            path=self.address or "LocalCluster",
            hint=f"{ENV_TIMEOUT}=SECONDS waits longer; with --resume a rerun reuses the "
            "finished units",
        )

    def _wait(self, future: Any) -> None:
        """Wait for a unit's task however long it runs, as long as the scheduler answers: each
        time no answer came for the timeout, the scheduler is asked who it is, and must reply
        within the timeout too."""
        while True:
            try:
                self.distributed.wait(future, timeout=self.timeout)
                return
            except TimeoutError:
                pass
            self._identity()

    def _identity(self) -> dict[str, Any]:
        """The scheduler's description (its workers), which must come within the timeout."""
        try:
            info: dict[str, Any] = self.client.sync(
                self.client.scheduler.identity, n_workers=-1, callback_timeout=self.timeout
            )
        except TimeoutError:
            raise self._silent() from None
        return info

    def _stage(self, blob: bytes) -> None:
        """The staging folder (emptied unless resuming) with the build's state in it."""
        if not self.resume and os.path.isdir(self.staging):
            shutil.rmtree(self.staging)
        os.makedirs(os.path.join(self.staging, RECYCLE), exist_ok=True)
        self.state_path = os.path.join(self.staging, f"state-{self.state_key}.pickle")
        write_whole(self.state_path, blob)

    def _unreachable(self, exc: BaseException) -> InputError:
        return InputError(
            INGEST_DASK_CLUSTER,
            f"cannot reach the Dask scheduler: {_one_line(exc)}",
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
            self._silence_client_logs()
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
        if isinstance(exc, Exception):
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
            workers = len(self._identity().get("workers", {}))
        limit = 4 * max(self.jobs, workers) + 4  # units carry no data: a deep window is cheap
        batch = max(self.jobs, workers)  # submitted together once this many are merged

        def task(unit: Unit, key: str) -> Any:
            drop_unit(self.staging, key)
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
                    drop_unit(self.staging, key)
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
                loaded = load_staged(self.staging, key)
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
        write_whole(os.path.join(self.staging, f"{key}.done"), json.dumps(moved).encode())
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
        try:
            # The task's record is also in the staging folder: read from there once the task
            # is done, it costs no fetch from the worker through the scheduler. Only a unit
            # whose record is missing or does not check out (a bad input's error, a staging
            # folder the client does not see) asks for the task's result.
            self._wait(future)
            if future.status == "finished":
                loaded = load_staged(self.staging, key)
                if loaded is not None:
                    return loaded
            if future.status == "error":  # the task itself raised in its worker
                self._task_error(future.exception(timeout=self.timeout))
            status, payload = future.result(timeout=self.timeout)
        except MatrixError:
            raise
        except Exception as exc:  # KilledWorker, cancelled futures, a lost connection...
            raise InputError(
                INGEST_DASK_CLUSTER,
                f"the cluster lost unit {key}: {_one_line(exc)}",
                path=self.address or "LocalCluster",
                hint="rerun with --resume to reuse the finished units",
            ) from None
        if status == "error":
            # A bad input is fixed and rerun from scratch; a full disk is freed and resumed.
            self.input_error = payload[1] not in (codes.OUT_NO_SPACE, codes.OUT_TOO_LARGE)
            reraise(payload)
        loaded = load_staged(self.staging, key, payload)
        if loaded is None:
            raise InputError(
                INGEST_DASK_CLUSTER,
                f"unit {key} reported done but its staged results do not check out",
                path=self.staging,
                hint="the staging folder must be on a file system shared by every worker "
                "and this client (docs/scale-out.md)",
            )
        return loaded

    def _task_error(self, exc: BaseException | None) -> None:
        """A task that raised (not a lost worker): a full disk where the worker writes is
        the output error it is, not a lost cluster."""
        import errno

        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise from_os_error(exc, exc.filename or self.staging, writing=True) from None

    def report(self) -> dict[str, Any]:
        return {
            "name": "dask",
            "scheduler": self.address or "LocalCluster",
            "units": self.reused + self.redone,
            "reused": self.reused,
            "redone": self.redone,
        }

    def _shutdown(self) -> None:
        client = getattr(self, "client", None)
        if client is not None:
            with contextlib.suppress(Exception):
                client.close(timeout=min(self.timeout, 10))  # a frozen scheduler: bounded
        if self.cluster is not None:
            with contextlib.suppress(Exception):
                self.cluster.close()
        for handler, level in self._quiet:
            handler.setLevel(level)
        self._quiet = []

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
