"""One typed error family for the whole package.

Codecs and library code raise these and never print or exit; the command layer turns them into
one error line and an exit code. Each error carries a stable code (see `matrixctl.codes`), the
path it concerns, and where known the byte offset and the field name.

The classes subclass builtins, so callers that only know Python's exceptions still catch them:
`FormatError` is a `ValueError`, `InputError` and `OutputError` are `OSError`s.
"""

from __future__ import annotations

from matrixctl import codes


class MatrixError(Exception):
    """Base of every error matrixctl raises on purpose."""

    exit_code = 1

    def __init__(
        self,
        code: str,
        message: str,
        *,
        path: str | None = None,
        offset: int | None = None,
        field: str | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.path = path
        self.offset = offset
        self.field = field
        self.hint = hint

    def with_path(self, path: str) -> MatrixError:
        if self.path is None:
            self.path = path
        return self

    def location(self) -> str:
        """`offset 48 (0x30), field header_crc32` or an empty string."""
        parts = []
        if self.offset is not None:
            parts.append(f"offset {self.offset} (0x{self.offset:x})")
        if self.field is not None:
            parts.append(f"field {self.field}")
        return ", ".join(parts)

    def one_line(self) -> str:
        where = self.location()
        head = f"{self.path}: " if self.path else ""
        tail = f" [{where}]" if where else ""
        return f"error[{self.code}]: {head}{self.message}{tail}"


class FormatError(MatrixError, ValueError):
    """The input was read but its content is invalid (exit code 1)."""

    exit_code = 1


class UsageError(MatrixError, ValueError):
    """A wrong argument, option or combination of them (exit code 2)."""

    exit_code = 2

    def __init__(self, message: str, *, code: str = codes.USAGE, hint: str | None = None) -> None:
        super().__init__(code, message, hint=hint)


class InputError(MatrixError, OSError):
    """An input cannot be read at all: missing, a folder, no permission (exit code 2)."""

    exit_code = 2


class OutputError(MatrixError, OSError):
    """An output cannot be written (exit code 2)."""

    exit_code = 2


def from_os_error(exc: OSError, path: str, *, writing: bool = False) -> MatrixError:
    """Translate an OSError into the matching typed error with a stable code (an InputError
    or OutputError, already typed, is returned as it is)."""
    import errno

    if isinstance(exc, MatrixError):
        return exc.with_path(path)

    cls: type[MatrixError] = OutputError if writing else InputError
    reason = exc.strerror or str(exc)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        # Only a write fills a disk, whatever the caller was doing when it surfaced.
        return OutputError(codes.OUT_NO_SPACE, f"cannot write: {reason}", path=path)
    if exc.errno == errno.EFBIG:
        return OutputError(
            codes.OUT_TOO_LARGE,
            f"cannot write: {reason} (the file size limit, ulimit -f, or the file system's)",
            path=path,
        )
    if exc.errno == errno.ENOENT and not writing:
        return cls(codes.IO_NOT_FOUND, "no such file or folder", path=path)
    if exc.errno in (errno.EACCES, errno.EPERM):
        return cls(codes.IO_PERMISSION, f"permission denied ({reason})", path=path)
    if exc.errno == errno.EISDIR:
        code = codes.OUT_EXISTS_DIR if writing else codes.IO_IS_DIR
        return cls(code, "is a folder", path=path)
    if exc.errno == errno.ENOENT and writing:
        import os

        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            return cls(codes.IO_WRITE, f"the output folder {folder} does not exist", path=path)
    code = codes.IO_WRITE if writing else codes.IO_READ
    return cls(code, reason, path=path)
