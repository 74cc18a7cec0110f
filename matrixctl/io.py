"""Input and output helpers shared by every codec and command.

- `-` means stdin for inputs and stdout for outputs.
- `read_exact` loops on short reads (pipes, sockets) and names what it was reading when the input
  ends early.
- `Source` maps a regular file read-only (zero-copy numpy views) and spools a pipe to a temporary
  file first, so every reader sees one random-access buffer with bounded memory.
- `atomic_output` writes to a temporary file in the destination folder, fsyncs it and renames it
  over the destination: an output appears whole or not at all, an existing file is never
  damaged, and an output path that is also an input path is safe (the input's mapping keeps the
  old inode alive until it is closed).
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import re
import signal
import stat
import sys
import weakref
from collections.abc import Callable, Iterator
from typing import IO, Any, BinaryIO, Protocol

from matrixctl import codes
from matrixctl.errors import (
    FormatError,
    InputError,
    MatrixError,
    OutputError,
    UsageError,
    from_os_error,
)

STDIO = "-"
COPY_CHUNK = 1 << 20

IO_CHANGED = codes.define(
    "IO_CHANGED",
    "An input was truncated or rewritten while it was read; nothing was written. Rerun once "
    "the file is stable.",
    group="general",
)
_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class Readable(Protocol):
    def read(self, n: int = -1, /) -> bytes: ...


def display_name(path: str) -> str:
    return "<stdin>" if path == STDIO else path


def read_exact(fp: Readable, n: int, what: str, *, offset: int | None = None) -> bytes:
    """Read exactly `n` bytes or raise TRUNCATED naming `what` and how many bytes arrived.

    `read(n)` on a pipe may return fewer bytes than asked for without being at the end, so this
    loops until it has `n` bytes or `read` returns nothing.
    """
    if n == 0:
        return b""
    first = fp.read(n)
    if len(first) == n:
        return first
    parts = [first]
    got = len(first)
    while got < n:
        chunk = fp.read(n - got)
        if not chunk:
            raise FormatError(
                codes.TRUNCATED,
                f"input ends while reading {what}: expected {n} bytes, got {got}",
                offset=None if offset is None else offset + got,
                field=what,
            )
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def open_input_stream(path: str) -> BinaryIO:
    """Open an input for sequential reading; `-` is stdin (not closed by the caller's `with`)."""
    if path == STDIO:
        if _is_regular(sys.stdin.buffer):
            return _NoClose(sys.stdin.buffer)  # type: ignore[return-value]
        return BoundedStream(sys.stdin.buffer, path, spool_limit())  # type: ignore[return-value]
    try:
        if os.path.isdir(path):
            raise InputError(codes.IO_IS_DIR, "is a folder, a file was expected", path=path)
        fp = open(path, "rb")  # noqa: SIM115 - returned to the caller
        if not _is_regular(fp):
            return BoundedStream(fp, path, spool_limit())  # type: ignore[return-value]
        return fp
    except OSError as exc:
        raise from_os_error(exc, path) from None


def _is_regular(fp: Any) -> bool:
    try:
        return stat.S_ISREG(os.fstat(fp.fileno()).st_mode)
    except (OSError, ValueError, AttributeError):
        return False


class _NoClose:
    """Wrap stdin so `with open_input_stream('-')` does not close the process's stdin."""

    def __init__(self, fp: BinaryIO) -> None:
        self._fp = fp

    def read(self, n: int = -1) -> bytes:
        return self._fp.read(n)

    def readinto(self, b: bytearray | memoryview) -> int:
        return int(self._fp.readinto(b))  # type: ignore[attr-defined]

    def readline(self, limit: int = -1) -> bytes:
        return self._fp.readline(limit)

    def isatty(self) -> bool:
        return self._fp.isatty()

    def fileno(self) -> int:
        return self._fp.fileno()

    def __enter__(self) -> _NoClose:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def close(self) -> None:
        return None


# Bounded spooling ---------------------------------------------------------------------------

SPOOL_LIMIT = codes.define(
    "SPOOL_LIMIT",
    "stdin or a non-seekable input (a pipe, a device such as /dev/zero) is longer than the "
    "spool limit (--spool-limit, MATRIXCTL_SPOOL_LIMIT; default 4G).",
    group="general",
)
SPOOL_NO_SPACE = codes.define(
    "SPOOL_NO_SPACE",
    "Spooling stdin or a non-seekable input would leave less than the reserve of free space "
    "in the temporary folder.",
    group="general",
)
ENV_SPOOL_LIMIT = "MATRIXCTL_SPOOL_LIMIT"
DEFAULT_SPOOL_LIMIT = 4 << 30
SPOOL_RESERVE = 256 << 20  # free space left in the temporary folder, at least
_spool_limit: int | None = None
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str, what: str) -> int:
    """`4G`, `512M`, `100k`, `1000` (bytes; binary units) -> bytes."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    num, unit = (t[:-1], t[-1]) if t and t[-1] in _UNITS else (t, "")
    if not num.isdigit():
        raise UsageError(
            f"{what} {text!r} is not a size",
            hint="a whole number of bytes with an optional K, M, G or T suffix, e.g. 512M",
        )
    return int(num) * _UNITS[unit]


def set_spool_limit(text: str | None) -> None:
    """The command line's --spool-limit (None: the environment variable or the default)."""
    global _spool_limit
    _spool_limit = None if text is None else parse_size(text, "--spool-limit")


def spool_limit() -> int:
    if _spool_limit is not None:
        return _spool_limit
    env = os.environ.get(ENV_SPOOL_LIMIT, "")
    return parse_size(env, ENV_SPOOL_LIMIT) if env.strip() else DEFAULT_SPOOL_LIMIT


