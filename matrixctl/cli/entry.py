"""The console entry point (`matrixctl ARGS`, `python -m matrixctl ARGS`) and the mapping of a
command's failures to an error line and an exit code, which both paths below share.

A one-line `tokenize pi encode` spends most of its start-up in typer: importing it (and click)
and building the command from its annotations cost more than reading the map and encoding. So
when the words are `tokenize pi encode` followed by a plain use of its options (each option at
most once, written `--name VALUE`, `--name=VALUE` or `-x VALUE`, no value that could be read as
an option, at most one input, no `--help`), `main()` parses them here and runs the command's
body (`cli/pi_encode.py`) without typer. Every other command line, and every line this parser
does not accept (help, a typo, a bad value, an unusual spelling), goes to the full command line
(`cli/app.py`), so help texts and usage errors are typer's own. Same options, same outputs,
same errors and exit codes: tests/cli/test_startup.py runs both paths on the same words.
`convert` has a fast path of the same kind, in its own module (`cli/convert_fast.py`).
"""

from __future__ import annotations

import contextlib
import errno
import gc
import os
import re
import signal
import sys
from typing import Any, NoReturn

from matrixctl import codes
from matrixctl.cli import common
from matrixctl.cli.common import PROG, emit_json_error, print_error, write_err
from matrixctl.errors import MatrixError, from_os_error


