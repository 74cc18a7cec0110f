"""The streaming encoder: bytes in, token arrays out, block by block, on one thread or more.

The token stream grammar is in `matrixctl.tokenizers.scx.api` (and docs/formats/scx.md).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from matrixctl.tokenizers.scx import tokens as scx_tokens
from matrixctl.tokenizers.scx.config import Tokenizer
from matrixctl.tokenizers.scx.issues import Issue, fail

if TYPE_CHECKING:
    import numpy as np

# Encoder work unit: one kernel call (the GIL released for all of it). The kernel reads and writes
# in order (only its lane table is read at random), so a block need not fit a cache; its tokens
# go to a pooled block of memory (`Codec.encode_buffer`), so a larger one costs no page faults.
BLOCK_BYTES = 1 << 18


class Encoder:
    """Bytes in, token arrays out, block by block (memory bounded by the block size)."""

    def __init__(
        self, tok: Tokenizer, *, strict_alignment: bool = False, emit_debug_markers: bool = False
    ) -> None:
        self.tok = tok
        self.strict = strict_alignment
        self.debug = emit_debug_markers
        self.carry = b""
        self.bytes_in = 0
        self.bundles = 0
        self.warnings: list[Issue] = []
        self.pad_bytes = 0  # PAD-BYTEs that complete the last bundle (0: none)
        self._started = False
        self._done = False
        self.block = max(1, BLOCK_BYTES // tok.bundle_bytes) * tok.bundle_bytes

    def _emit(self, arrays: list[np.ndarray], extra: list[int]) -> None:
        import numpy as np

        if extra:
            arrays.append(np.array(extra, dtype="<u2"))
            extra.clear()

    def feed(self, data: Any) -> list[np.ndarray]:
        """Tokens for the whole bundles completed by `data` (a bytes-like object)."""
        import numpy as np

        out: list[np.ndarray] = []
        pending: list[int] = []
        if not self._started:
            self._started = True
            pending += [scx_tokens.TOK_CONFIG, *self.tok.h_tok]
        view = memoryview(data).cast("B")
        self.bytes_in += len(view)
        bb = self.tok.bundle_bytes
        pos = 0
        if self.carry:
            need = bb - len(self.carry)
            if len(view) < need:
                self.carry += bytes(view)
                self._emit(out, pending)
                return out
            first = np.frombuffer(self.carry + bytes(view[:need]), dtype=np.uint8)
            self._bundles(first, out, pending)
            self.carry = b""
            pos = need
        whole = pos + (len(view) - pos) // bb * bb
        if whole > pos:
            self._bundles(np.frombuffer(view, dtype=np.uint8)[pos:whole], out, pending)
        self.carry = bytes(view[whole:])
        self._emit(out, pending)
        return out

    def _bundles(self, data: np.ndarray, out: list[np.ndarray], pending: list[int]) -> None:
        self._emit(out, pending)
        out.extend(self.tokens_for(data, self.bundles))
        self.bundles += data.size // self.tok.bundle_bytes

    def tokens_for(self, data: np.ndarray, first_bundle: int) -> list[np.ndarray]:
        """Tokens of whole bundles starting at bundle `first_bundle` of the stream, with the
        SHARD_START / SHARD_END markers among them, in arrays of a block (`self.block` bytes)
        each: one kernel call (framing included, the GIL released once for all the blocks). A
        pure function of its arguments and the config, so ranges may be encoded in any order
        (or in parallel) and joined."""
        tok = self.tok
        if not data.size:
            return []
        return tok.codec.bundle_blocks(
            data,
            first_bundle,
            self.debug,
            tok.chunk_bundles,
            tok.shard_bundles,
            self.block // tok.bundle_bytes,
        )

    def finish(self) -> list[np.ndarray]:
        """The last (padded) bundle, the closing SHARD_END, STREAM_END and the byte count."""
        import numpy as np

        if self._done:
            return []
        self._done = True
        out = self.feed(b"") if not self._started else []
        pending: list[int] = []
        tok = self.tok
        if self.carry:
            at = self.bytes_in - len(self.carry)
            pad = tok.bundle_bytes - len(self.carry)
            if self.strict:
                raise fail(
                    scx_tokens.MISALIGNED_SHARD,
                    f"input is {self.bytes_in} bytes, not a multiple of the bundle size "
                    f"{tok.bundle_bytes}; strict_alignment refuses to pad the last "
                    f"{len(self.carry)} bytes",
                    byte_offset=at,
                    context={"bundle_bytes": tok.bundle_bytes, "input_bytes": self.bytes_in},
                )
            # Not a warning: padding is the alignment law's normal case and lossless
            # (STREAM_END has the byte count); strict_alignment refuses it (docs/formats/scx.md).
            self.pad_bytes = pad
            j = self.bundles
            if j % tok.shard_bundles == 0:
                pending.append(scx_tokens.SHARD_START)
            chunk_mark = self.debug and j % tok.chunk_bundles == 0
            pending += tok.codec.partial_bundle(self.carry, self.debug, chunk_mark)
            self.bundles += 1
            pending.append(scx_tokens.SHARD_END)
        elif self.bundles % tok.shard_bundles:
            pending.append(scx_tokens.SHARD_END)
        pending += [scx_tokens.STREAM_END, *struct.pack("<Q", self.bytes_in)]
        out.append(np.array(pending, dtype="<u2"))
        return out


def encode_chunks(
    tok: Tokenizer,
    chunks: Iterable[Any],
    *,
    jobs: int = 1,
    strict_alignment: bool = False,
    emit_debug_markers: bool = False,
    warnings: list[Issue] | None = None,
    padding: list[int] | None = None,
) -> Iterator[np.ndarray]:
    """Encode a stream of byte chunks; with `jobs` > 1, every chunk is cut into `jobs` parts
    (whole blocks of BLOCK_BYTES) that `jobs` threads encode (the compiled kernel makes a
    part's tokens, shard markers included, with the GIL released; a thread holds it only
    between parts), and the token arrays are joined in input order: the same tokens as
    `jobs` = 1. While the threads encode one chunk, the main thread reads the next; it waits
    for a chunk's parts before it reads the chunk after, so no more chunks are alive than with
    one thread (more live read buffers cost page faults). `warnings` and `padding` (the
    PAD-BYTEs that complete the last bundle) are filled in at the end."""
    import numpy as np

    enc = Encoder(tok, strict_alignment=strict_alignment, emit_debug_markers=emit_debug_markers)
    try:
        if jobs <= 1:
            for chunk in chunks:
                yield from enc.feed(chunk)
            yield from enc.finish()
            return
        bb = tok.bundle_bytes
        enc._started = True
        yield np.array([scx_tokens.TOK_CONFIG, *tok.h_tok], dtype="<u2")
        carry = b""
        running: list[_Call] = []  # the parts of the chunk being encoded
        with _Threads(jobs) as pool:
            for piece in chunks:
                # bytes are immutable, so a chunk that is bytes is used as it is (no copy)
                data = piece if isinstance(piece, bytes) else bytes(piece)
                enc.bytes_in += len(data)
                if carry:
                    data = carry + data
                whole = len(data) // bb * bb
                blocks = -(-whole // enc.block)
                step = max(1, -(-blocks // jobs)) * enc.block  # bytes per part: whole blocks
                arr = np.frombuffer(data, dtype=np.uint8, count=whole)
                parts = [
                    pool.submit(
                        enc.tokens_for, arr[start : start + step], enc.bundles + start // bb
                    )
                    for start in range(0, whole, step)
                ]
                enc.bundles += whole // bb
                carry = data[whole:]
                del data, arr
                for done in running:
                    yield from done.result()
                running = parts
            for done in running:
                yield from done.result()
        enc.carry = carry
        yield from enc.finish()
    finally:
        if warnings is not None:
            warnings.extend(enc.warnings)
        if padding is not None:
            padding.append(enc.pad_bytes)


class _Call:
    """A call handed to `_Threads`: its result or exception once `done` is released."""

    __slots__ = ("args", "done", "error", "fn", "value")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], lock: Any) -> None:
        self.fn = fn
        self.args = args
        self.value: Any = None
        self.error: BaseException | None = None
        self.done = lock  # held until the call has run
        lock.acquire()

    def result(self) -> Any:
        """The call's value (waiting for it), or its exception raised here."""
        self.done.acquire()
        self.done.release()
        if self.error is not None:
            raise self.error
        return self.value


