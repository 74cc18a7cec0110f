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

`jobs` forked workers tokenize the units (they inherit the loaded tokenizer, as `ingest docs
--jobs` workers do, and talk to the main process through pipes: `_Workers`); the main process
deals the units, takes the results as they come, whatever their order, tokenizes the seams and
yields the ids in input order. It tokenizes no unit of its own: while it did (one worker less),
a worker that had done its units waited for the main process to finish one before it got more
or could hand in its result, and the main process's seams and output writes held back the
units it had taken; now a worker always has its next unit and room for its result, and the
main process's short steps (microseconds to a millisecond) take turns with the workers on the
cores. A worker gets the next unit when it has room (at most `DEPTH` units outstanding for a
file, one when the unit carries its bytes); at most `WINDOW_UNITS` per worker are dealt and
not yet yielded, which keeps memory flat. An input of one unit or less is encoded in the
calling process (no fork for a one-line input).
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
DEPTH = 3  # units a worker holds at once when a unit is a few bytes (a file)
WINDOW_UNITS = 6  # units per worker dealt and not yet yielded (results kept until their turn)


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


def encode(tok: pi.Tokenizer, fp: Any, name: str, jobs: int, *, fd: int | None = None) -> Encoding:
    """(input bytes consumed, ids in `tok.dtype`) of the one document read from `fp`, in order,
    by `jobs` worker processes: the ids `tok.stream()` gives for the whole text. `fd` is the
    descriptor of `fp` when it is a regular file (at its current offset): the workers then read
    their units themselves. The first item is (0, b"") once the workers have their first units:
    the caller may set up its output meanwhile. The ids are bytes or a memoryview that is valid
    until the next item is asked for (a worker's ids are read into a buffer used again). The
    caller closes the result (`Encoding.close`)."""
    return Encoding(tok, fp, name, jobs, fd)


class Encoding:
    """The items of `encode`, and its workers. After the last item the workers are told to
    exit (their task pipes closed) and not waited for: `close()` reaps them (and stops them
    first when the items were not all taken), so a caller that commits its output before it
    closes this overlaps their exit (a millisecond or more each) with the commit's fsync."""

    def __init__(self, tok: pi.Tokenizer, fp: Any, name: str, jobs: int, fd: int | None) -> None:
        self._workers: _Workers | None = None
        self._done = False
        self._items = self._encode(tok, fp, name, jobs, fd)

    def __iter__(self) -> Encoding:
        return self

    def __next__(self) -> tuple[int, Any]:
        return next(self._items)

    def close(self) -> None:
        self._items.close()
        if self._workers is not None:
            self._workers.close(kill=not self._done)

    def _encode(
        self, tok: pi.Tokenizer, fp: Any, name: str, jobs: int, fd: int | None
    ) -> Generator[tuple[int, Any], None, None]:
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
        workers = self._workers = _Workers(tok, own, start)
        try:
            # A worker holds up to `depth` units: several when a task is a few bytes (a file: it
            # fits in the pipe whatever the worker is doing), one when it carries the unit's bytes
            # (a pipe's input: sent only once the worker's last result is read, so neither process
            # waits on a write to the other). Results are read as they come and kept until their
            # turn, so a worker never waits for the main process to want its result.
            depth = DEPTH if fd is not None else 1
            window: deque[_Entry] = deque()  # dealt and not yet yielded, in input order
            owed: list[deque[_Entry]] = []  # by worker: its entries without a result, in order
            pending = _chain(first, second, units)
            held: Unit | None = None

            def more() -> bool:
                """Whether a unit is left to deal (read ahead into `held`)."""
                nonlocal held
                if held is None:
                    held = next(pending, None)
                return held is not None

            def deal(room: int = depth) -> None:
                """Units to the workers with the fewest outstanding, up to `room` each."""
                nonlocal held
                while len(window) < WINDOW_UNITS * len(owed) and more():
                    assert held is not None
                    who = min(range(len(owed)), key=lambda w: len(owed[w]))
                    if len(owed[who]) >= room:
                        return
                    workers.send(who, held)
                    entry = _Entry(held)
                    owed[who].append(entry)
                    window.append(entry)
                    held = None

            # A worker a unit as it is forked (it starts on it while the next is forked), no
            # more workers than units; then every worker its `depth`
            while len(owed) < jobs and more():
                workers.fork()
                owed.append(deque())
                deal(1)
            deal()
            yield 0, b""
            while window:
                entry = window[0]
                while entry.result is None:
                    for who in workers.wait([w for w, due in enumerate(owed) if due]):
                        got = owed[who].popleft()
                        got.result, got.buffer = workers.receive(who)
                    deal()
                window.popleft()
                deal()
                length = entry.unit[1]
                for ids in seams.add(entry.result):
                    yield length, ids
                    length = 0
                workers.reuse(entry.buffer)
            workers.release()  # they exit while the caller finishes its output
            yield 0, seams.finish()
            self._done = True
        except BaseException:
            workers.close(kill=True)
            raise


class _Entry:
    """A unit dealt to a worker, and its result once read (`buffer`: where its ids are)."""

    __slots__ = ("buffer", "result", "unit")

    def __init__(self, unit: Unit) -> None:
        self.unit = unit
        self.result: tuple[Any, ...] | None = None
        self.buffer: bytearray | None = None


FRAME = struct.Struct("<Q")
_STOP = {signal.SIGINT, signal.SIGTERM}


