"""One document encoded by several worker processes, with the ids one process gives
(`tokenize pi encode --jobs N`; docs/formats/pi-symbol-map.md, "Parallel encoding").

The input's bytes are cut into units of about `UNIT` bytes, each cut just before an ASCII byte
(or, in text without one, before a CJK ideograph, Hangul syllable or kana letter). In UTF-8 such
a byte starts a whole character, and a cut before that character is one `safe_cut` makes:
normalizing the units one by one gives the text normalizing the whole gives.

A worker decodes its unit, normalizes it and, in the normalized bytes, looks for the first and
the last position no symbol can span (`Trie.cut`: every trie walk that starts within
`lookahead` bytes before it dies before it, or reaches no pattern end beyond it). The greedy
tiling of any text that contains those bytes has a token boundary there, whatever the other
units hold, so the worker tokenizes the bytes between the two positions alone. The main process
tokenizes only the seams (the tail of one unit with the head of the next: a few bytes) and
yields the ids in input order. A unit with no such position (no cut within `WINDOW` bytes of
either end) goes to the main process whole and is matched there as the streaming encoder
matches (`StreamEncoder`): slower, never different.

`jobs` processes share the units: the main process and `jobs - 1` forked workers (they inherit
the loaded tokenizer, as `ingest docs --jobs` workers do, and talk to the main process through
pipes: `_Workers`). The main process tokenizes units too, whenever the next result it needs
is not there yet: a process that only waited would leave a core idle while its seams and
output writes took time from the workers. A worker gets the next unit when it has room, the
main process when no worker has, so the shares follow what the units cost (they differ by
10 % between neighbours in real text, so a fixed deal left one process waiting). At most two
units per process are in flight, which keeps memory flat.
An input of one unit or less is encoded in the calling process (no fork for a one-line input).
"""

from __future__ import annotations

import contextlib
import errno
import marshal
import os
import signal
import struct
from collections import deque
from collections.abc import Generator, Iterator
from typing import Any

from matrixctl.errors import FormatError
from matrixctl.tokenizers import pi

UNIT = 1 << 20  # raw bytes per work unit
WINDOW = 1 << 16  # how far from each end of a unit a cut is looked for
NEAR = 1 << 10  # first, how far from the end
MAX_SCAN = 1 << 16  # how far back from a unit's end a cut point in the raw bytes is looked for
TAIL = 3  # a file's last TAIL * UNIT bytes go in units of UNIT / 4

_TOK: pi.Tokenizer | None = None  # the tokenizer the forked workers inherit
_FD = -1  # the input file they read their units from (a regular file), else -1
_START = 0  # the input's first byte (a byte-order mark there is dropped)


def _cut_point(buf: bytes | bytearray) -> int:
    """An index i > 0 just before an ASCII byte or a CJK/Hangul/kana character near the end of
    `buf` (the start of a whole character that a safe cut may precede), or 0 for none."""
    stop = max(0, len(buf) - MAX_SCAN)
    for i in range(len(buf) - 1, stop, -1):
        b = buf[i]
        if b < 0x80:
            return i
        if 0xE3 <= b <= 0xED:
            try:
                ch = bytes(buf[i : i + 3]).decode("utf-8")
            except UnicodeDecodeError:
                continue
            if len(ch) == 1 and pi._safe_char(ch):
                return i
    return 0


Unit = tuple[int, int, int, bytes | None]  # offset, length, width of the next character, bytes


def _width(first: int) -> int:
    return 1 if first < 0x80 else 3


def _units(fp: Any) -> Iterator[Unit]:
    """The units of a stream, read here and handed to the workers with their bytes (the
    bytes, then the character after them, which decides a cut UTF-8 sequence)."""
    buf = bytearray()
    offset = 0
    eof = False
    while not eof:
        while len(buf) < UNIT:
            data = fp.read(UNIT)
            if not data:
                eof = True
                break
            buf += data
        if eof:
            break
        cut = _cut_point(buf)
        if cut == 0:  # no cut point near the end: take in more bytes
            more = fp.read(UNIT)
            if more:
                buf += more
                continue
            eof = True
            break
        width = _width(buf[cut])
        yield offset, cut, width, bytes(buf[: cut + width])
        offset += cut
        del buf[:cut]
    if buf:
        yield offset, len(buf), 0, bytes(buf)


