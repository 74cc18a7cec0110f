"""`matrixctl inspect`: what a file is and what it holds."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from matrixctl.cli.common import JsonOption, emit_json


def inspect(
    paths: Annotated[
        list[str],
        typer.Argument(metavar="PATH...", help="Files or folders to look inside; - is stdin."),
    ],
    json_out: JsonOption = False,
    full: Annotated[
        bool,
        typer.Option(
            "--full",
            help="List every element of long arrays (GGUF metadata, previews) instead of the "
            "first few; the JSON's count and shown say how many there are.",
        ),
    ] = False,
) -> None:
    """Show a file's format (sniffed from its bytes), header, sections and a preview.

    Runs the structural checks and shows their findings; payload scans (CRCs, digests, id
    ranges) are left to `verify`. Exit code 1 when a structural check fails, 2 when a path
    cannot be read. `--json` prints {"schema_version", "ok", "files": [{"path", "format",
    ...description, "findings", "checks", "skipped"}]}, one entry per path.
    """
    from matrixctl.validate.engine import examine

    docs: list[dict[str, Any]] = []
    worst = 0
    for path in paths:
        report, desc = examine(path, scan=False, describe=True, full=full)
        worst = max(worst, report.exit_code())
        if json_out:
            doc: dict[str, Any] = {"path": report.path, "format": report.format}
            doc.update(desc or {})
            doc["findings"] = [f.to_json() for f in report.findings]
            doc["checks"] = report.checks
            doc["skipped"] = report.skipped
            docs.append(doc)
        else:
            from matrixctl.cli.render import render_description

            render_description(report, desc)
    if json_out:
        emit_json({"files": docs}, ok=worst == 0)
    if worst:
        raise typer.Exit(worst)