def _free_space(fd: int) -> int | None:
    try:
        st = os.fstatvfs(fd)
    except (OSError, AttributeError):
        return None
    return st.f_bavail * st.f_frsize


class BoundedStream:
    """stdin or a non-regular file read sequentially, refused (SPOOL_LIMIT) past the limit, so
    `cat /dev/zero | matrixctl ...` ends with one error line instead of running forever."""

    def __init__(self, fp: Any, path: str, limit: int) -> None:
        self._fp = fp
        self._path = path
        self._limit = limit
        self._got = 0

    def _count(self, n: int) -> None:
        self._got += n
        if self._got > self._limit:
            raise InputError(
                SPOOL_LIMIT,
                f"longer than the spool limit of {self._limit:,} bytes for stdin and "
                "non-seekable inputs",
                path=display_name(self._path),
                hint=f"raise it (the command's spool limit option, or {ENV_SPOOL_LIMIT}=SIZE), "
                "or pass a regular file",
            )

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = self._limit + 1 - self._got
        data: bytes = self._fp.read(n)
        self._count(len(data))
        return data

    def readinto(self, b: Any) -> int:
        got = int(self._fp.readinto(b))
        self._count(got)
        return got

    def readline(self, limit: int = -1) -> bytes:
        room = self._limit + 1 - self._got
        data: bytes = self._fp.readline(room if limit is None or limit < 0 else min(limit, room))
        self._count(len(data))
        return data

    def isatty(self) -> bool:
        return bool(self._fp.isatty())

    def fileno(self) -> int:
        return int(self._fp.fileno())

    def __enter__(self) -> BoundedStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._path != STDIO:
            self._fp.close()


class Source:
    """A whole input as one read-only buffer: an mmap of a regular file, or a spooled pipe.

    `buf` supports slicing and the buffer protocol (numpy.frombuffer). Use as a context manager;
    views handed out must not outlive it.
    """

    def __init__(
        self,
        path: str,
        buf: mmap.mmap | bytes,
        size: int,
        fp: IO[bytes] | None,
        st: os.stat_result | None = None,
    ) -> None:
        """`st`: the mapped file's status taken when it was mapped (its size and time are the
        stamp `changed` compares with); read here when not given."""
        self.path = path
        self.name = display_name(path)
        self.buf = buf
        self.size = size
        self._fp = fp
        self._stamp: tuple[int, int] | None = None
        if isinstance(buf, mmap.mmap) and fp is not None:
            if st is None:
                st = os.fstat(fp.fileno())
            self._stamp = (st.st_size, st.st_mtime_ns)
            _MAPPED.add(self)
            _guard_sigbus()

    def changed(self) -> str | None:
        """Why the mapped file is no longer what was mapped (truncated, extended, rewritten in
        place), or None. A file renamed over the path is not a change: the mapping holds the
        old inode, whole."""
        if self._stamp is None or self._fp is None:
            return None
        try:
            st = os.fstat(self._fp.fileno())
        except (OSError, ValueError):
            return None
        size, mtime = self._stamp
        if st.st_size < size:
            return f"truncated from {size:,} to {st.st_size:,} bytes while it was read"
        if st.st_size > size:
            return f"extended from {size:,} to {st.st_size:,} bytes while it was read"
        if st.st_mtime_ns != mtime:
            return "rewritten in place while it was read"
        return None

    def check_unchanged(self) -> None:
        """Raise IO_CHANGED naming the file when it changed since it was mapped."""
        why = self.changed()
        if why is not None:
            raise InputError(IO_CHANGED, why, path=self.name)

    @classmethod
    def open(cls, path: str) -> Source:
        if path == STDIO:
            return cls._from_fd_or_spool(path)
        try:
            # Unbuffered: the file is mapped, never read through a buffer (and a buffered
            # reader would cost an ioctl, a seek and a stat more per open).
            raw: IO[bytes] = open(path, "rb", buffering=0)  # noqa: SIM115 - owned by the Source
        except IsADirectoryError:
            raise InputError(
                codes.IO_IS_DIR, "is a folder, a file was expected", path=path
            ) from None
        except OSError as exc:
            raise from_os_error(exc, path) from None
        try:
            st = os.fstat(raw.fileno())
            if not stat.S_ISREG(st.st_mode):
                # A FIFO or character device: read it through like a pipe.
                with raw:
                    return cls._spool(path, raw)
        except MatrixError:
            raw.close()
            raise
        except OSError as exc:
            raw.close()
            raise from_os_error(exc, path) from None
        return cls._map(path, raw, st)

    @classmethod
    def _map(cls, path: str, fp: IO[bytes], st: os.stat_result | None = None) -> Source:
        """`st`: the file's status, when the caller has just taken it (`os.fstat`)."""
        if st is None:
            st = os.fstat(fp.fileno())
        size = st.st_size
        if size == 0:
            return cls(path, b"", 0, fp)
        try:
            buf = mmap.mmap(fp.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError):
            # Some file systems refuse mmap; fall back to reading (bounded by the file's size).
            fp.seek(0)
            data = fp.read()
            return cls(path, data, len(data), fp)
        return cls(path, buf, size, fp, st)

    @classmethod
    def _from_fd_or_spool(cls, path: str) -> Source:
        stdin = sys.stdin.buffer
        try:
            st = os.fstat(stdin.fileno())
        except (OSError, ValueError):
            return cls._spool(path, stdin)
        if stat.S_ISREG(st.st_mode):
            # `matrixctl verify - < file`: map the file behind stdin directly.
            fp = os.fdopen(os.dup(stdin.fileno()), "rb")
            return cls._map(path, fp)
        return cls._spool(path, stdin)

    @classmethod
    def _spool(cls, path: str, stream: Readable) -> Source:
        import tempfile

        tmp = tempfile.TemporaryFile(prefix="matrixctl-stdin-")  # noqa: SIM115 - owned by Source
        limit = spool_limit()
        got = 0
        next_check = 0
        try:
            while True:
                chunk = stream.read(COPY_CHUNK)
                if not chunk:
                    break
                got += len(chunk)
                if got > limit:
                    raise InputError(
                        SPOOL_LIMIT,
                        f"longer than the spool limit of {limit:,} bytes for stdin and "
                        "non-seekable inputs; spooling stopped",
                        path=display_name(path),
                        hint="raise it (the command's spool limit option, or "
                        f"{ENV_SPOOL_LIMIT}=SIZE), or pass a regular file",
                    )
                if got >= next_check:  # every 64 MiB
                    _check_spool_space(tmp.fileno(), path, got)
                    next_check = got + (64 << 20)
                tmp.write(chunk)
            tmp.flush()
        except MatrixError:
            tmp.close()
            raise
        except OSError as exc:
            tmp.close()
            raise from_os_error(exc, path) from None
        return cls._map(path, tmp)

    def head(self, n: int) -> bytes:
        return bytes(self.buf[:n])

    def close(self) -> None:
        _MAPPED.discard(self)
        if isinstance(self.buf, mmap.mmap):
            # A numpy view still alive keeps the mapping until it goes (a suppress() would
            # cost two calls of its own on every close).
            try:  # noqa: SIM105
                self.buf.close()
            except BufferError:
                pass
        if self._fp is not None:
            self._fp.close()
            self._fp = None

    def __enter__(self) -> Source:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# Inputs that change underneath ------------------------------------------------------------

