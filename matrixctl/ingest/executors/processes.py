"""The processes executor (`--jobs N`): N forked worker processes.

The workers are forked as soon as the tokenizer is loaded: they share the matcher's pages.
Units go out in input order, at most 2N + 2 in flight, each worker with its own pipe; the
writer consumes the results strictly in input order, so the output bytes do not depend on N,
on how the files are grouped into units, or on which worker finishes first.

A worker leaves each unit's tokens, in the pack's dtype, in the unit's slot of shared memory
(`SlotSink`) and sends back only their count, largest id and CRC-32 (and the records); the
writer writes them from the slot (docs/inputs.md, "What crosses between processes"). Pieces of
a file as stored go to the workers as byte ranges, not bytes.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from matrixctl import codes
from matrixctl.errors import InputError, MatrixError
from matrixctl.ingest import units
from matrixctl.ingest.executors import Output, plan
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

if TYPE_CHECKING:
    import numpy as np

INGEST_WORKER_LOST = codes.define(
    "INGEST_WORKER_LOST",
    "A worker process of `ingest docs --jobs N` ended without its result (killed, out of "
    "memory); no pack is written.",
    group="ingest",
)
SLOT_BYTES = 8 << 20  # shared memory per unit in flight, for its tokens
WORKER_DEPTH = 2  # units queued at one worker
CUTTING = units.Cutting()  # pieces of files as stored travel as byte ranges

_STEP: Step | None = None
_PARENT = os.getpid()


def _die_with_parent(parent: int) -> None:
    """Make this worker end, silently, when the process that started it dies (killed with
    SIGKILL, say): Linux delivers SIGKILL on the parent's death; a parent already gone before
    that request took effect is caught by the check after it. Everywhere, SIGPIPE is restored
    to its default in workers, so a write to the dead parent's result pipe ends the worker
    without a `BrokenPipeError` traceback."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(0)


def _init_worker() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    # Forked with SIGINT and SIGTERM blocked (`Processes`): a SIGTERM that came before the
    # line above was left pending, and now ends this process as it should.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    _die_with_parent(_PARENT)


class SlotSink(TokenSink):
    """A worker's side of its unit's slot: each file's in-memory tokens are gathered into the
    slot, one file after the other, instead of into a fresh array; tokens that no longer fit
    get a fresh array (`_hand_over` sends those as a file)."""

    def __init__(self, mem: Any, slot: int) -> None:
        self.mem = mem
        self.base = slot * SLOT_BYTES
        self.used = 0
        self.made: list[tuple[np.ndarray, int]] = []  # (the array, its offset in the slot)

    def gather(self, parts: list[np.ndarray], dtype: str) -> np.ndarray | None:
        import numpy as np

        width = np.dtype(dtype).itemsize
        count = sum(part.size for part in parts)
        if self.used + count * width > SLOT_BYTES:
            return None
        out = np.frombuffer(self.mem, dtype=dtype, count=count, offset=self.base + self.used)
        np.concatenate(parts, out=out, casting="safe")
        self.made.append((out, self.used))
        self.used += count * width
        return out


def _hand_over(res: FileResult, sink: SlotSink, spill_dir: str) -> None:
    """A result's in-memory tokens, made ready to cross to the writer without their bytes:
    in the slot (their offset), else in a file in the pack's dtype; with their count, largest
    id and CRC-32, computed here rather than on the writer's serial path."""
    from matrixctl.crc import crc32

    ids = res.ids
    if ids is None:
        return
    res.ids = None
    res.raw_count, res.raw_max = int(ids.size), int(ids.max())
    data = ids.data.cast("B")
    res.raw_crc = crc32(data)
    for made, offset in sink.made:
        if made is ids:
            res.slot_offset = offset
            return
    name = res.piece.id if res.piece is not None else str(res.source.ordinal)
    res.raw_ids = os.path.join(spill_dir, f"{name}.raw")
    with open(res.raw_ids, "wb") as fp:
        fp.write(data)


def _work(unit: units.Unit, spill_dir: str, mem: Any, slot: int) -> tuple[str, Any]:
    assert _STEP is not None and _STEP.tok is not None  # the parent's, inherited
    sink = SlotSink(mem, slot)
    _STEP.spill_dir = spill_dir
    _STEP.sink = sink
    try:
        if isinstance(unit, units.Piece):
            results = [process_piece(unit, _STEP)]
        else:
            results = [process_file(sf, _STEP) for sf in unit]
        for res in results:
            _hand_over(res, sink, spill_dir)
        return "ok", results
    except MatrixError as err:
        return "error", error_payload(err)


def _serve(conn: Any, mem: Any, others: list[Any]) -> None:
    """A worker process: units from `conn`, one at a time, each answered on `conn`."""
    for other in others:  # the parent's pipe ends, inherited through the fork
        other.close()
    _init_worker()
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        try:
            unit, spill_dir, slot = task
            reply: tuple[str, Any] = _work(unit, spill_dir, mem, slot)
        except Exception as exc:  # a fault, not an input error: the writer raises it again
            reply = ("raise", exc)
        try:
            conn.send(reply)
        except Exception as exc:  # an exception that does not pickle
            conn.send(("raise", RuntimeError(f"{type(exc).__name__}: {exc}")))


