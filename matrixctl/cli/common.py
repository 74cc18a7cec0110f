"""What every command shares: output streams, JSON, error lines, progress, shared options.

This is the only place (with the renderers) that knows about terminals, colors and progress.
Nothing here imports numpy; rich is imported only when something is drawn.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from matrixctl.errors import MatrixError
from matrixctl.jsondoc import SCHEMA_VERSION, json_default

if TYPE_CHECKING:
    from rich.console import Console

    from matrixctl.cli.options import (  # noqa: F401 - see __getattr__
        JsonOption,
        QuietOption,
        SpoolLimitOption,
    )

PROG = "matrixctl"

# The --json contract (docs/json.md, docs/schemas/): every document is one object whose first
# key is schema_version, then ok; a failure is {"schema_version", "ok": false, "error": {...}}.
_json_asked = False  # set by --json as it is parsed: main() then reports a failure as JSON too
_json_done = False  # a document is on stdout: main() adds no second one


def _set_json(value: bool) -> bool:
    global _json_asked
    _json_asked = _json_asked or bool(value)
    return value


def json_state(asked: bool | None = None) -> tuple[bool, bool]:
    """(was --json asked, was a document printed); `asked` resets both for a new run."""
    global _json_asked, _json_done
    if asked is not None:
        _json_asked, _json_done = asked, False
    return _json_asked, _json_done


_quiet = False


def _set_quiet(value: bool) -> bool:
    global _quiet
    _quiet = bool(value)
    return value


def __getattr__(name: str) -> Any:
    # JsonOption and QuietOption are typer annotations (cli/options.py): importing this module
    # does not import typer, so `tokenize pi encode` can run without it (cli/entry.py).
    if name in ("JsonOption", "QuietOption", "SpoolLimitOption"):
        from matrixctl.cli import options

        return getattr(options, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _set_spool_limit(value: str | None) -> str | None:
    from matrixctl.io import set_spool_limit

    set_spool_limit(value)  # None (the option not given): MATRIXCTL_SPOOL_LIMIT or 4G
    return value


MALLOC_SETTINGS = (  # (mallopt parameter, value, the environment variable that overrides it)
    (-3, 32 << 20, "MALLOC_MMAP_THRESHOLD_"),  # M_MMAP_THRESHOLD
    (-1, 256 << 20, "MALLOC_TRIM_THRESHOLD_"),  # M_TRIM_THRESHOLD
)


def keep_freed_memory(environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """For a streaming command's own process (`ingest docs`): glibc's allocator keeps the
    memory a batch frees for the next batch instead of returning it to the kernel at once.
    By default a block above 128 KiB (the threshold grows only up to a point) is its own
    mapping and the heap's free top is trimmed past 128 KiB, so each batch's buffers (Arrow
    cells made into bytes, token arrays) are faulted in and zeroed again: a quarter million
    page faults and about 0.7 s of system time on the 1 GB Parquet benchmark
    (docs/benchmarks.md). A setting the user's environment gives (MALLOC_MMAP_THRESHOLD_,
    MALLOC_TRIM_THRESHOLD_) is kept. False where the C library has no `mallopt` (not glibc).
    The CLI calls it, never the library: a caller's process is the caller's to tune."""
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    for param, value, env in MALLOC_SETTINGS:
        if env not in environ:
            mallopt(param, value)
    return True


LARGE_INPUT = 1 << 20  # bytes: from this size `tune_for_input` tunes the allocator


def tune_for_input(input_path: str) -> bool:
    """`keep_freed_memory` for a streaming command (`tokenize pi encode|decode`) whose input is
    a regular file of at least LARGE_INPUT bytes (stdin redirected from one included): each
    1 MiB read, its normalized text and its ids were fresh mappings the kernel faulted in
    and zeroed again, about 29,000 page faults for a 20 MB encode at `--jobs 1` and 43,000 at
    `--jobs 2` (forked workers inherit the setting). A small input, or a pipe whose size is
    not known, is left as it is: the setting costs `ctypes`' import, about 1.5 ms of a 40 ms
    one-line encode (docs/benchmarks.md, "π: the allocator")."""
    import stat

    try:
        st = os.fstat(0) if input_path == "-" else os.stat(input_path)
    except (OSError, ValueError):
        return False  # the command reports a missing input itself
    if not stat.S_ISREG(st.st_mode) or st.st_size < LARGE_INPUT:
        return False
    return keep_freed_memory()


def color_enabled(stream: Any = None) -> bool:
    stream = stream or sys.stderr
    if os.environ.get("NO_COLOR", "") != "":
        return False
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


_console: Console | None = None


def console() -> Console:
    """The rich console for people: always stderr, colors off under NO_COLOR or in a pipe."""
    global _console
    if _console is None:
        from rich.console import Console

        tty = stderr_is_terminal()
        _console = Console(
            stderr=True,
            color_system="auto" if color_enabled() else None,  # NO_COLOR: no styling at all
            highlight=False,
            width=None if tty else 120,
            soft_wrap=False,
        )
    return _console


def reset_console() -> None:
    """Forget the cached console (tests swap stderr between runs)."""
    global _console
    _console = None


def emit_json(
    doc: dict[str, Any], *, ok: bool = True, last_array: tuple[str, Any] | None = None
) -> None:
    """One JSON document on stdout (UTF-8, control characters escaped by JSON itself):
    `schema_version` first, then `ok` (False exactly when the command fails), then `doc`.

    `last_array=(key, file)` adds a last key whose array items are already JSON text,
    comma-separated, in a binary file: copied in chunks, so a long array (token ids) needs no
    memory."""
    global _json_done
    head: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "ok": ok}
    assert "ok" not in doc, "pass ok= instead"
    head.update((k, v) for k, v in doc.items() if k != "schema_version")
    _json_done = True
    data = json.dumps(head, indent=2, ensure_ascii=False, default=json_default) + "\n"
    out = sys.stdout.buffer if hasattr(sys.stdout, "buffer") else None
    if out is not None and last_array is not None:
        import shutil

        key, items = last_array
        body = data[: data.rindex("\n}")] + f",\n  {json.dumps(key)}: ["
        out.write(body.encode("utf-8", "backslashreplace"))
        items.seek(0)
        shutil.copyfileobj(items, out, 1 << 20)
        out.write(b"]\n}\n")
        out.flush()
    elif out is not None:
        out.write(data.encode("utf-8", "backslashreplace"))
        out.flush()
    else:  # pragma: no cover - test runners without a byte stream
        sys.stdout.write(data)
        sys.stdout.flush()


def emit_json_error(err: MatrixError) -> None:
    """The failure document: what the error line says, field by field."""
    emit_json(
        {
            "error": {
                "code": err.code,
                "message": err.message,
                "path": err.path,
                "offset": err.offset,
                "field": err.field,
                "hint": err.hint,
            }
        },
        ok=False,
    )


def json_needs_stdout(json_out: bool, output: str) -> None:
    """Refuse `-` as the output file under --json: stdout carries the one JSON document, so it
    cannot carry the command's output as well (a UsageError, exit 2)."""
    from matrixctl.errors import UsageError
    from matrixctl.io import STDIO

    if json_out and output == STDIO:
        raise UsageError("--json needs stdout, so the output cannot be - as well")