_MAPPED: weakref.WeakSet[Source] = weakref.WeakSet()
_LIVE_TEMPS: set[str] = set()
_SIGBUS_INSTALLED = False
_SIGBUS_HANDLER: Any = None


def check_inputs_unchanged() -> None:
    """Raise IO_CHANGED when a mapped input changed since it was mapped. Every atomic output
    calls it before its rename, so no output built from a changing input appears."""
    for src in list(_MAPPED):
        src.check_unchanged()


def changed_input() -> MatrixError | None:
    """The IO_CHANGED error of the first mapped input that changed, or None."""
    try:
        check_inputs_unchanged()
    except MatrixError as err:
        return err
    return None


def _on_sigbus(signum: int) -> None:  # pragma: no cover - runs in a subprocess test
    """Last resort for a mapped input truncated underneath: a read of a page past the new end
    raises SIGBUS, which Python cannot turn into an exception. Name the file, remove this
    process's temporary outputs, exit 2; never the bare "Bus error" (exit 135)."""
    name = "an input"
    why = "truncated while it was read"
    for src in list(_MAPPED):
        reason = src.changed()
        if reason is not None:
            name, why = src.name, reason
            break
    line = f"matrixctl: error[{IO_CHANGED}]: {name}: {why}; nothing was written\n"
    with contextlib.suppress(OSError):
        os.write(2, line.encode("utf-8", "replace"))
    for tmp in list(_LIVE_TEMPS):
        with contextlib.suppress(OSError):
            if os.path.isdir(tmp):
                rmtree(tmp, ignore_errors=True)
            else:
                os.unlink(tmp)
    os._exit(2)