class _Threads:
    """`jobs` threads that run the calls handed to them (`submit`) in the order given; the
    caller takes each call's result in the order it likes (`_Call.result`). A call is a lock
    that its thread releases when the call is done: lighter than `concurrent.futures`, whose
    import (with `logging`'s) took 5-10 ms of a 0.2 s two-thread encode, on the one thread
    nothing shares, and whose futures hand over through a Python condition. Leaving the
    `with` block stops the threads: calls not yet started are dropped, running ones end."""

    def __init__(self, jobs: int) -> None:
        import threading
        from queue import SimpleQueue

        self._lock = threading.Lock
        self._todo: SimpleQueue[_Call | None] = SimpleQueue()
        self._stop = False
        self._threads = [
            threading.Thread(target=self._serve, name=f"matrixctl-scx-{i}", daemon=True)
            for i in range(jobs)
        ]
        try:
            for thread in self._threads:
                thread.start()
        except BaseException:
            self.close()
            raise

    def submit(self, fn: Callable[..., Any], *args: Any) -> _Call:
        call = _Call(fn, args, self._lock())
        self._todo.put(call)
        return call

    def _serve(self) -> None:
        while True:
            call = self._todo.get()
            if call is None:
                return
            if not self._stop:
                try:
                    call.value = call.fn(*call.args)
                except BaseException as exc:  # raised where the caller takes the result
                    call.error = exc
            call.done.release()

    def close(self) -> None:
        self._stop = True
        for _ in self._threads:
            self._todo.put(None)
        for thread in self._threads:
            if thread.ident is not None:
                thread.join()

    def __enter__(self) -> _Threads:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


