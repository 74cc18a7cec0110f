"""The arguments and options `tokenize pi` and `tokenize model` share (their encode reads text
and writes a token stream or ids; their decode reads a stream or ids and writes text)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer

TextInput = Annotated[
    str,
    typer.Argument(metavar="[INPUT|-]", help="UTF-8 text; - or nothing reads stdin."),
]
TokenInput = Annotated[
    str,
    typer.Argument(
        metavar="[INPUT|-]",
        help="A token stream, or whitespace-separated decimal ids; - or nothing reads stdin.",
    ),
]
StreamOutput = Annotated[
    str,
    typer.Option(
        "-o",
        "--output",
        help="Output; - is stdout (a binary token stream is refused on a terminal).",
    ),
]
TextOutput = Annotated[str, typer.Option("-o", "--output", help="Text output; - is stdout.")]
IdsFlag = Annotated[
    bool,
    typer.Option(
        "--ids",
        help="Write the ids as text instead of a token stream: decimal, space-separated, "
        "one line per document (the whole input is one document); `decode` and `pack "
        "atoms` read it back.",
    ),
]
LabelOption = Annotated[
    str | None,
    typer.Option("--label", help="Label of the document frame. Default: the input path."),
]


class DecodeErrors(StrEnum):
    STRICT = "strict"
    REPLACE = "replace"
