"""The options every command shares, as typer annotations (`from matrixctl.cli.common import
JsonOption` still works: common.py hands them out without importing typer itself)."""

from __future__ import annotations

from typing import Annotated

import typer

from matrixctl.cli.common import _set_json, _set_quiet, _set_spool_limit

JsonOption = Annotated[
    bool,
    typer.Option(
        "--json",
        callback=_set_json,
        help="Write one JSON document to stdout instead of a report.",
    ),
]

QuietOption = Annotated[
    bool,
    typer.Option(
        "--quiet",
        "-q",
        callback=_set_quiet,
        help="Nothing on stderr when all went well (warnings and errors still print).",
    ),
]

# Every command that reads stdin (`-`) or a path that is a pipe or device takes it.
SpoolLimitOption = Annotated[
    str | None,
    typer.Option(
        "--spool-limit",
        metavar="SIZE",
        callback=_set_spool_limit,
        help="Refuse stdin or a pipe/device path longer than SIZE (e.g. 512M; default 4G, "
        "or MATRIXCTL_SPOOL_LIMIT).",
    ),
]