class Processes:
    """N forked worker processes, started before the inputs are listed (see module doc).

    Each worker has its own pipe: this process sends it units (at most WORKER_DEPTH queued, so
    the next one is there when it ends one; the least busy worker gets the next unit) and
    reads every reply as it comes, then hands the results on strictly in input order. At
    most `window` units are in flight, each with a slot of SLOT_BYTES of shared memory (an
    anonymous shared mapping made before the fork) where its worker leaves its tokens; the
    writer writes them from there, so they cross with no pipe and no file, and the slot is
    reused once the writer has asked for the next result. A worker that dies without its
    reply (killed, out of memory) is INGEST_WORKER_LOST."""

    def __init__(self, step: Step, jobs: int) -> None:
        import mmap
        import multiprocessing

        global _STEP, _PARENT
        self.jobs = jobs
        self.step = step
        self.window = 2 * jobs + 2
        self.mem = mmap.mmap(-1, self.window * SLOT_BYTES)  # MAP_SHARED | MAP_ANONYMOUS
        self.conns: list[Any] = []
        self.procs: list[Any] = []
        self.ok = False
        # One matcher, made here and inherited: the workers read the same pages (it is never
        # written once built), so two of them running at once share one copy in the
        # processor's cache instead of competing with two (about a tenth less CPU in the
        # matcher on two cores).
        ctx = multiprocessing.get_context("fork")
        _STEP = step  # inherited by the forked workers
        _PARENT = os.getpid()
        # A worker inherits this process's SIGTERM handler (it raises an exception) until
        # `_init_worker` restores the default: it is forked with SIGINT and SIGTERM blocked,
        # so a SIGTERM from `close` in between waits and then ends it. Here a signal waits
        # until the workers are started.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            for _ in range(jobs):
                here, there = ctx.Pipe()
                proc = ctx.Process(
                    target=_serve,
                    args=(there, self.mem, [*self.conns, here]),
                    name="matrixctl-ingest",
                    daemon=True,
                )
                proc.start()
                there.close()
                self.conns.append(here)
                self.procs.append(proc)
        except BaseException:
            self.close()
            raise
        finally:
            _STEP = None
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    def results(self, files: list[SourceFile], out: Output) -> Iterator[FileResult]:
        """Each unit's results, in input order."""
        from multiprocessing.connection import wait

        import numpy as np

        spill_dir = out.spill_dir
        work = plan(files, self.step, self.jobs, CUTTING)
        free = list(range(self.window))
        queued: list[deque[int]] = [deque() for _ in self.conns]  # each worker's units
        slots: dict[int, int] = {}  # a unit in flight: its slot
        done: dict[int, tuple[str, Any]] = {}  # replies ahead of their turn
        sent = turn = 0
        more = True
        while True:
            while more and sent - turn < self.window:
                w = min(range(self.jobs), key=lambda i: len(queued[i]))
                if len(queued[w]) >= WORKER_DEPTH:
                    break
                unit = next(work, None)
                if unit is None:
                    more = False
                    break
                slots[sent] = free.pop()
                try:
                    self.conns[w].send((unit, spill_dir, slots[sent]))
                except OSError:
                    raise self._lost(w) from None
                queued[w].append(sent)
                sent += 1
            if turn in done:
                status, payload = done.pop(turn)
                if status == "error":
                    reraise(payload)
                if status == "raise":
                    raise payload
                base = slots[turn] * SLOT_BYTES
                for res in payload:
                    if res.slot_offset >= 0:
                        res.shared = np.frombuffer(
                            self.mem,
                            dtype=self.step.out_dtype,
                            count=res.raw_count,
                            offset=base + res.slot_offset,
                        )
                yield from payload
                for res in payload:
                    res.shared = None  # written: the slot is free again
                free.append(slots.pop(turn))
                turn += 1
                continue
            if turn == sent:
                break
            for ready in wait([self.conns[i] for i in range(self.jobs) if queued[i]]):
                w = self.conns.index(ready)
                try:
                    reply = self.conns[w].recv()
                except (EOFError, OSError):
                    raise self._lost(w) from None
                done[queued[w].popleft()] = reply
        self.ok = True

    def _lost(self, w: int) -> InputError:
        proc = self.procs[w]
        proc.join(1)
        code = proc.exitcode
        how = (
            "still running"
            if code is None
            else (f"killed by signal {-code}" if code < 0 else f"exit status {code}")
        )
        return InputError(
            INGEST_WORKER_LOST,
            f"worker process {proc.pid} ended without its result ({how})",
            hint="out of memory? try fewer --jobs",
        )

    def report(self) -> dict[str, Any] | None:
        return None

    def close(self) -> None:
        for conn, proc in zip(self.conns, self.procs, strict=True):
            if self.ok:
                with contextlib.suppress(OSError):
                    conn.send(None)
            else:
                proc.terminate()
        for proc in self.procs:
            proc.join(5)
            if proc.exitcode is None:  # never expected: a worker that ignored the request
                proc.kill()
                proc.join()
        for conn in self.conns:
            conn.close()
        with contextlib.suppress(BufferError):  # a view still held (an error's traceback)
            self.mem.close()
