"""The options every command shares, as typer annotations (`from matrixctl.cli.common import
JsonOption` still works: common.py hands them out without importing typer itself)."""

from __future__ import annotations

from typing import Annotated

import typer

from matrixctl.cli.common import _set_json, _set_quiet

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
