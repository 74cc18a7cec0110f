"""`matrixctl inspect`: what a file is and what it holds."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from matrixctl.cli.common import JsonOption, SpoolLimitOption, emit_json


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
    spool_limit: SpoolLimitOption = None,
) -> None:
    """Show a file's format (sniffed from its bytes), header, sections and a preview.

    Runs the structural checks and shows their findings; payload scans (CRCs, digests, id
    ranges) are left to `verify`. Exit code 1 when a structural check fails, 2 when a path
    cannot be read. `--json` prints {"schema_version", "ok", "files": [{"path", "format",
    ...description, "findings", "checks", "skipped", "suppressed"}]}, one entry per path.
    `--stats` streams the contents (bounded memory) of a file whose structural checks pass; in
    `--json` each tensor gets a `stats` object, a token file a `stats` object.
    """
    from matrixctl.inspection import inspect_path, stdin_is_file
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
        seen = inspect_path(path, full=full, stats=stats, ids=preview)
        report = seen.report
        worst = max(worst, report.exit_code())
        if json_out:
            docs.append(seen.entry())
        else:
            from matrixctl.cli.render import render_description, render_stats

            render_description(report, seen.description)
            if stats:
                piped = path == "-" and report.ok() and not stdin_is_file()
                why = "stdin is a pipe: give a file" if piped else None
                render_stats(report, seen.numbers, why)
    if json_out:
        emit_json({"files": docs}, ok=worst == 0)
    if worst:
        raise typer.Exit(worst)
