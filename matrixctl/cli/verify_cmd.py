"""`matrixctl verify`: every check the specs imply, as findings."""

from __future__ import annotations

from typing import Annotated

import typer

from matrixctl.cli.common import JsonOption, QuietOption, SpoolLimitOption, emit_json


def verify(
    paths: Annotated[
        list[str],
        typer.Argument(
            metavar="PATH...", help="Files to verify, or ingest-pack folders; - is stdin."
        ),
    ],
    json_out: JsonOption = False,
    strict: Annotated[
        bool, typer.Option("--strict", help="Treat warnings as failures too.")
    ] = False,
    quiet: QuietOption = False,
    allow_unknown_digest: Annotated[
        bool,
        typer.Option(
            "--allow-unknown-digest",
            help="Report a digest whose algorithm is unknown or whose key is damaged as a "
            "warning instead of an error (also MATRIXCTL_ALLOW_UNKNOWN_DIGEST=1).",
        ),
    ] = False,
    spool_limit: SpoolLimitOption = None,
) -> None:
    """Check files completely: structure, sizes, offsets, padding, checksums, id ranges.

    With --quiet only files with findings are reported, so a clean run prints nothing.
    Exit code 0 when every file is valid, 1 when a file was read but is invalid, 2 when a path
    cannot be read. A file that is intact but not something matrixctl converts (a structured
    .npy) passes with an info finding: its verdict is "unsupported". `--json` prints
    {"schema_version", "ok", "strict", "files": [{"path", "format", "ok", "verdict", "findings",
    "checks", "skipped", "suppressed"}]}; "verdict" is intact, unsupported, damaged or
    unreadable; "suppressed" counts the findings that only follow from a truncated file's root
    cause.
    """
    from matrixctl.integrity import set_allow_unknown
    from matrixctl.validate.engine import examine

    set_allow_unknown(allow_unknown_digest)

    reports = [examine(path, scan=True)[0] for path in paths]
    worst = max(r.exit_code(strict) for r in reports)
    if json_out:
        emit_json(
            {"strict": strict, "files": [r.to_json(strict) for r in reports]},
            ok=all(r.ok(strict) for r in reports),
        )
    else:
        from matrixctl.cli.render import render_verify

        shown = [r for r in reports if r.findings or r.unreadable] if quiet else reports
        if shown:
            render_verify(shown, strict)
    if worst:
        raise typer.Exit(worst)