READ_BYTES = 4 << 20  # bytes per read of `encode_file`
# Bytes per task of `encode_file`'s threads (4 blocks, one kernel call), and tasks per thread
# handed out ahead of the one whose tokens are yielded next: the threads have work for a few
# milliseconds when the main thread is slow to come back. Every block alive at once is a block
# of the kernel's pool that was fresh memory once (page faults: with 2 MiB tasks, four ahead,
# two threads made 8,000-9,000 faults on 256 MiB against 3,500 for one thread; now ~4,600).
TASK_BYTES = 1 << 20
AHEAD = 3
TAIL = 2  # the last TAIL tasks per thread are cut four times finer (`_ranges`)


def encode_file(
    tok: Tokenizer,
    fp: Any,
    *,
    jobs: int = 1,
    strict_alignment: bool = False,
    emit_debug_markers: bool = False,
    warnings: list[Issue] | None = None,
    padding: list[int] | None = None,
    tick: Callable[[int], None] | None = None,
) -> Iterator[np.ndarray]:
    """`encode_chunks` of a binary file object read to its end, without a fresh buffer per
    read: the same tokens for any `jobs`. `tick(n)` is called with the count of input bytes
    behind the tokens about to be yielded (a progress bar).

    With `jobs` > 1 and a seekable regular file, the threads read as well as encode: a task is
    a byte range of `TASK_BYTES` (whole bundles) that the thread reads with `os.preadv` into a
    buffer of its own, kept from task to task (memory already in place: no page faults), and
    encodes; the main thread only hands out ranges, `AHEAD` per thread ahead, and yields
    the tokens in input order. What follows the whole bundles the file held when encoding
    started (its last, short bundle; bytes appended meanwhile) is then read and encoded here,
    as with one thread. A file that ends before that size is an OSError (EIO). With one job,
    the file is read into one buffer, reused (`readinto`); another stream with `jobs` > 1
    (a pipe) goes through `encode_chunks`."""
    fd = _regular_fd(fp) if jobs > 1 else None
    if jobs > 1 and fd is None:
        yield from encode_chunks(
            tok,
            _read_chunks(fp, tick, fresh=True),
            jobs=jobs,
            strict_alignment=strict_alignment,
            emit_debug_markers=emit_debug_markers,
            warnings=warnings,
            padding=padding,
        )
        return
    enc = Encoder(tok, strict_alignment=strict_alignment, emit_debug_markers=emit_debug_markers)
    try:
        if fd is not None:
            yield from _encode_ranges(enc, fp, fd, jobs, tick)
        # after the ranges, little is left (a short last bundle): no 4 MiB read buffer for it
        for chunk in _read_chunks(fp, tick, fresh=fd is not None):
            yield from enc.feed(chunk)
        yield from enc.finish()
    finally:
        if warnings is not None:
            warnings.extend(enc.warnings)
        if padding is not None:
            padding.append(enc.pad_bytes)


