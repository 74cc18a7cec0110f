"""The `matrixctl` command: the root app, the command groups, and the one exit path.

`main()` is the only place that turns exceptions into an error line and an exit code:
0 success, 1 input read but invalid, 2 usage error or unreadable input, 130 interrupted,
70 internal error (a bug). No traceback reaches the user unless MATRIXCTL_DEBUG=1.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
from typing import Annotated, Any

import typer

from matrixctl import __version__, codes
from matrixctl.cli import common
from matrixctl.cli.common import PROG, emit_json_error, print_error, write_err
from matrixctl.cli.lazy import Lazy, LazyCommands
from matrixctl.errors import MatrixError, UsageError, from_os_error

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}

app = typer.Typer(
    name=PROG,
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings=CONTEXT,
)


def _version(value: bool) -> None:
    if value:
        sys.stdout.write(f"{PROG} {__version__}\n")
        raise typer.Exit(0)


@app.callback()
def root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """Inspect, verify, convert and build the binary files ML pipelines pass around.

    Exit codes: 0 ok, 1 input read but invalid, 2 usage error or unreadable input.
    Reports and progress go to stderr; stdout carries only data (binary outputs, --json).
    """


# The commands, in the order `--help` lists them; each module is imported and its command built
# only when it is called (cli/lazy.py): `tokenize pi encode` builds one command, not twenty.
SUBCOMMANDS = {
    "inspect": Lazy("matrixctl.cli.inspect_cmd", "inspect"),
    "verify": Lazy("matrixctl.cli.verify_cmd", "verify"),
    "convert": Lazy("matrixctl.cli.convert", "convert", cls="ConvertCommand"),
    "pack": Lazy("matrixctl.cli.pack", "app"),
    "tokenize": Lazy("matrixctl.cli.tokenize", "app"),
    "ingest": Lazy("matrixctl.cli.ingest", "app"),
}


class Terminated(BaseException):
    """SIGTERM, raised as an exception so `with` blocks remove temporary files."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated()


def _usage_hint(exc: Any) -> str:
    ctx = getattr(exc, "ctx", None)
    path = ctx.command_path if ctx is not None else PROG
    return f"see '{path} --help'"


_COMMAND: Any = None  # the click command tree, built once per process


def command_tree() -> Any:
    """The root click command. Its subcommands are built as they are reached (cli/lazy.py);
    a process that calls main() again (tests, library callers, the benchmarks) reuses them:
    click commands keep no state between invocations, each gets its own context."""
    global _COMMAND
    if _COMMAND is None:
        from typer.main import get_command

        root = get_command(app)
        root.commands = LazyCommands(SUBCOMMANDS)  # type: ignore[attr-defined]
        _COMMAND = root
    return _COMMAND


def main(argv: list[str] | None = None) -> int:
    """Run the command line and return the exit code (the console script exits with it)."""
    args = sys.argv[1:] if argv is None else argv
    if hasattr(signal, "SIGTERM"):
        signal.signal(signal.SIGTERM, _on_sigterm)
    command = command_tree()
    common._set_quiet(False)  # main() may run more than once in a process (tests)
    common.json_state(asked=False)
    try:
        try:
            # Not command.main(): it would swallow Ctrl-C and a closed stdout itself.
            with command.make_context(PROG, list(args)) as ctx:
                result = command.invoke(ctx)
            code = result if isinstance(result, int) else 0
        finally:
            sys.stdout.flush()
        return code
    except MatrixError as err:
        return _fail(err, err.exit_code)
    except typer.Exit as exc:
        return int(exc.exit_code)
    except typer.Abort:
        return _interrupted()
    except (KeyboardInterrupt, Terminated):
        return _interrupted()
    except BrokenPipeError:
        return _closed_stdout()
    except typer.TyperException as exc:
        # The parser's usage errors: wrong option, missing argument, bad value.
        if type(exc).__name__ == "NoArgsIsHelpError":
            write_err(exc.format_message() if hasattr(exc, "format_message") else str(exc))
            return 2
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        # The parser may stop before it reaches --json: then the words on the line tell.
        return _fail(UsageError(message, hint=_usage_hint(exc)), 2, _json_word(args))
    except OSError as exc:
        from matrixctl.io import changed_input

        changed = changed_input()
        if changed is not None:
            return _fail(changed, 2)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):  # a write: stdout or a file
            return _fail(from_os_error(exc, exc.filename or "<stdout>", writing=True), 2)
        return _fail(MatrixError(codes.IO_READ, exc.strerror or str(exc), path=exc.filename), 2)
    except Exception as exc:  # a bug: one line, the traceback only on request
        if os.environ.get("MATRIXCTL_DEBUG"):
            raise
        bug = MatrixError(
            codes.INTERNAL,
            f"internal error {type(exc).__name__}: {exc}",
            hint="rerun with MATRIXCTL_DEBUG=1 for the traceback and report it",
        )
        return _fail(bug, 70)


def _json_word(args: list[str]) -> bool:
    """`--json` among the options (before a `--` that ends them)."""
    words = list(args)
    return "--json" in (words[: words.index("--")] if "--" in words else words)


def _fail(err: MatrixError, exit_code: int, json_asked: bool = False) -> int:
    """The one error line on stderr; under --json also the failure document on stdout, unless
    the command already printed its own document (verify's report of invalid files)."""
    print_error(err)
    asked, done = common.json_state()
    if (asked or json_asked) and not done:
        with contextlib.suppress(OSError):  # stdout is gone: the error line said it all
            emit_json_error(err)
    return exit_code


def _interrupted() -> int:
    write_err(f"{PROG}: interrupted; no output was left behind")
    asked, done = common.json_state()
    if asked and not done:
        with contextlib.suppress(OSError):
            emit_json_error(
                MatrixError(codes.INTERRUPTED, "interrupted; no output was left behind")
            )
    return 130


def _closed_stdout() -> int:
    """The reader of our stdout went away (`| head`): stop quietly, without a traceback."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