def _guard_sigbus() -> None:
    """Install the SIGBUS handler once, when the first file is mapped (ctypes: the handler
    must run on the faulting thread, before the faulting access is retried).
    MATRIXCTL_NO_SIGBUS_GUARD=1 leaves the default (the process dies with "Bus error")."""
    global _SIGBUS_INSTALLED, _SIGBUS_HANDLER
    if _SIGBUS_INSTALLED or not hasattr(signal, "SIGBUS"):
        return
    _SIGBUS_INSTALLED = True
    if os.environ.get("MATRIXCTL_NO_SIGBUS_GUARD", "") not in ("", "0"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        handler_type = ctypes.CFUNCTYPE(None, ctypes.c_int)
        _SIGBUS_HANDLER = handler_type(_on_sigbus)  # kept alive for the process's life
        libc.signal.restype = ctypes.c_void_p
        libc.signal.argtypes = (ctypes.c_int, handler_type)
        libc.signal(int(signal.SIGBUS), _SIGBUS_HANDLER)
    except (OSError, AttributeError, TypeError):  # no libc symbol: keep the default
        _SIGBUS_HANDLER = None


def rmtree(path: str, ignore_errors: bool = False) -> None:
    """`shutil.rmtree`, importing shutil (with bz2 and lzma: about 1.5 ms) only when a folder
    is removed: an atomic output of one file never needs it."""
    import shutil

    shutil.rmtree(path, ignore_errors=ignore_errors)


def register_temp(path: str) -> None:
    """A temporary output of this process, removed by the SIGBUS handler."""
    _LIVE_TEMPS.add(path)


def unregister_temp(path: str) -> None:
    _LIVE_TEMPS.discard(path)


def _check_spool_space(fd: int, path: str, got: int) -> None:
    """Refuse to spool on when the temporary folder's free space falls under the reserve."""
    free = _free_space(fd)
    if free is not None and free < SPOOL_RESERVE + (64 << 20):
        raise InputError(
            SPOOL_NO_SPACE,
            f"spooling stopped after {got:,} bytes: {free:,} bytes left in the temporary "
            f"folder, under the reserve of {SPOOL_RESERVE:,}",
            path=display_name(path),
            hint="pass a regular file instead, or point TMPDIR at a folder with room",
        )


def mapped_fd(buf: Any) -> int | None:
    """The file descriptor of the mapped input whose mapping is `buf` (None for anything else:
    a spooled pipe, bytes, a closed input)."""
    if not isinstance(buf, mmap.mmap):
        return None
    for src in list(_MAPPED):
        if src.buf is buf and src._fp is not None:
            try:
                return src._fp.fileno()
            except (OSError, ValueError):
                return None
    return None


_RANGE_ERRORS = (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EBADF)
WRITEBACK_STEP = 16 << 20  # start writing a durable output out every this many bytes
_UNFLUSHED: dict[int, int] = {}  # output descriptor -> bytes written since its last start
_SYNC_FILE_RANGE: Any = None  # libc's sync_file_range, False where there is none


def started_writeback(fd: int, nbytes: int) -> None:
    """`nbytes` more were written to the output `fd`: every WRITEBACK_STEP bytes, ask the kernel
    to start writing the file's dirty pages out (sync_file_range, SYNC_FILE_RANGE_WRITE: it does
    not wait for them). The fsync before the atomic rename then waits for the last step only,
    instead of starting the whole write-out when the copy is done (ext4 gives `cp` over an
    existing file the same head start when it closes it). Only for durable outputs (no
    MATRIXCTL_NO_FSYNC); without libc's call nothing happens."""
    global _SYNC_FILE_RANGE
    pending = _UNFLUSHED.get(fd, 0) + nbytes
    if pending < WRITEBACK_STEP:
        _UNFLUSHED[fd] = pending
        return
    _UNFLUSHED[fd] = 0
    if _SYNC_FILE_RANGE is None:
        _SYNC_FILE_RANGE = False
        if durable() and sys.platform.startswith("linux"):
            try:
                import ctypes

                fn = ctypes.CDLL(None, use_errno=True).sync_file_range
                fn.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
                fn.restype = ctypes.c_int
                _SYNC_FILE_RANGE = fn
            except (OSError, AttributeError):
                pass
    if _SYNC_FILE_RANGE:
        _SYNC_FILE_RANGE(fd, 0, 0, 2)  # the whole file, SYNC_FILE_RANGE_WRITE; errors ignored


def copy_file_range_all(
    src_fd: int,
    offset: int,
    length: int,
    out_fd: int,
    tick: Callable[[int], None] | None = None,
    step: int = 64 << 20,
) -> None:
    """Copy `length` bytes of `src_fd` from `offset` to `out_fd` at its current position inside
    the kernel: copy_file_range (no page faults, no user-space copy), else sendfile, else
    pread/write through one reused buffer. A source that ends early changed underneath:
    IO_CHANGED. `tick(n)` after every step (progress)."""
    done = 0
    how = "range"
    buf: memoryview | None = None
    while done < length:
        n = min(step, length - done)
        try:
            if how == "range":
                got = os.copy_file_range(src_fd, out_fd, n, offset + done)
            elif how == "sendfile":
                got = os.sendfile(out_fd, src_fd, offset + done, n)
            else:
                if buf is None:
                    buf = memoryview(bytearray(COPY_CHUNK))
                got = os.preadv(src_fd, [buf[: min(n, len(buf))]], offset + done)
                put = 0
                while put < got:
                    put += os.write(out_fd, buf[put:got])
        except OSError as exc:
            if exc.errno in _RANGE_ERRORS and how != "read":
                how = "sendfile" if how == "range" else "read"
                continue
            raise
        if got == 0:
            check_inputs_unchanged()
            raise InputError(
                IO_CHANGED,
                f"ended at byte {offset + done:,} while {offset + length:,} were expected",
            )
        done += got
        started_writeback(out_fd, got)
        if tick is not None:
            tick(got)


def drop_pages(buf: Any, offset: int, length: int) -> None:
    """Tell the kernel a mapped range is no longer needed: it stays in the page cache but no
    longer counts in this process's memory, so streaming a file through a mapping keeps the
    resident size flat. Safe at any time for a read-only file mapping (pages fault back in)."""
    if not isinstance(buf, mmap.mmap) or length <= 0 or not hasattr(mmap, "MADV_DONTNEED"):
        return
    start = offset - offset % mmap.PAGESIZE
    end = min(len(buf), offset + length)
    if end > start:
        with contextlib.suppress(OSError, ValueError):
            buf.madvise(mmap.MADV_DONTNEED, start, end - start)


class Releaser:
    """Drop the pages of a read-only file mapping behind a forward-moving cursor.

    Touched pages of a mapped file count towards the process's resident memory. Scans that
    read a mapping front to back call `advance(pos)`; every `step` bytes the range already
    read is released with MADV_DONTNEED (for a read-only file mapping the pages stay in the
    page cache, and a later access maps them again), so resident memory stays near `step`
    whatever the file size.
    """

    def __init__(self, buf: object, step: int = 64 << 20) -> None:
        self._mm = buf if isinstance(buf, mmap.mmap) else None
        self._step = step
        self._done = 0

    def advance(self, pos: int) -> None:
        if self._mm is None or pos - self._done < self._step:
            return
        end = (pos - self._step // 2) & ~(mmap.PAGESIZE - 1)
        if end > self._done:
            drop_pages(self._mm, self._done, end - self._done)
            self._done = end


class BackgroundWriter:
    """Write chunks on a helper thread while the caller prepares the next ones.

    `os.write` releases the GIL, so on two cores the copy into the page cache overlaps with the
    caller's scanning (CRC-32 and range checks release it too). At most `depth` chunks are in
    flight; the caller must keep each chunk's buffer unchanged until `drain()` (views of a
    mapped input or freshly allocated arrays satisfy that). An error in the thread is raised
    by the next `write` or `drain`; the writes queued after it are dropped. A plain thread and
    a condition (not concurrent.futures, whose import pulls in logging: start-up time).
    """

    def __init__(self, fp: BinaryIO, depth: int = 2) -> None:
        import threading
        from collections import deque

        self.fp = fp
        self._depth = depth
        self._queue: deque[Any] = deque()
        self._busy = 0  # queued or being written
        self._error: BaseException | None = None
        self._failed = False
        self._stop = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="matrixctl-write", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stop:
                    self._cond.wait()
                if not self._queue:
                    return
                data = self._queue.popleft()
                skip = self._failed
            try:
                if not skip:
                    self.fp.write(data)
            except BaseException as exc:  # handed to the caller's next write or drain
                with self._cond:
                    self._error, self._failed = exc, True
            finally:
                with self._cond:
                    self._busy -= 1
                    self._cond.notify_all()

    def _raise(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def write(self, data: bytes | memoryview) -> None:
        with self._cond:
            self._raise()
            self._queue.append(data)
            self._busy += 1
            self._cond.notify_all()
            while self._busy > self._depth and self._error is None:
                self._cond.wait()
            self._raise()

    def drain(self) -> None:
        with self._cond:
            while self._busy:
                self._cond.wait()
            self._raise()

    def close(self) -> None:
        try:
            self.drain()
        finally:
            with self._cond:
                self._stop = True
                self._cond.notify_all()
            self._thread.join()


class HashingWriter:
    """A file object that writes, and SHA-256s what it writes, on a helper thread, in order.

    For outputs whose digest is recorded (manifests): the hash costs no second read, and on
    two cores it overlaps with the caller preparing the next chunk (`os.write` and hashlib
    release the GIL). At most `depth` chunks are in flight; each chunk's buffer must stay
    unchanged until written (fresh arrays and views of a read-only mapping do). A `seek`
    (a writer that patches a header) drains the queue and voids the digest: `digest` is then
    None and the caller hashes the finished file instead.
    """

    def __init__(self, fp: BinaryIO, depth: int = 3) -> None:
        import hashlib
        from concurrent.futures import ThreadPoolExecutor

        self.fp = fp
        self._sha = hashlib.sha256()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="matrixctl-hash")
        self._pending: list[Any] = []
        self._depth = depth
        self._valid = True
        self._closed = False
        self.digest: str | None = None

    def _put(self, data: Any) -> None:
        self._sha.update(data)
        self.fp.write(data)

    def write(self, data: Any) -> int:
        n = len(data) if isinstance(data, bytes | bytearray) else memoryview(data).nbytes
        self._pending.append(self._pool.submit(self._put, data))
        while len(self._pending) > self._depth:
            self._pending.pop(0).result()
        return n

    def drain(self) -> None:
        while self._pending:
            self._pending.pop(0).result()

    def flush(self) -> None:
        self.drain()
        self.fp.flush()

    def tell(self) -> int:
        self.drain()
        return self.fp.tell()

    def seek(self, offset: int, whence: int = 0) -> int:
        self.drain()
        self._valid = False
        return self.fp.seek(offset, whence)

    def fileno(self) -> int:
        return self.fp.fileno()

    def close(self) -> None:
        """Finish the writes (raising a write error) and set `digest`; the file stays open."""
        if self._closed:
            return
        self._closed = True
        try:
            self.drain()
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)
        if self._valid:
            self.digest = "sha256:" + self._sha.hexdigest()


def stdout_is_terminal() -> bool:
    try:
        return os.isatty(sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        return False


def refuse_binary_to_terminal(path: str, what: str = "binary output") -> None:
    if path == STDIO and stdout_is_terminal():
        raise UsageError(
            f"refusing to write {what} to a terminal",
            code=codes.OUT_TTY,
            hint="redirect stdout (`> out.bin`, `| next-command`) or name an output file, not -",
        )


STALE_TEMP = codes.define(
    "STALE_TEMP",
    "A temporary file or folder left by a dead matrixctl run (killed, out of memory, power "
    "loss); the next run writing the same output removes it.",
    group="general",
    severity=codes.Severity.WARNING,
)

# `.NAME.mxPID-START-HOST-RANDOM.tmp`: the owner's pid, its start time (clock ticks since boot,
# from /proc; 0 where unknown) and a hash of the host name, so a later run can tell a
# temporary file of a dead run from one of a live run.
_TEMP_RE = re.compile(
    r"\.(?P<base>.+)\.mx(?P<pid>\d+)-(?P<start>\d+)-(?P<host>[0-9a-f]{4})-[0-9a-f]{12}\.tmp"
)
# The set-aside name of `ingest/swap.py`'s fallback in earlier versions,
# `.NAME.PID-START.RANDOM.old`: reported and restored like `.NAME.old.mx...tmp` (no host tag).
_OLD_RE = re.compile(r"\.(?P<base>.+)\.(?P<pid>\d+)-(?P<start>\d+)\.[0-9a-f]{12}\.old")
_OWNER: str | None = None


def _start_time(pid: int) -> int:
    """The start time of process `pid` in clock ticks since boot (Linux /proc), 0 if unknown,
    -1 if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fp:
            stat_line = fp.read()
    except FileNotFoundError:
        return -1 if os.path.isdir("/proc/self") else _alive_or_unknown(pid)
    except OSError:
        return _alive_or_unknown(pid)
    try:
        return int(stat_line.rpartition(b")")[2].split()[19])
    except (IndexError, ValueError):
        return 0


def _alive_or_unknown(pid: int) -> int:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return -1
    except OSError:
        return 0
    return 0


def _host_tag() -> str:
    try:  # the interpreter's own SHA-256 (a small module): hashlib would load OpenSSL
        from _sha256 import sha256
    except ImportError:
        from hashlib import sha256

    # os.uname().nodename is what socket.gethostname() returns, without importing socket.
    return str(sha256(os.uname().nodename.encode("utf-8", "replace")).hexdigest()[:4])


def _owner_tag() -> str:
    global _OWNER
    pid = os.getpid()
    if _OWNER is None or not _OWNER.startswith(f"mx{pid}-"):
        _OWNER = f"mx{pid}-{max(_start_time(pid), 0)}-{_host_tag()}"
    return _OWNER


def sibling_temp_name(dest: str) -> str:
    """A fresh hidden name beside `dest` (`.NAME.mxPID-START-HOST-RANDOM.tmp`) for a temporary
    file or folder. Callers record the name *before* creating it, so an interruption at any
    point (a signal handled right after the creating call) can still remove what was created."""
    folder = os.path.dirname(os.path.abspath(dest))
    base = os.path.basename(os.path.abspath(dest))
    return os.path.join(folder, f".{base}.{_owner_tag()}-{os.urandom(6).hex()}.tmp")


def stale_temps(folder: str, base: str | None = None) -> list[tuple[str, int]]:
    """Temporary files and folders in `folder` (of the output `base`, or of any output) whose
    owner is dead: (path, pid). One of another host, or whose owner cannot be told, is never
    stale: it may belong to a live run."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    host = None
    out = []
    for name in sorted(names):
        m = _TEMP_RE.fullmatch(name)
        if m is None:
            m = _OLD_RE.fullmatch(name)
            if m is None or (base is not None and m["base"] + ".old" != base):
                continue
        else:
            if base is not None and m["base"] != base:
                continue
            host = host or _host_tag()
            if m["host"] != host:
                continue
        pid, start = int(m["pid"]), int(m["start"])
        now = _start_time(pid)
        if now == -1 or (start and now and now != start):
            out.append((os.path.join(folder, name), pid))
    return out


def remove_stale_temps(dest: str) -> int:
    """Remove the temporary files and folders dead runs left beside `dest`; how many. File
    sets a dead run left half published in the folder are completed first (`OutputSet`)."""
    folder = os.path.dirname(os.path.abspath(dest))
    complete_dead_sets(folder)
    removed = 0
    for path, _pid in stale_temps(folder, os.path.basename(os.path.abspath(dest))):
        with contextlib.suppress(OSError):
            if os.path.isdir(path) and not os.path.islink(path):
                rmtree(path)
            else:
                os.unlink(path)
            removed += 1
    return removed


def aside_name(dest: str) -> str:
    """The temporary name an existing output is moved to while its replacement is renamed in
    (`.NAME.old.mxPID-...tmp`); `restore_aside` puts it back after a kill."""
    return sibling_temp_name(os.path.abspath(dest) + ".old")


def discard_aside(old: str, dest: str) -> None:
    """Remove the previous version of `dest` that a replacement set aside at `old`, once the
    new one is in place. It is renamed to a temporary name of `dest` first, so a removal cut
    short (a kill) leaves a temporary folder the next writer removes, never a half-removed
    previous version that `restore_aside` would put back as `dest`."""
    doomed = sibling_temp_name(dest)
    try:
        os.rename(old, doomed)
    except OSError:
        doomed = old
    rmtree(doomed, ignore_errors=True)


def aside_of(name: str) -> str | None:
    """The output whose previous version the set-aside name `name` holds, or None when `name`
    is not a set-aside name (`.NAME.old.mx...tmp`, `.NAME.PID-START.RANDOM.old`)."""
    m = _TEMP_RE.fullmatch(name)
    if m is not None:
        return m["base"].removesuffix(".old") if m["base"].endswith(".old") else None
    m = _OLD_RE.fullmatch(name)
    return None if m is None else m["base"]


def restore_aside(dest: str) -> str | None:
    """Undo a replacement a killed run left half done: when `dest` is missing and a dead run
    moved the previous version aside, rename it back. Then remove the other dead runs'
    set-aside copies. Returns the set-aside name restored, or None."""
    restored = None
    folder = os.path.dirname(os.path.abspath(dest))
    for path, _pid in stale_temps(folder, os.path.basename(os.path.abspath(dest)) + ".old"):
        if restored is None and not os.path.lexists(dest):
            with contextlib.suppress(OSError):
                os.rename(path, dest)
                restored = path
                continue
        with contextlib.suppress(OSError):
            if os.path.isdir(path) and not os.path.islink(path):
                rmtree(path)
            else:
                os.unlink(path)
    return restored


def make_temp_dir(dest: str, holder: list[str]) -> str:
    """Create a temporary folder beside `dest`; its name is appended to `holder` before it is
    created, so the caller's cleanup (over `holder`) covers an interruption inside this call.
    Temporary folders of dead runs writing the same destination are removed first."""
    remove_stale_temps(dest)
    for _ in range(16):
        name = sibling_temp_name(dest)
        holder.append(name)
        register_temp(name)
        try:
            os.mkdir(name, 0o700)
        except FileExistsError:
            holder.remove(name)
            continue
        except OSError as exc:
            holder.remove(name)
            raise from_os_error(exc, dest, writing=True) from None
        return name
    raise OutputError(codes.IO_WRITE, "no free temporary name beside the output", path=dest)


class AtomicFile:
    """A temporary file beside the destination that becomes the destination on `commit`.

    Constructing it creates nothing; `create` makes the file. `atomic_output` calls `create`
    inside the block that discards on failure, so no signal can leave a temporary file behind.
    """

    def __init__(self, dest: str) -> None:
        self.dest = dest
        if os.path.isdir(dest):
            raise OutputError(codes.OUT_EXISTS_DIR, "output path is a folder", path=dest)
        self.tmp: str | None = None
        self.fp: BinaryIO | None = None
        self._done = False

    def create(self) -> BinaryIO:
        remove_stale_temps(self.dest)
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
        for _ in range(16):
            self.tmp = sibling_temp_name(self.dest)  # recorded before the file exists
            register_temp(self.tmp)
            try:
                fd = os.open(self.tmp, flags, 0o600)
            except FileExistsError:
                continue
            except OSError as exc:
                self.tmp = None
                raise from_os_error(exc, self.dest, writing=True) from None
            self.fp = os.fdopen(fd, "w+b")
            if _SETS and _SETS[-1].takes(self.dest):
                _SETS[-1].order.append(os.path.basename(self.dest))
            return self.fp
        raise OutputError(
            codes.IO_WRITE, "no free temporary name beside the output", path=self.dest
        )

    def commit(self) -> None:
        assert self.fp is not None and self.tmp is not None
        with contextlib.suppress(OSError, ValueError):
            _UNFLUSHED.pop(self.fp.fileno(), None)
        try:
            check_inputs_unchanged()
        except BaseException:
            self.discard()
            raise
        try:
            self.fp.flush()
            if durable():
                os.fsync(self.fp.fileno())
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(self.fp.fileno(), 0o666 & ~umask)
            self.fp.close()
            if _SETS and _SETS[-1].takes(self.dest):
                _SETS[-1].ready[os.path.basename(self.dest)] = self.tmp  # published with the set
                self._done = True
                return
            os.replace(self.tmp, self.dest)
            unregister_temp(self.tmp)
            if durable():
                _fsync_dir(os.path.dirname(os.path.abspath(self.dest)))
        except OSError as exc:
            self.discard()
            raise from_os_error(exc, self.dest, writing=True) from None
        self._done = True

    def discard(self) -> None:
        if self._done:
            return
        self._done = True
        if self.fp is not None:
            with contextlib.suppress(OSError):
                self.fp.close()
        if self.tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.tmp)
            unregister_temp(self.tmp)


# Output sets: several files that appear whole or not at all ---------------------------------

TORN_SET = codes.define(
    "TORN_SET",
    "The file belongs to a set of outputs (an STB set: .stb files and their .stb.json "
    "sidecar) whose publication a killed run left half done: some files are the new version, "
    "some the old. The next matrixctl run writing into the folder completes it.",
    group="general",
)
SET_ORDER = "set-order"  # in a set folder: the members' names, in publication order
_SETS: list[OutputSet] = []


class OutputSet:
    """Atomic outputs in one folder published together (`output_set`). Each member is written
    and synced under its own temporary name as usual; on success they are moved into a
    temporary folder `.MAIN.mx...tmp` with the list of their names (SET_ORDER), the folder is
    synced and renamed to `.MAIN.set.mx...tmp`: that rename is the commit point. Then each
    member is renamed into place (sidecar last) and the folder removed.

    A kill before the commit point leaves only temporary names (removed by the next run, the
    previous set intact); a kill after it leaves the set folder, which the next matrixctl run
    writing into the folder completes (`complete_dead_sets`); until then `verify` of a member
    reports TORN_SET."""

    def __init__(self, main: str) -> None:
        self.main = os.path.abspath(main)
        self.folder = os.path.dirname(self.main)
        self.order: list[str] = []
        self.ready: dict[str, str] = {}  # name -> temporary file, committed

    def takes(self, dest: str) -> bool:
        return os.path.dirname(os.path.abspath(dest)) == self.folder

    def discard(self) -> None:
        for tmp in self.ready.values():
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            unregister_temp(tmp)
        self.ready.clear()

    def publish(self) -> None:
        holder: list[str] = []
        try:
            work = make_temp_dir(self.main, holder)
            names = [n for n in self.order if n in self.ready]
            with open(os.path.join(work, SET_ORDER), "w", encoding="utf-8") as fp:
                fp.write("".join(n + "\n" for n in names))
            for name in names:
                os.rename(self.ready[name], os.path.join(work, name))
                unregister_temp(self.ready.pop(name))
            if durable():
                _fsync_dir(work)
            done = sibling_temp_name(self.main + ".set")
            blocked = _block_signals()
            try:
                os.rename(work, done)  # the commit point
                unregister_temp(work)
                if durable():
                    _fsync_dir(self.folder)
                _drain_set(done, self.folder)
            finally:
                _unblock_signals(blocked)
        except OSError as exc:
            for path in holder:
                rmtree(path, ignore_errors=True)
                unregister_temp(path)
            self.discard()
            raise from_os_error(exc, self.main, writing=True) from None
        except BaseException:
            for path in holder:
                rmtree(path, ignore_errors=True)
                unregister_temp(path)
            self.discard()
            raise


def _block_signals() -> set[int] | None:
    if not hasattr(signal, "pthread_sigmask"):
        return None
    return set(signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM}))