def _file_units(fd: int, start: int, size: int) -> Iterator[Unit]:
    """The units of a regular file: only the bytes near each cut are read here; each worker
    reads its own unit (`os.pread` on the inherited descriptor)."""
    offset = start
    end = start + size
    while True:
        # The last TAIL units' worth of bytes is cut four times finer: the processes finish
        # within a small unit of each other, not a whole one
        step = UNIT if end - offset > TAIL * UNIT else max(UNIT // 4, 2 * MAX_SCAN)
        if end - offset <= step:
            break
        nominal = offset + step
        window = os.pread(fd, MAX_SCAN + 3, nominal - MAX_SCAN)
        cut = _cut_point(window[:MAX_SCAN])
        if cut == 0:  # no cut point in this window: a longer unit
            offset_next = nominal
            while cut == 0 and end - offset_next > step:
                offset_next += step
                window = os.pread(fd, MAX_SCAN + 3, offset_next - MAX_SCAN)
                cut = _cut_point(window[:MAX_SCAN])
            if cut == 0:
                break
            nominal = offset_next
        at = nominal - MAX_SCAN + cut
        yield offset, at - offset, _width(window[cut]), None
        offset = at
    if end > offset:
        yield offset, end - offset, 0, None


def _init_worker() -> None:
    """A worker leaves Ctrl-C and SIGTERM to its parent, which kills the workers. When the
    parent dies, its pipes close: an idle worker reads their end and exits, a busy one dies of
    SIGPIPE when it hands in its unit, so no process outlives a killed command by more than a
    unit's work."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)


def _work(unit: Unit) -> tuple[Any, ...]:
    """One unit in a worker (the tokenizer and the input it inherited): see `_run`."""
    assert _TOK is not None
    return _run(_TOK, _FD, _START, unit)


def _run(tok: pi.Tokenizer, fd: int, start: int, unit: Unit) -> tuple[Any, ...]:
    """One unit of the input `fd` (-1: the unit carries its bytes) that starts at `start`:
    ("split", head, ids of the middle, tail), ("whole", bytes), ("utf8", offset, reason) for
    the first byte that is not UTF-8, or ("short", offset) when the file ended early."""
    offset, length, width, raw = unit
    if raw is None:
        raw = _read(fd, offset, length + width)
        if len(raw) < length + width:
            return ("short", offset - start + len(raw))
    try:
        text = str(memoryview(raw)[:length], "utf-8")
    except UnicodeDecodeError:
        try:  # the error as the whole input shows it: the next character decides a cut sequence
            raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            return ("utf8", offset - start + exc.start, exc.reason)
        raise
    if offset == start and text.startswith("\ufeff"):
        text = text[1:]
    data = tok.prepare(text)
    n = len(data)
    first = tok.trie.cut(data, 0, min(n, WINDOW))
    if first < 0:
        return ("whole", data)
    last = -1
    for reach in (NEAR, WINDOW):
        last = tok.trie.cut(data, max(first + 1, n - reach), n)
        if last >= 0:
            break
    if last < 0:
        last = first
    ids = tok.trie.match(memoryview(data)[first:last], last - first, tok.itemsize)[0]
    return ("split", data[:first], ids, data[last:])


def _read(fd: int, offset: int, length: int) -> bytes:
    parts = []
    while length > 0:
        part = os.pread(fd, length, offset)
        if not part:
            break
        parts.append(part)
        offset += len(part)
        length -= len(part)
    return b"".join(parts)


class _Seams:
    """The main process's part: the seams between units, and the document's prefix."""

    def __init__(self, tok: pi.Tokenizer, name: str) -> None:
        self.tok = tok
        self.name = name
        self.carry = b""
        self.started = False  # some text: the document gets its prefix (as StreamEncoder)

    def add(self, result: tuple[Any, ...]) -> list[bytes]:
        kind = result[0]
        if kind == "short":  # the file shrank while it was read
            raise OSError(errno.EIO, f"the input ended at byte {result[1]}, before its size")
        if kind == "utf8":
            raise FormatError(
                pi.PI_TEXT_UTF8,
                f"not valid UTF-8 ({result[2]})",
                path=self.name,
                offset=result[1],
            )
        head = result[1]
        if not self.started and (head or kind == "split"):
            self.started = True
            self.carry = self.tok.prefix
        buf = self.carry + head if self.carry else head
        trie, size = self.tok.trie, self.tok.itemsize
        if kind == "whole":  # no cut inside: streamed, as StreamEncoder does
            ids, used = trie.match(buf, len(buf) - self.tok.lookahead, size)
            self.carry = buf[used:]
            return [ids]
        self.carry = result[3]
        return [trie.match(buf, len(buf), size)[0], result[2]]

    def finish(self) -> bytes:
        buf, self.carry = self.carry, b""
        return self.tok.trie.match(buf, len(buf), self.tok.itemsize)[0] if buf else b""


def encode(
    tok: pi.Tokenizer, fp: Any, name: str, jobs: int, *, fd: int | None = None
) -> Generator[tuple[int, bytes], None, None]:
    """(input bytes consumed, ids as bytes of `tok.dtype`) of the one document read from `fp`,
    in order, by `jobs` processes (this one and `jobs - 1` workers): the ids `tok.stream()`
    gives for the whole text. `fd` is the descriptor of `fp` when it is a regular file (at its
    current offset): the workers then read their units themselves. The first item is (0, b"")
    once the workers have their first units: the caller may set up its output meanwhile."""
    global _TOK, _FD, _START
    seams = _Seams(tok, name)
    if fd is not None:
        start = os.lseek(fd, 0, os.SEEK_CUR)
        units: Iterator[Unit] = _file_units(fd, start, max(0, os.fstat(fd).st_size - start))
    else:
        start = 0
        units = _units(fp)
    own = -1 if fd is None else fd
    first = next(units, None)
    second = next(units, None) if first is not None else None
    if second is None:  # one unit at most: here, no fork
        yield 0, b""
        if first is not None:
            result = _run(tok, own, start, first)
            yield first[1], b"".join(seams.add(result))
        yield 0, seams.finish()
        return
    _TOK, _FD, _START = tok, own, start
    try:
        workers = _Workers(jobs - 1)
    finally:
        _TOK, _FD, _START = None, -1, 0
    done = False
    try:
        # Units are dealt in input order: to a worker with room (fewest outstanding first),
        # else to this process. Results are taken in input order; while the next one is a
        # worker's that has not come yet, this process tokenizes one of its own units (out of
        # order, kept until its turn): neither kind of process waits while the other has work,
        # whatever the units cost. A process has at most `depth` units outstanding: a worker
        # two when a task is a few bytes (a file: it fits in the pipe whatever the worker is
        # doing), one when it carries the unit's bytes (a pipe's input: sent only once the
        # worker's last result is read, so neither process waits on a write to the other).
        depth = 2 if fd is not None else 1
        outstanding = [0] * jobs  # units dealt and not yet yielded, by process (0: this one)
        window: deque[list[Any]] = deque()  # [process, unit, result (None: not yet)]
        pending = _chain(first, second, units)
        held: Unit | None = None

        def fill() -> None:
            nonlocal held
            while True:
                if held is None:
                    held = next(pending, None)
                    if held is None:
                        return
                who = min(range(1, jobs), key=outstanding.__getitem__)
                if outstanding[who] >= depth:
                    who = 0
                    if outstanding[0] >= depth:
                        return
                else:
                    workers.send(who - 1, held)
                outstanding[who] += 1
                window.append([who, held, None])
                held = None

        fill()
        yield 0, b""
        while window:
            entry = window[0]
            who, unit = entry[0], entry[1]
            if who == 0 and entry[2] is None:
                entry[2] = _run(tok, own, start, unit)
            elif who:
                mine = next((e for e in window if e[0] == 0 and e[2] is None), None)
                if mine is not None and not workers.ready(who - 1):
                    mine[2] = _run(tok, own, start, mine[1])
                    continue
                entry[2] = workers.receive(who - 1)
            window.popleft()
            outstanding[who] -= 1
            fill()
            length = unit[1]
            for ids in seams.add(entry[2]):
                yield length, ids
                length = 0
        yield 0, seams.finish()
        done = True
    finally:
        workers.close(kill=not done)


FRAME = struct.Struct("<Q")
_STOP = {signal.SIGINT, signal.SIGTERM}


class _Workers:
    """`jobs` forked processes, each with a pipe for its tasks and one for its results;
    messages are `marshal` data behind their length. No lock is shared with them: on any
    failure the main process kills them and reaps them (multiprocessing's Pool can hang in
    `terminate()` while an idle worker holds the task queue's lock)."""

    def __init__(self, jobs: int) -> None:
        self.procs: list[tuple[int, Any, Any]] = []  # (pid, task writer, result reader)
        try:
            for _ in range(jobs):
                task_r, task_w = os.pipe()
                res_r, res_w = os.pipe()
                # Ctrl-C and SIGTERM wait until the new worker is in `procs` (so the handler's
                # exception finds it there, kills it and reaps it)
                mask = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP)
                try:
                    pid = os.fork()
                    if pid == 0:  # pragma: no cover - the worker (coverage does not follow forks)
                        code = 0
                        try:
                            os.close(task_w)
                            os.close(res_r)
                            for _pid, writer, reader in self.procs:  # other workers' pipes
                                writer.close()
                                reader.close()
                            _init_worker()
                            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
                            _serve(task_r, res_w)
                        except BaseException:
                            code = 1
                        finally:
                            os._exit(code)
                    os.close(task_r)
                    os.close(res_w)
                    writer = open(task_w, "wb", buffering=0)  # noqa: SIM115 - closed in close()
                    reader = open(res_r, "rb", buffering=0)  # noqa: SIM115
                    self.procs.append((pid, writer, reader))
                finally:
                    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
                _widen(res_r)
        except BaseException:
            self.close(kill=True)
            raise

    def send(self, worker: int, unit: Unit) -> None:
        _write_frame(self.procs[worker][1], marshal.dumps(unit))

    def ready(self, worker: int) -> bool:
        """Whether the worker's result (or its end) can be read without waiting."""
        import select

        return bool(select.select([self.procs[worker][2]], [], [], 0)[0])

    def receive(self, worker: int) -> tuple[Any, ...]:
        data = _read_frame(self.procs[worker][2])
        if data is None:
            raise RuntimeError(f"encoding worker {worker + 1} ended without its result")
        result = marshal.loads(data)
        if result[0] == "error":
            raise RuntimeError(f"encoding worker {worker + 1} failed: {result[1]}")
        return tuple(result)

    def close(self, *, kill: bool) -> None:
        for pid, writer, _reader in self.procs:
            writer.close()  # an idle worker reads the end of its tasks and exits
            if kill:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        for pid, _writer, reader in self.procs:
            reader.close()
            with contextlib.suppress(OSError):
                os.waitpid(pid, 0)
        self.procs = []


def _widen(fd: int) -> None:
    """Make a result pipe hold a unit's ids (Linux: up to 1 MiB, where allowed), so a worker
    writes its result and goes on to its next unit while the main process tokenizes one."""
    try:
        import fcntl

        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), RESULT_PIPE)
    except (OSError, ImportError):
        pass  # the default size: the worker waits for the main process to read


RESULT_PIPE = 1 << 20


def _serve(task_r: int, res_w: int) -> None:  # pragma: no cover - runs in the workers
    tasks = open(task_r, "rb", buffering=0)  # noqa: SIM115 - the worker exits with it
    results = open(res_w, "wb", buffering=0)  # noqa: SIM115
    while True:
        data = _read_frame(tasks)
        if data is None:
            return
        try:
            result: tuple[Any, ...] = _work(marshal.loads(data))
        except Exception as exc:
            result = ("error", f"{type(exc).__name__}: {exc}")
        _write_frame(results, marshal.dumps(result))


def _write_frame(out: Any, payload: bytes) -> None:
    view = memoryview(FRAME.pack(len(payload)) + payload)
    while view:
        n = out.write(view)
        view = view[n:]


def _read_frame(inp: Any) -> bytes | None:
    head = _read_exactly(inp, FRAME.size)
    if head is None:
        return None
    return _read_exactly(inp, FRAME.unpack(head)[0])


def _read_exactly(inp: Any, size: int) -> bytes | None:
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = inp.readinto(view[got:])
        if not n:
            return None
        got += n
    return bytes(buf)


def _chain(a: Any, b: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield a
    yield b
    yield from rest