def safe(text: object) -> str:
    """Neutralize control characters (terminal escapes included) for display to a person."""
    s = str(text)
    if s.isprintable():
        return s
    out = []
    for ch in s:
        if ch.isprintable() or ch == " ":
            out.append(ch)
        elif ch in "\n\t":
            out.append({"\n": "\\n", "\t": "\\t"}[ch])
        else:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
    return "".join(out)


def _paint(text: str, ansi: str) -> str:
    return f"\x1b[{ansi}m{text}\x1b[0m" if color_enabled() else text


def error_line(err: MatrixError) -> str:
    head = _paint("error", "1;31")
    return f"{PROG}: {head}{safe(err.one_line()[len('error') :])}"


def print_error(err: MatrixError) -> None:
    write_err(error_line(err))
    if err.hint:
        write_err(f"{PROG}: {_paint('hint', '1;36')}: {safe(err.hint)}")


def warn(message: str) -> None:
    write_err(f"{PROG}: {_paint('warning', '1;33')}: {safe(message)}")


def note(message: str) -> None:
    """A success or progress note; --quiet silences it (warnings and errors always print)."""
    if _quiet:
        return
    write_err(f"{PROG}: {safe(message)}")


def write_err(line: str) -> None:
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


class _NoProgress:
    def advance(self, n: int) -> None:
        return None

    def total(self, n: int | None) -> None:
        return None


class _RichProgress:
    def __init__(self, progress: Any, task: Any) -> None:
        self._p = progress
        self._task = task

    def advance(self, n: int) -> None:
        self._p.advance(self._task, n)

    def total(self, n: int | None) -> None:
        self._p.update(self._task, total=n)


@contextmanager
def progress(label: str, total: int | None, unit: str = "bytes") -> Iterator[Any]:
    """A progress bar on stderr when stderr is a terminal; otherwise nothing at all."""
    if not stderr_is_terminal() or os.environ.get("MATRIXCTL_NO_PROGRESS"):
        yield _NoProgress()
        return
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    columns: list[Any] = [TextColumn("{task.description}"), BarColumn()]
    if unit == "bytes":
        columns += [DownloadColumn(), TransferSpeedColumn()]
    else:
        columns += [MofNCompleteColumn()]
    columns.append(TimeRemainingColumn())
    with Progress(*columns, console=console(), transient=True) as bar:
        task = bar.add_task(label, total=total)
        yield _RichProgress(bar, task)
