"""The `matrixctl` command: the root app, the command groups, and the one exit path.

`main()` is the only place that turns exceptions into an error line and an exit code:
0 success, 1 input read but invalid, 2 usage error or unreadable input, 130 interrupted,
70 internal error (a bug); the mapping of the commands' own failures is `entry.failure`, which
the start-up fast path of `tokenize pi encode` (cli/entry.py) shares. No traceback reaches
the user unless MATRIXCTL_DEBUG=1.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from matrixctl.cli.common import PROG, write_err
from matrixctl.cli.entry import fail, failure, interrupted, json_word, start_run
from matrixctl.cli.lazy import Lazy, LazyCommands
from matrixctl.errors import UsageError
from matrixctl.package import __version__

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
    start_run()
    command = command_tree()
    try:
        try:
            # Not command.main(): it would swallow Ctrl-C and a closed stdout itself.
            with command.make_context(PROG, list(args)) as ctx:
                result = command.invoke(ctx)
            code = result if isinstance(result, int) else 0
        finally:
            sys.stdout.flush()
        return code
    except typer.Exit as exc:
        return int(exc.exit_code)
    except typer.Abort:
        return interrupted()
    except typer.TyperException as exc:
        # The parser's usage errors: wrong option, missing argument, bad value.
        if type(exc).__name__ == "NoArgsIsHelpError":
            write_err(exc.format_message() if hasattr(exc, "format_message") else str(exc))
            return 2
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        # The parser may stop before it reaches --json: then the words on the line tell.
        return fail(UsageError(message, hint=_usage_hint(exc)), 2, json_word(args))
    except BaseException as exc:  # the command's own failures: one mapping for both paths
        return failure(exc)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
