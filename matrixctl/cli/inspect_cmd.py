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
) -> None:
    """Show a file's format (sniffed from its bytes), header, sections and a preview.

    Runs the structural checks and shows their findings; payload scans (CRCs, digests, id
    ranges) are left to `verify`. Exit code 1 when a structural check fails, 2 when a path
    cannot be read.
    """
    from matrixctl.validate.engine import examine

    docs: list[dict[str, Any]] = []
    worst = 0
    for path in paths:
        report, desc = examine(path, scan=False, describe=True)
        worst = max(worst, report.exit_code())
        if json_out:
            doc: dict[str, Any] = {"path": report.path, "format": report.format}
            doc.update(desc or {})
            doc["findings"] = [f.to_json() for f in report.findings]
            doc["checks"] = report.checks
            doc["skipped"] = report.skipped
            doc["suppressed"] = report.suppressed
            docs.append(doc)
        else:
            from matrixctl.cli.render import render_description

            render_description(report, desc)
    if json_out:
        emit_json(docs[0] if len(docs) == 1 else docs)
    if worst:
        raise typer.Exit(worst)