def _unblock_signals(previous: set[int] | None) -> None:
    if previous is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _set_order(done: str) -> list[str]:
    """The members of the set folder `done` in publication order (none without its list)."""
    try:
        with open(os.path.join(done, SET_ORDER), encoding="utf-8") as fp:
            return [n for n in fp.read().split("\n") if n and "/" not in n and n != SET_ORDER]
    except FileNotFoundError:
        return []


def _drain_set(done: str, folder: str) -> None:
    """Rename the members left in the committed set folder `done` into place, in order."""
    for name in _set_order(done):
        with contextlib.suppress(FileNotFoundError):  # already in place
            os.replace(os.path.join(done, name), os.path.join(folder, name))
    if durable():
        _fsync_dir(folder)
    rmtree(done)


def set_members(folder: str) -> dict[str, str]:
    """The members of the sets dead runs left half published in `folder`: name -> set folder."""
    out: dict[str, str] = {}
    for path, _pid in stale_temps(folder):
        m = _TEMP_RE.fullmatch(os.path.basename(path))
        if m is not None and m["base"].endswith(".set") and os.path.isdir(path):
            try:
                names = _set_order(path)
            except OSError:
                continue
            if any(os.path.lexists(os.path.join(path, n)) for n in names):  # not all in place
                out.update((n, path) for n in names)
    return out


