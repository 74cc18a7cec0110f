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

Workers are forked (they inherit the loaded tokenizer, as `ingest docs --jobs` workers do); a
window of `2 * jobs + 2` units keeps memory flat. An input of one unit or less is encoded in
the calling process (no fork for a one-line input).
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
from collections import deque
from collections.abc import Iterator
from typing import Any

from matrixctl.errors import FormatError
from matrixctl.tokenizers import pi

UNIT = 1 << 20  # raw bytes per work unit
WINDOW = 1 << 16  # how far from each end of a unit a cut is looked for
NEAR = 1 << 10  # first, how far from the end
MAX_SCAN = 1 << 16  # how far back from a unit's end a cut point in the raw bytes is looked for

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
    while end - offset > UNIT:
        nominal = offset + UNIT
        window = os.pread(fd, MAX_SCAN + 3, nominal - MAX_SCAN)
        cut = _cut_point(window[:MAX_SCAN])
        if cut == 0:  # no cut point in this window: a longer unit
            offset_next = nominal
            while cut == 0 and end - offset_next > UNIT:
                offset_next += UNIT
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


def _init_worker(parent: int) -> None:
    """A worker leaves Ctrl-C and SIGTERM to its parent, which ends the pool, and ends when
    the parent dies (Linux: PR_SET_PDEATHSIG), so a killed command leaves no process behind."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:
        os._exit(0)


def _work(unit: Unit) -> tuple[Any, ...]:
    """One unit: ("split", head, ids of the middle, tail), ("whole", bytes) or ("utf8", offset,
    reason) for the first byte that is not UTF-8."""
    tok = _TOK
    assert tok is not None
    offset, length, width, raw = unit
    if raw is None:
        raw = _read(_FD, offset, length + width)
        if len(raw) < length + width:
            return ("short", offset - _START + len(raw))
    try:
        text = raw.decode("utf-8")  # with the next character, which decides a cut sequence
    except UnicodeDecodeError as exc:
        return ("utf8", offset - _START + exc.start, exc.reason)
    if width:
        text = text[:-1]
    if offset == _START and text.startswith("\ufeff"):
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
) -> Iterator[tuple[int, bytes]]:
    """(input bytes consumed, ids as bytes of `tok.dtype`) of the one document read from `fp`,
    in order, by `jobs` processes: the ids `tok.stream()` gives for the whole text. `fd` is the
    descriptor of `fp` when it is a regular file (at its current offset): the workers then read
    their units themselves."""
    global _TOK, _FD, _START
    seams = _Seams(tok, name)
    if fd is not None:
        start = os.lseek(fd, 0, os.SEEK_CUR)
        units: Iterator[Unit] = _file_units(fd, start, max(0, os.fstat(fd).st_size - start))
    else:
        start = 0
        units = _units(fp)
    first = next(units, None)
    second = next(units, None) if first is not None else None
    _TOK, _FD, _START = tok, -1 if fd is None else fd, start
    try:
        if second is None:  # one unit at most: here, no fork
            if first is not None:
                result = _work(first)
                yield first[1], b"".join(seams.add(result))
            yield 0, seams.finish()
            return
        import multiprocessing

        pool = multiprocessing.get_context("fork").Pool(
            jobs, initializer=_init_worker, initargs=(os.getpid(),)
        )
    finally:
        _TOK, _FD, _START = None, -1, 0
    done = False
    try:
        window: deque[Any] = deque()
        pending = _chain(first, second, units)
        for unit in pending:
            window.append((unit[1], pool.apply_async(_work, (unit,))))
            if len(window) >= 2 * jobs + 2:
                break
        while window:
            length, future = window.popleft()
            result = future.get()
            unit = next(pending, None)
            if unit is not None:
                window.append((unit[1], pool.apply_async(_work, (unit,))))
            for ids in seams.add(result):
                yield length, ids
                length = 0
        yield 0, seams.finish()
        done = True
    finally:
        if done:
            pool.close()
        else:
            pool.terminate()
        pool.join()


def _chain(a: Any, b: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield a
    yield b
    yield from rest
