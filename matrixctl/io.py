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
import hashlib
import mmap
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
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
        return _NoClose(sys.stdin.buffer)  # type: ignore[return-value]
    try:
        if os.path.isdir(path):
            raise InputError(codes.IO_IS_DIR, "is a folder, a file was expected", path=path)
        return open(path, "rb")
    except OSError as exc:
        raise from_os_error(exc, path) from None


class _NoClose:
    """Wrap stdin so `with open_input_stream('-')` does not close the process's stdin."""

    def __init__(self, fp: BinaryIO) -> None:
        self._fp = fp

    def read(self, n: int = -1) -> bytes:
        return self._fp.read(n)

    def readinto(self, b: bytearray | memoryview) -> int:
        return int(self._fp.readinto(b))  # type: ignore[attr-defined]

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


class Source:
    """A whole input as one read-only buffer: an mmap of a regular file, or a spooled pipe.

    `buf` supports slicing and the buffer protocol (numpy.frombuffer). Use as a context manager;
    views handed out must not outlive it.
    """

    def __init__(self, path: str, buf: mmap.mmap | bytes, size: int, fp: IO[bytes] | None) -> None:
        self.path = path
        self.name = display_name(path)
        self.buf = buf
        self.size = size
        self._fp = fp

    @classmethod
    def open(cls, path: str) -> Source:
        if path == STDIO:
            return cls._from_fd_or_spool(path)
        try:
            st = os.stat(path)
            if stat.S_ISDIR(st.st_mode):
                raise InputError(codes.IO_IS_DIR, "is a folder, a file was expected", path=path)
            if not stat.S_ISREG(st.st_mode):
                # A FIFO or character device: read it through like a pipe.
                with open(path, "rb") as fp:
                    return cls._spool(path, fp)
            fp = open(path, "rb")  # noqa: SIM115 - owned by the Source
        except MatrixError:
            raise
        except OSError as exc:
            raise from_os_error(exc, path) from None
        return cls._map(path, fp)

    @classmethod
    def _map(cls, path: str, fp: IO[bytes]) -> Source:
        size = os.fstat(fp.fileno()).st_size
        if size == 0:
            return cls(path, b"", 0, fp)
        try:
            buf = mmap.mmap(fp.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError):
            # Some file systems refuse mmap; fall back to reading (bounded by the file's size).
            fp.seek(0)
            data = fp.read()
            return cls(path, data, len(data), fp)
        return cls(path, buf, size, fp)

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
        tmp = tempfile.TemporaryFile(prefix="matrixctl-stdin-")  # noqa: SIM115 - owned by Source
        try:
            while True:
                chunk = stream.read(COPY_CHUNK)
                if not chunk:
                    break
                tmp.write(chunk)
            tmp.flush()
        except OSError as exc:
            tmp.close()
            raise from_os_error(exc, path) from None
        return cls._map(path, tmp)

    def head(self, n: int) -> bytes:
        return bytes(self.buf[:n])

    def close(self) -> None:
        if isinstance(self.buf, mmap.mmap):
            with contextlib.suppress(BufferError):
                # A numpy view still alive keeps the mapping; the OS frees it at exit.
                self.buf.close()
        if self._fp is not None:
            self._fp.close()
            self._fp = None

    def __enter__(self) -> Source:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
    by the next `write` or `drain`.
    """

    def __init__(self, fp: BinaryIO, depth: int = 2) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.fp = fp
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="matrixctl-write")
        self._pending: list[Any] = []
        self._depth = depth

    def write(self, data: bytes | memoryview) -> None:
        self._pending.append(self._pool.submit(self.fp.write, data))
        while len(self._pending) > self._depth:
            self._pending.pop(0).result()

    def drain(self) -> None:
        while self._pending:
            self._pending.pop(0).result()

    def close(self) -> None:
        try:
            self.drain()
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)


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


def sibling_temp_name(dest: str) -> str:
    """A fresh hidden name beside `dest` (`.NAME.XXXXXXXXXXXX.tmp`) for a temporary file or
    folder. Callers record the name *before* creating it, so an interruption at any point
    (a signal handled right after the creating call) can still remove what was created."""
    folder = os.path.dirname(os.path.abspath(dest))
    base = os.path.basename(os.path.abspath(dest))
    return os.path.join(folder, f".{base}.{os.urandom(6).hex()}.tmp")


def make_temp_dir(dest: str, holder: list[str]) -> str:
    """Create a temporary folder beside `dest`; its name is appended to `holder` before it is
    created, so the caller's cleanup (over `holder`) covers an interruption inside this call."""
    for _ in range(16):
        name = sibling_temp_name(dest)
        holder.append(name)
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
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
        for _ in range(16):
            self.tmp = sibling_temp_name(self.dest)  # recorded before the file exists
            try:
                fd = os.open(self.tmp, flags, 0o600)
            except FileExistsError:
                continue
            except OSError as exc:
                self.tmp = None
                raise from_os_error(exc, self.dest, writing=True) from None
            self.fp = os.fdopen(fd, "w+b")
            return self.fp
        raise OutputError(
            codes.IO_WRITE, "no free temporary name beside the output", path=self.dest
        )

    def commit(self) -> None:
        assert self.fp is not None and self.tmp is not None
        try:
            self.fp.flush()
            if durable():
                os.fsync(self.fp.fileno())
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(self.fp.fileno(), 0o666 & ~umask)
            self.fp.close()
            os.replace(self.tmp, self.dest)
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
        refuse_binary_to_terminal(path, what)
        with tempfile.TemporaryFile(prefix="matrixctl-out-") as tmp:
            yield tmp
            tmp.flush()
            tmp.seek(0)
            out = sys.stdout.buffer
            shutil.copyfileobj(tmp, out, COPY_CHUNK)
            out.flush()
        return
    target = AtomicFile(path)
    try:
        yield target.create()
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
    h = hashlib.sha256()
    with open(path, "rb") as fp:
        while True:
            block = fp.read(HASH_CHUNK)
            if not block:
                break
            h.update(block)
    return "sha256:" + h.hexdigest()