def complete_dead_sets(folder: str) -> None:
    """Finish the publication of the sets dead runs committed but did not put in place. A set
    one of whose members already put in place has been removed since (by hand, or by a tool
    clearing the outputs) cannot be completed: the rest of it is removed, not published, so
    no sidecar appears without the files it describes."""
    for path, _pid in stale_temps(folder):
        name = os.path.basename(path)
        m = _TEMP_RE.fullmatch(name)
        if m is not None and m["base"].endswith(".set") and os.path.isdir(path):
            with contextlib.suppress(OSError):
                placed = [n for n in _set_order(path) if not os.path.lexists(os.path.join(path, n))]
                if all(os.path.lexists(os.path.join(folder, n)) for n in placed):
                    _drain_set(path, folder)
                else:
                    rmtree(path)


@contextlib.contextmanager
def output_set(main: str) -> Iterator[OutputSet]:
    """The atomic outputs (`atomic_output`) opened inside the block, in the folder of `main`,
    appear together when the block completes (`OutputSet`), or none of them."""
    group = OutputSet(main)
    _SETS.append(group)
    try:
        yield group
    except BaseException:
        _SETS.remove(group)
        group.discard()
        raise
    _SETS.remove(group)
    group.publish()


def durable() -> bool:
    """fsync outputs before renaming them (default). MATRIXCTL_NO_FSYNC=1 skips it: the rename
    is still atomic for other processes, but a power loss may leave an empty file."""
    return os.environ.get("MATRIXCTL_NO_FSYNC", "") in ("", "0")


