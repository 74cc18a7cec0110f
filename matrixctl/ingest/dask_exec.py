"""`ingest docs --executor dask`: the work units as tasks on a Dask distributed cluster.

The units are those of the local path (`pipeline.plan_work`) and each task runs the local
code that turns a unit into its results (`pipeline.process_file` / `process_piece`). A task
writes its results into a staging folder beside the destination: the results file under a
temporary name, fsync, rename, then a completion record (JSON) naming the unit, its key and
the SHA-256 of every file it wrote, fsync, rename, last. The client reads the units back in
unit order and hands them to the same ordered writer as a local run, so the pack is
byte-identical to `--jobs 1`. `--resume` reuses every unit whose completion record parses and
whose files match their hashes; anything else is redone (see docs/scale-out.md).

`dask` / `distributed` are imported only here, only when this executor is used.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
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
from matrixctl.errors import InputError, MatrixError, UsageError
from matrixctl.ingest import pipeline
from matrixctl.ingest.sources import SourceFile

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
SCHEMA = "matrixctl-dask-unit/1"
ENV_SCHEDULER = "DASK_SCHEDULER_ADDRESS"


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


def _fingerprint(state: pipeline.WorkerState) -> dict[str, Any]:
    """Everything besides the unit's inputs that decides its results."""
    assert state.smap is not None
    return {
        "map": state.smap.canonical_hash(),
        "eos": state.eos_id,
        "dtype": state.out_dtype,
        "options": asdict(state.opts),
        "on_error": state.on_error,
        "strict": state.strict,
    }