def _regular_fd(fp: Any) -> int | None:
    """The descriptor of `fp` when it is a regular file that `fp` can seek in, else None."""
    import os
    import stat

    if not (hasattr(fp, "seek") and hasattr(fp, "tell")):
        return None
    try:
        fd = int(fp.fileno())
        return fd if stat.S_ISREG(os.fstat(fd).st_mode) else None
    except (OSError, ValueError, AttributeError, TypeError):
        return None


def _read_chunks(fp: Any, tick: Callable[[int], None] | None, *, fresh: bool) -> Iterator[Any]:
    """The stream's bytes, READ_BYTES at a time: new bytes objects when `fresh` (for a consumer
    that keeps them), else views of one buffer, each valid until the next is asked for."""
    if fresh or not hasattr(fp, "readinto"):
        while True:
            block = fp.read(READ_BYTES)
            if not block:
                return
            if tick is not None:
                tick(len(block))
            yield block
    view = memoryview(bytearray(READ_BYTES))
    while True:
        n = fp.readinto(view)
        if not n:
            return
        if tick is not None:
            tick(n)
        yield view[:n]


def _encode_ranges(
    enc: Encoder, fp: Any, fd: int, jobs: int, tick: Callable[[int], None] | None
) -> Iterator[np.ndarray]:
    """TOK_CONFIG, then the tokens of the whole bundles of the regular file `fd` from the
    offset of `fp` to the file's present size, encoded by `jobs` threads that read their
    ranges themselves; leaves `enc` and `fp` just after those bundles."""
    import errno
    import os
    import threading
    from collections import deque

    import numpy as np

    tok = enc.tok
    bb = tok.bundle_bytes
    start = fp.tell()
    whole = max(0, os.fstat(fd).st_size - start) // bb * bb
    first = enc.bundles
    enc._started = True
    yield np.array([scx_tokens.TOK_CONFIG, *tok.h_tok], dtype="<u2")
    step = max(1, TASK_BYTES // bb) * bb
    name = fp.name if isinstance(getattr(fp, "name", None), str) else None  # for the error

    with _Threads(jobs) as pool:
        local = threading.local()

        def task(offset: int, size: int) -> list[np.ndarray]:
            buf = getattr(local, "buf", None)
            if buf is None:
                buf = local.buf = bytearray(step)  # this thread's, for all its tasks
            with memoryview(buf) as view:
                got = 0
                while got < size:
                    n = os.preadv(fd, [view[got:size]], start + offset + got)
                    if n <= 0:
                        at = start + offset + got
                        why = f"the input ended at byte {at}, before its size"
                        raise OSError(errno.EIO, why, name)
                    got += n
            data = np.frombuffer(buf, dtype=np.uint8, count=size)
            return enc.tokens_for(data, first + offset // bb)

        ranges = _ranges(whole, step, bb, jobs)
        ahead: deque[tuple[int, _Call]] = deque()
        for at, size in ranges:
            ahead.append((size, pool.submit(task, at, size)))
            if len(ahead) == AHEAD * jobs:
                break
        while ahead:
            size, done = ahead.popleft()
            arrays = done.result()
            for at, more in ranges:
                ahead.append((more, pool.submit(task, at, more)))
                break
            if tick is not None:
                tick(size)
            yield from arrays
    enc.bytes_in += whole
    enc.bundles += whole // bb
    fp.seek(start + whole)


def _ranges(whole: int, step: int, bundle: int, jobs: int) -> Iterator[tuple[int, int]]:
    """(offset, size) of the tasks that cover `whole` bytes: `step` bytes each, and a quarter
    of that (whole bundles) in the last `TAIL` tasks' worth per thread, so the threads end
    within a small task of each other, not a whole one."""
    small = max(bundle, step // 4 // bundle * bundle)
    at = 0
    while at < whole:
        size = min(step if whole - at > TAIL * jobs * step else small, whole - at)
        yield at, size
        at += size