def _fsync_dir(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_output(path: str, *, what: str = "binary output") -> Iterator[BinaryIO]:
    """Yield a seekable binary file that replaces `path` only if the block completes.

    For `-` the bytes are spooled to a temporary file and copied to stdout at the end, so the
    writer may seek (headers completed last) and stdout never receives a partial file from a
    failed write. On any exception, Ctrl-C included, nothing is written and the temporary file is
    removed.
    """
    if path == STDIO:
        import tempfile

        refuse_binary_to_terminal(path, what)
        with tempfile.TemporaryFile(prefix="matrixctl-out-") as tmp:
            yield tmp
            tmp.flush()
            tmp.seek(0)
            out = sys.stdout.buffer
            import shutil

            shutil.copyfileobj(tmp, out, COPY_CHUNK)
            out.flush()
        return
    target = AtomicFile(path)
    try:
        yield target.create()
    except MatrixError:
        target.discard()
        check_inputs_unchanged()  # the root cause when an input changed underneath
        raise
    except OSError as exc:
        target.discard()
        check_inputs_unchanged()  # a write of a truncated mapping fails with EFAULT
        if exc.errno in _FULL:  # a write into the temporary file: name the destination
            raise from_os_error(exc, path, writing=True) from None
        raise
    except BaseException:
        target.discard()
        raise
    try:
        target.commit()
    except BaseException:
        target.discard()
        raise


def write_all(fp: BinaryIO, data: bytes | memoryview, dest: str) -> None:
    try:
        fp.write(data)
    except OSError as exc:
        raise from_os_error(exc, dest, writing=True) from None


class Folder:
    """A folder input of a folder format (a Hugging Face model folder, ...): the format's own
    module opens the files inside. Shares `path`, `name` and the context manager with
    `Source`, so converters and error messages treat both alike."""

    is_folder = True

    def __init__(self, path: str) -> None:
        self.path = path
        self.name = path
        self.size = 0

    def close(self) -> None:
        return None

    def __enter__(self) -> Folder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


HASH_CHUNK = 8 << 20


def sha256_file(path: str) -> str:
    """`sha256:<hex>` of a whole file, read in 8 MiB blocks (ingest manifests record it)."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as fp:
        while True:
            block = fp.read(HASH_CHUNK)
            if not block:
                break
            h.update(block)
    return "sha256:" + h.hexdigest()


class FileHash:
    """`sha256:<hex>` of a whole file, computed on a helper thread from the start; `cancel`
    stops it (a build that fails does not wait for the rest of the file)."""

    def __init__(self, path: str) -> None:
        import threading

        self.path = path
        self.digest = ""
        self.error: OSError | None = None
        self.stop = False
        self.thread = threading.Thread(target=self._run, name="matrixctl-hash", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        import hashlib

        h = hashlib.sha256()
        buf = bytearray(1 << 20)
        view = memoryview(buf)
        try:
            with open(self.path, "rb", buffering=0) as fp:
                while not self.stop:
                    n = fp.readinto(view)
                    if not n:
                        self.digest = "sha256:" + h.hexdigest()
                        return
                    h.update(view[:n])
        except OSError as exc:
            self.error = exc

    def result(self) -> str:
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.digest

    def cancel(self) -> None:
        self.stop = True
        self.thread.join()


class Ahead:
    """The items of an iterator, produced on a helper thread up to `depth` ahead of the
    caller: for work that runs without the GIL (decompressing, pyarrow decoding a column),
    which then overlaps with the caller's work on the items before. An exception the iterator
    raises is raised where the caller reaches it. `close` stops the thread after the item it
    is producing (the caller may stop early)."""

    def __init__(self, items: Iterator[Any], name: str = "matrixctl-ahead", depth: int = 2) -> None:
        import queue
        import threading

        self.items = items
        self.queue: queue.Queue[tuple[str, Any]] = queue.Queue(depth)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for item in self.items:
                if not self._put(("item", item)):
                    return
            entry: tuple[str, Any] = ("end", None)
        except BaseException as exc:  # handed to the caller, raised there
            entry = ("error", exc)
        self._put(entry)

    def _put(self, entry: tuple[str, Any]) -> bool:
        """Queue `entry` when there is room; False when the caller stopped first."""
        import queue

        while not self.stop.is_set():
            try:
                self.queue.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> Iterator[Any]:
        while True:
            what, value = self.queue.get()
            if what == "end":
                return
            if what == "error":
                raise value
            yield value

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