def _describe(unit: list[SourceFile] | pipeline.Piece) -> tuple[str, Any]:
    """A unit's readable id and what identifies its inputs (for its key)."""
    if isinstance(unit, pipeline.Piece):
        return unit.id, [
            unit.id,
            unit.sha256,
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
            mtime = os.stat(sf.path).st_mtime_ns
        except OSError:
            mtime = None
        files.append([sf.ordinal, sf.path, sf.recorded, sf.size, sf.named, mtime])
    return f"files {unit[0].ordinal}-{unit[-1].ordinal}", files


def unit_key(fingerprint: dict[str, Any], unit: list[SourceFile] | pipeline.Piece) -> str:
    _, inputs = _describe(unit)
    blob = json.dumps([SCHEMA, fingerprint, inputs], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def _sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fp:
        while block := fp.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def _write_durable(path: str, data: bytes) -> None:
    """Temp name, write, fsync, rename: `path` is whole or absent."""
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    try:
        with open(tmp, "wb") as fp:
            fp.write(data)
            fp.flush()
            os.fsync(fp.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _fsync_file(path: str) -> None:
    with open(path, "rb") as fp:
        os.fsync(fp.fileno())


# In each Dask worker process: the tokenizer, built once per symbol map.
_WORKER_STATES: dict[str, pipeline.WorkerState] = {}


def run_unit(
    state_blob: bytes,
    unit: list[SourceFile] | pipeline.Piece,
    key: str,
    staging: str,
    data: bytes | None = None,
) -> tuple[str, Any]:
    """A Dask task: one unit to its staged results. Idempotent (a rerun writes the same
    files under fresh temporary names). A deterministic input error is returned, not raised,
    so the scheduler does not retry it; a lost worker raises nothing and is rescheduled."""
    from matrixctl.tokenizers import pi

    if data is not None:  # a piece's bytes travel apart from the task (see DaskWorkers.results)
        assert isinstance(unit, pipeline.Piece)
        unit = dataclasses.replace(unit, data=data)
    digest = hashlib.sha256(state_blob).hexdigest()
    state = _WORKER_STATES.get(digest)
    if state is None:
        state = pickle.loads(state_blob)
        assert state.smap is not None
        state.tok = pi.Tokenizer(state.smap)
        _WORKER_STATES.clear()
        _WORKER_STATES[digest] = state
    work = os.path.join(staging, f"tmp-{key}-{uuid.uuid4().hex}")
    os.makedirs(work)
    try:
        state.spill_dir = work
        try:
            if isinstance(unit, pipeline.Piece):
                results = [pipeline.process_piece(unit, state)]
            else:
                results = [pipeline.process_file(sf, state) for sf in unit]
        except MatrixError as err:
            return "error", (
                type(err).__name__,
                err.code,
                err.message,
                err.path,
                err.offset,
                err.field,
                err.hint,
            )
        hashes: dict[str, str] = {}
        for i, res in enumerate(results):
            for attr in ("spill_ids", "spill_records"):
                path = getattr(res, attr)
                if path is None:
                    continue
                name = f"{key}.{i}.{attr}"
                _fsync_file(path)
                os.replace(path, os.path.join(staging, name))
                hashes[name] = _sha256_file(os.path.join(staging, name))
                setattr(res, attr, name)  # relative: the client resolves it
        name = f"{key}.results"
        blob = pickle.dumps(results, protocol=pickle.HIGHEST_PROTOCOL)
        _write_durable(os.path.join(staging, name), blob)
        hashes[name] = hashlib.sha256(blob).hexdigest()
        record = {"schema": SCHEMA, "unit": _describe(unit)[0], "key": key, "files": hashes}
        _write_durable(os.path.join(staging, f"{key}.done"), json.dumps(record).encode())
        return "ok", None
    finally:
        shutil.rmtree(work, ignore_errors=True)


def load_unit(staging: str, key: str) -> list[pipeline.FileResult] | None:
    """A staged unit's results if its completion record and every file check out, else None."""
    try:
        with open(os.path.join(staging, f"{key}.done"), "rb") as fp:
            record = json.loads(fp.read())
        if record.get("schema") != SCHEMA or record.get("key") != key:
            return None
        files = record["files"]
        if not isinstance(files, dict) or f"{key}.results" not in files:
            return None
        for name, digest in files.items():
            if (
                not name.startswith(key + ".")
                or _sha256_file(os.path.join(staging, name)) != digest
            ):
                return None
        with open(os.path.join(staging, f"{key}.results"), "rb") as fp:
            results: list[pipeline.FileResult] = pickle.loads(fp.read())
    except (OSError, ValueError, KeyError, TypeError, AttributeError, pickle.UnpicklingError):
        return None
    for res in results:
        for attr in ("spill_ids", "spill_records"):
            name = getattr(res, attr)
            if name is not None:
                setattr(res, attr, os.path.join(staging, name))
    return results


def _drop_unit(staging: str, key: str) -> None:
    """Forget a unit before it is (re)done: without its record it is never read; the task
    then replaces its files by rename (O(1): no listing of a folder of many units)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(staging, f"{key}.done"))


class DaskWorkers:
    """The `pipeline.Workers` interface over a Dask cluster (local or at an address)."""

    def __init__(
        self,
        state: pipeline.WorkerState,
        jobs: int,
        out_dir: str,
        scheduler: str | None = None,
        resume: bool = False,
    ) -> None:
        distributed = _import_distributed()
        self.state = state
        self.jobs = jobs
        self.staging = staging_dir(out_dir)
        self.resume = resume
        self.reused = self.redone = 0
        self.ok = self.input_error = False
        self.cluster: Any = None
        address = scheduler or os.environ.get(ENV_SCHEDULER) or None
        self.address = address
        try:
            if address is None:
                self.cluster = distributed.LocalCluster(
                    n_workers=jobs,
                    threads_per_worker=1,
                    processes=True,
                    host="127.0.0.1",
                    dashboard_address=":0",
                )
                self.client = distributed.Client(self.cluster)
            else:
                self.client = distributed.Client(address, timeout="30s")
        except (OSError, TimeoutError, ValueError) as exc:
            self._shutdown()
            raise InputError(
                INGEST_DASK_CLUSTER,
                f"cannot reach the Dask scheduler: {exc}",
                path=address or "LocalCluster",
                hint="start one with `dask scheduler` or leave out --scheduler",
            ) from None
        if not resume and os.path.isdir(self.staging):
            shutil.rmtree(self.staging)
        os.makedirs(self.staging, exist_ok=True)
        tok, state.tok = state.tok, None
        try:
            self.state_blob = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
        finally:
            state.tok = tok
        self.fingerprint = _fingerprint(state)

    def results(self, files: list[SourceFile], spill_dir: str) -> Iterator[pipeline.FileResult]:
        """Each file's result, in input order: staged units are reused, the rest are tasks."""
        blob = self.client.scatter(self.state_blob, broadcast=True)
        Unit = list[SourceFile] | pipeline.Piece
        window: deque[tuple[str, Unit, Any]] = deque()  # (key, unit, future or None: staged)
        pending = pipeline.plan_work(files, self.state, self.jobs)
        limit = 4 * max(self.jobs, len(self.client.scheduler_info().get("workers", {}))) + 4

        def task(unit: Unit, key: str) -> Any:
            _drop_unit(self.staging, key)
            data = None
            if isinstance(unit, pipeline.Piece) and unit.data:
                # A piece's bytes (about 4 MiB) go from this client straight to a worker;
                # inside the task they would pass through the scheduler.
                data = self.client.scatter(unit.data, hash=False)
                unit = dataclasses.replace(unit, data=b"")
            return self.client.submit(
                run_unit,
                blob,
                unit,
                key,
                self.staging,
                data,
                key=f"matrixctl-unit-{key}",
                pure=False,
            )

        def submit(unit: Unit) -> None:
            key = unit_key(self.fingerprint, unit)
            if self.resume and os.path.exists(os.path.join(self.staging, f"{key}.done")):
                window.append((key, unit, None))
            else:
                window.append((key, unit, task(unit, key)))

        for unit in pending:
            submit(unit)
            if len(window) >= limit:
                break
        while window:
            key, unit, future = window.popleft()
            staged = None
            if future is None:
                staged = load_unit(self.staging, key)
                if staged is not None:
                    self.reused += 1
                else:  # a record or file that does not check out: the unit is redone
                    future = task(unit, key)
            if future is not None:
                staged = self._collect(key, future)
                self.redone += 1
            nxt = next(pending, None)
            if nxt is not None:
                submit(nxt)
            assert staged is not None
            yield from staged
        self.ok = True

    def _collect(self, key: str, future: Any) -> list[pipeline.FileResult]:
        import distributed

        killed = getattr(distributed, "KilledWorker", None) or distributed.scheduler.KilledWorker
        try:
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
            pipeline._reraise(payload)
        staged = load_unit(self.staging, key)
        if staged is None:
            raise InputError(
                INGEST_DASK_CLUSTER,
                f"unit {key} reported done but its staged results do not check out",
                path=self.staging,
                hint="the staging folder must be on a file system shared by every worker "
                "and this client (docs/scale-out.md)",
            )
        return staged

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

    def close(self) -> None:
        self._shutdown()
        if self.ok or self.input_error:  # a bad input: rerun after fixing it, no resume
            shutil.rmtree(self.staging, ignore_errors=True)