class Terminated(BaseException):
    """SIGTERM, raised as an exception so `with` blocks remove temporary files."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated()


def start_run() -> None:
    """What every run starts with (main() may run more than once in a process: tests)."""
    if hasattr(signal, "SIGTERM"):
        signal.signal(signal.SIGTERM, _on_sigterm)
    common._set_quiet(False)
    common.json_state(asked=False)


def failure(exc: BaseException) -> int:
    """The exit code of an exception a command raised, after its error line: 1 or 2 for a
    `MatrixError`, 130 interrupted, 0 for a closed stdout, 2 for an unreadable input or a full
    disk, 70 for a bug (the traceback only with MATRIXCTL_DEBUG=1). Re-raises the rest."""
    if isinstance(exc, MatrixError):
        return fail(exc, exc.exit_code)
    if isinstance(exc, (KeyboardInterrupt, Terminated)):
        return interrupted()
    if isinstance(exc, BrokenPipeError):
        return closed_stdout()
    if isinstance(exc, OSError):
        from matrixctl.io import changed_input

        changed = changed_input()
        if changed is not None:
            return fail(changed, 2)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):  # a write: stdout or a file
            return fail(from_os_error(exc, exc.filename or "<stdout>", writing=True), 2)
        return fail(MatrixError(codes.IO_READ, exc.strerror or str(exc), path=exc.filename), 2)
    if isinstance(exc, Exception):  # a bug: one line, the traceback only on request
        if os.environ.get("MATRIXCTL_DEBUG"):
            raise exc
        bug = MatrixError(
            codes.INTERNAL,
            f"internal error {type(exc).__name__}: {exc}",
            hint="rerun with MATRIXCTL_DEBUG=1 for the traceback and report it",
        )
        return fail(bug, 70)
    raise exc


def json_word(args: list[str]) -> bool:
    """`--json` among the options (before a `--` that ends them)."""
    words = list(args)
    return "--json" in (words[: words.index("--")] if "--" in words else words)


def fail(err: MatrixError, exit_code: int, json_asked: bool = False) -> int:
    """The one error line on stderr; under --json also the failure document on stdout, unless
    the command already printed its own document (verify's report of invalid files)."""
    print_error(err)
    asked, done = common.json_state()
    if (asked or json_asked) and not done:
        with contextlib.suppress(OSError):  # stdout is gone: the error line said it all
            emit_json_error(err)
    return exit_code


def interrupted() -> int:
    write_err(f"{PROG}: interrupted; no output was left behind")
    asked, done = common.json_state()
    if asked and not done:
        with contextlib.suppress(OSError):
            emit_json_error(
                MatrixError(codes.INTERRUPTED, "interrupted; no output was left behind")
            )
    return 130


def closed_stdout() -> int:
    """The reader of our stdout went away (`| head`): stop quietly, without a traceback."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return 0


# `tokenize pi encode` without typer ----------------------------------------------------------

# Option spellings -> (parameter, takes a value). Kept equal to cli/tokenize_pi.py's `encode`
# options by tests/cli/test_startup.py (it compares them with the typer command's parameters).
PI_ENCODE_OPTIONS = {
    "--symbols": ("symbols", True),
    "-s": ("symbols", True),
    "--output": ("output", True),
    "-o": ("output", True),
    "--ids": ("ids", False),
    "--label": ("label", True),
    "--jobs": ("jobs", True),
    "-j": ("jobs", True),
    "--json": ("json_out", False),
    "--quiet": ("quiet", False),
    "-q": ("quiet", False),
    "--spool-limit": ("spool_limit", True),
}
_JOBS = re.compile(r"[1-9][0-9]?\Z")  # 1..99; --jobs allows 1..64


_PI_ENCODE_KINDS = {
    name: (param, "str" if takes else "flag") for name, (param, takes) in PI_ENCODE_OPTIONS.items()
}
_INT = re.compile(r"[0-9]{1,18}\Z")


def parse_plain(
    words: list[str], options: dict[str, tuple[str, str]]
) -> tuple[dict[str, Any], list[str], list[str]] | None:
    """A plain use of the options `options` (spelling -> (parameter, kind); kinds "flag",
    "str", "int", "list") in `words`: (parameters, positional words, parameters in the order
    written), or None when the words are anything else: an unknown or repeated option (a
    "list" may repeat), `-x=VALUE`, a flag given a value, an option without its value or
    with a value that could be read as an option, an "int" that is not plain digits. The fast
    paths (`tokenize pi encode`, `convert`) then leave the words to the full command line."""
    found: dict[str, Any] = {}
    positional: list[str] = []
    order: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if word == "-" or not word.startswith("-"):
            positional.append(word)
            continue
        name, eq, value = word.partition("=")
        if name not in options or (eq and not name.startswith("--")):
            return None
        param, kind = options[name]
        if param in found and kind != "list":
            return None
        if kind == "flag":
            if eq:
                return None
            found[param] = True
            order.append(param)
            continue
        if not eq:
            if i == len(words):
                return None
            value = words[i]
            i += 1
        if value.startswith("-") and value != "-":
            return None
        if kind == "int":
            if not _INT.match(value):
                return None
            found[param] = int(value)
        elif kind == "list":
            found.setdefault(param, []).append(value)
        else:
            found[param] = value
        order.append(param)
    return found, positional, order


def parse_pi_encode(args: list[str]) -> dict[str, Any] | None:
    """The parameters of `tokenize pi encode ...` when the words are a plain use of its
    options; None for anything else (the full command line then parses them)."""
    if args[:3] != ["tokenize", "pi", "encode"]:
        return None
    parsed = parse_plain(args[3:], _PI_ENCODE_KINDS)
    if parsed is None or len(parsed[1]) > 1:
        return None
    found, positional, _ = parsed
    if positional:
        found["input_path"] = positional[0]
    jobs = found.get("jobs", "1")
    if not _JOBS.match(jobs) or int(jobs) > 64:
        return None
    found["jobs"] = int(jobs)
    return found


def quiet_blas(environ: dict[str, str] | os._Environ[str]) -> None:
    """No BLAS thread pool in a command's process, unless the user's environment sets one.
    No command multiplies matrices, but OpenBLAS (loaded with numpy) starts a pool of server
    threads that spin for about 0.1 s of CPU each time it starts; `ingest docs --jobs N`
    restarts it at each fork (0.16 CPU s of a 1 GB build; docs/benchmarks.md). Read when
    numpy is first imported, which no command does before this point."""
    environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def main(argv: list[str] | None = None) -> int:
    """Run the command line and return the exit code (the console script exits with it)."""
    if argv is None:  # this process is the command (not a caller's process: tests, scripts)
        quiet_blas(os.environ)
    args = sys.argv[1:] if argv is None else argv
    params = parse_pi_encode(list(args))
    if params is not None:
        code = run_pi_encode(params)
        if argv is None:  # the console command itself (not a caller in this process): done
            exit_now(code)
        return code
    if args[:1] == ["convert"]:  # the same fast path for `convert` (cli/convert_fast.py)
        from matrixctl.cli import convert_fast

        found = convert_fast.parse_convert(list(args))
        if found is not None:
            if argv is None:
                # The console command, ended by exit_now: no collection of the few hundred
                # thousand objects the codecs' imports make (about 1 ms); a convert makes no
                # garbage cycles in its loop.
                gc.disable()
            code = convert_fast.run_convert(found)
            if argv is None:  # the console command: the output is committed or removed by now
                exit_now(code)
            return code
    from matrixctl.cli.app import main as full

    code = full(args)
    if argv is None:
        # The console command: its outputs are committed or removed, its workers and helper
        # threads ended. The interpreter's teardown after an `ingest docs --executor dask`
        # (freeing distributed's modules and objects) took 0.28 s of a 5 s build.
        exit_now(code)
    return code


def exit_now(code: int) -> NoReturn:
    """End the process with `code` once stdout and stderr are flushed, without the
    interpreter's teardown (freeing every module and object: 6-8 ms after a `tokenize pi
    encode`, as long as the map's load; about 18 M instructions, 4 ms, after a `convert`;
    0.28 s after an `ingest docs --executor dask`). Every command run as the console
    command ends here.
    The command has committed or removed its output and reaped its workers (and joined its
    helper threads) by then, and registers no exit handler."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def run_pi_encode(params: dict[str, Any]) -> int:
    """`tokenize pi encode` with parameters from `parse_pi_encode`, as cli/app.py's `main()`
    runs it: the same state set up, the same callbacks, the same failure mapping."""
    params = dict(params)
    start_run()
    try:
        try:
            if params.pop("json_out", False):
                common._set_json(True)
                params["json_out"] = True
            common._set_quiet(params.pop("quiet", False))
            common._set_spool_limit(params.pop("spool_limit", None))
            from matrixctl.cli.pi_encode import run

            run(**params)
        finally:
            sys.stdout.flush()
        return 0
    except BaseException as exc:
        return failure(exc)
