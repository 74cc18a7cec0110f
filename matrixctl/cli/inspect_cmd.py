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
    ids: Annotated[
        str | None,
        typer.Option(
            "--ids",
            metavar="START:COUNT",
            help="Token streams and MATRIX-ATOM files: preview COUNT ids from token index START "
            "(default 0:32, COUNT at most 4096).",
        ),
    ] = None,
    symbols: Annotated[
        str | None,
        typer.Option(
            "--symbols",
            "-s",
            metavar="MAP",
            help="A pi_symbol_map.json: show each previewed id's kind and text.",
        ),
    ] = None,
    json_out: JsonOption = False,
    full: Annotated[
        bool,
        typer.Option(
            "--full",
            help="List every element of long arrays (GGUF metadata, previews) instead of the "
            "first few; the JSON's count and shown say how many there are.",
        ),
    ] = False,
    stats: Annotated[
        bool,
        typer.Option(
            "--stats",
            help="Also read the payload for numbers: per tensor min, max, mean, std, zeros, NaN "
            "and Inf; for a pack, atom file or token stream: documents, tokens, length "
            "histogram, most frequent ids, padding share.",
        ),
    ] = False,
) -> None:
    """Show a file's format (sniffed from its bytes), header, sections and a preview.

    Runs the structural checks and shows their findings; payload scans (CRCs, digests, id
    ranges) are left to `verify`. Exit code 1 when a structural check fails, 2 when a path
    cannot be read. `--json` prints {"schema_version", "ok", "files": [{"path", "format",
    ...description, "findings", "checks", "skipped", "suppressed"}]}, one entry per path.
    `--stats` streams the contents (bounded memory) of a file whose structural checks pass; in
    `--json` each tensor gets a `stats` object, a token file a `stats` object.
    """
    from matrixctl.validate.engine import examine
    from matrixctl.validate.ids import IdPreview, parse_range

    start, count = parse_range(ids)
    smap = None
    if symbols is not None:
        from matrixctl.tokenizers.pi import load_symbol_map

        smap = load_symbol_map(symbols)[0]
    preview = IdPreview(start, count, smap)
    docs: list[dict[str, Any]] = []
    worst = 0
    for path in paths:
        report, desc = examine(path, scan=False, describe=True, full=full, ids=preview)
        numbers = _stats(path, report) if stats else None
        worst = max(worst, report.exit_code())
        if json_out:
            doc: dict[str, Any] = {"path": report.path, "format": report.format}
            doc.update(desc or {})
            doc["findings"] = [f.to_json() for f in report.findings]
            doc["checks"] = report.checks
            doc["skipped"] = report.skipped
            doc["suppressed"] = report.suppressed
            if stats:
                _attach(doc, numbers)
            docs.append(doc)
        else:
            from matrixctl.cli.render import render_description, render_stats

            render_description(report, desc)
            if stats:
                piped = path == "-" and report.ok() and not _stdin_is_file()
                render_stats(report, numbers, "stdin is a pipe: give a file" if piped else None)
    if json_out:
        emit_json({"files": docs}, ok=worst == 0)
    if worst:
        raise typer.Exit(worst)


def _stats(path: str, report: Any) -> dict[str, Any] | None:
    """The numbers of a file whose structural checks pass; a problem reading them becomes a
    finding of the report (exit 1). A pipe on stdin was consumed by the checks: no numbers."""
    if not report.ok() or report.format is None or (path == "-" and not _stdin_is_file()):
        return None
    from matrixctl.errors import FormatError
    from matrixctl.stats import stats_for
    from matrixctl.validate.findings import from_error

    try:
        return stats_for(path, report.format)
    except FormatError as err:
        report.findings.append(from_error(err))
        return None


def _stdin_is_file() -> bool:
    import os
    import stat
    import sys

    try:
        return stat.S_ISREG(os.fstat(sys.stdin.fileno()).st_mode)
    except (OSError, ValueError, AttributeError):
        return False


def _attach(doc: dict[str, Any], numbers: dict[str, Any] | None) -> None:
    """Each tensor row of the description gets its `stats`; token numbers go under `stats`."""
    rows = doc.get("tensors")
    if (numbers is not None and "tensors" not in numbers) or not isinstance(rows, list):
        doc["stats"] = numbers
        return
    tensors = numbers["tensors"] if numbers is not None else []
    by_name = {row["name"]: row["stats"] for row in tensors}
    for row in rows:
        name = row.get("name")
        if name is None and "tensor_id" in row:  # STB without its sidecar
            name = f"tensor_{row['tensor_id']}"
        row["stats"] = by_name.get(name)