class _Workers:
    """Forked worker processes (`fork` starts one), each with a pipe for its tasks and one for
    its results. A task is `marshal` data behind its length; a result is a header (the lengths
    of its two parts), `marshal` data of all but the ids, and the ids' raw bytes, which the main
    process reads straight into a buffer it uses again (`reuse`): no copy of the ids in
    `marshal` on either side, no fresh memory (page faults) per result. No lock is shared with
    the workers: on any failure the main process kills them and reaps them
    (multiprocessing's Pool can hang in `terminate()` while an idle worker holds the task
    queue's lock)."""

    def __init__(self, tok: pi.Tokenizer, fd: int, start: int) -> None:
        self.tok = tok
        self.fd = fd  # the input the workers read their units from (a regular file), else -1
        self.start = start  # the input's first byte (a byte-order mark there is dropped)
        self.procs: list[tuple[int, Any, Any]] = []  # (pid, task writer, result reader)
        self.spare: list[bytearray] = []  # buffers of ids read before, free again

    def fork(self) -> None:
        """Fork one more worker."""
        try:
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
                        _serve(self.tok, self.fd, self.start, task_r, res_w)
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
        try:
            _write_frame(self.procs[worker][1], marshal.dumps(unit))
        except BrokenPipeError:  # not our stdout's reader gone: a worker that died
            raise RuntimeError(f"encoding worker {worker + 1} ended before its units") from None

    def wait(self, workers: list[int]) -> list[int]:
        """Those of `workers` whose result (or end) can be read, once there is one."""
        import select

        readers = {self.procs[w][2].fileno(): w for w in workers}
        return [readers[fd] for fd in select.select(list(readers), [], [])[0]]

    def receive(self, worker: int) -> tuple[tuple[Any, ...], bytearray | None]:
        """The worker's next result, and the buffer that holds its ids (None: no ids)."""
        reader = self.procs[worker][2]
        head = _read_exactly(reader, RESULT.size)
        data = _read_exactly(reader, RESULT.unpack(head)[0]) if head is not None else None
        if head is None or data is None:
            raise RuntimeError(f"encoding worker {worker + 1} ended without its result")
        result = marshal.loads(data)
        if result[0] == "error":
            raise RuntimeError(f"encoding worker {worker + 1} failed: {result[1]}")
        size = RESULT.unpack(head)[1]
        if result[0] != "split":
            return tuple(result), None
        buf = next((b for b in self.spare if len(b) >= size), None)
        if buf is None:
            buf = bytearray(size + size // 4)  # room for a later, larger result
        else:
            self.spare.remove(buf)
        view = memoryview(buf)[:size]
        if _read_into(reader, view) < size:
            raise RuntimeError(f"encoding worker {worker + 1} ended without its result")
        return (result[0], result[1], view, result[2]), buf

    def reuse(self, buf: bytearray | None) -> None:
        """`buf` (from `receive`) holds nothing needed any more."""
        if buf is not None and len(self.spare) < 2 * WINDOW_UNITS:
            self.spare.append(buf)

    def release(self) -> None:
        """Close the task pipes: an idle worker reads the end of its tasks and exits."""
        for _pid, writer, _reader in self.procs:
            writer.close()

    def close(self, *, kill: bool) -> None:
        """Stop the workers (at once when `kill`, else once their tasks are done) and reap
        them."""
        self.release()
        for pid, _writer, _reader in self.procs:
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
    writes its result and goes on to its next unit while the main process is busy writing."""
    try:
        import fcntl

        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), RESULT_PIPE)
    except (OSError, ImportError):
        pass  # the default size: the worker waits for the main process to read


RESULT_PIPE = 1 << 20


RESULT = struct.Struct("<QQ")  # a result's header: bytes of its marshal part, of its ids


def _serve(  # pragma: no cover - runs in the workers
    tok: pi.Tokenizer, fd: int, start: int, task_r: int, res_w: int
) -> None:
    tasks = open(task_r, "rb", buffering=0)  # noqa: SIM115 - the worker exits with it
    while True:
        data = _read_frame(tasks)
        if data is None:
            return
        ids = b""
        try:
            result: tuple[Any, ...] = _run(tok, fd, start, marshal.loads(data))
            if result[0] == "split":  # the ids go raw, after the rest
                ids = result[2]
                result = (result[0], result[1], result[3])
        except Exception as exc:
            result = ("error", f"{type(exc).__name__}: {exc}")
        meta = marshal.dumps(result)
        _write_all(res_w, [RESULT.pack(len(meta), len(ids)), meta, ids])


def _write_all(fd: int, parts: list[bytes]) -> None:
    """Write `parts` in order (one system call when the pipe takes them all)."""
    views = [memoryview(p) for p in parts if p]
    while views:
        n = os.writev(fd, views)
        while views and n >= len(views[0]):
            n -= len(views[0])
            views.pop(0)
        if n:
            views[0] = views[0][n:]


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
    if _read_into(inp, memoryview(buf)) < size:
        return None
    return bytes(buf)


def _read_into(inp: Any, view: memoryview) -> int:
    """Fill `view` from `inp`; the bytes read (fewer only at the end of the input)."""
    got = 0
    while got < len(view):
        n = inp.readinto(view[got:])
        if not n:
            break
        got += n
    return got


def _chain(a: Any, b: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield a
    yield b
    yield from rest
