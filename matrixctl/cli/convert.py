"""`matrixctl convert`: from one format to another."""

from __future__ import annotations

from typing import Annotated

import typer

from matrixctl.cli.common import JsonOption, QuietOption, emit_json, note, warn


def convert(
    src: Annotated[
        str, typer.Argument(metavar="SRC", help="Input file (format sniffed from its bytes).")
    ],
    dst: Annotated[
        str,
        typer.Argument(metavar="DST", help="Output file; - writes to stdout (not a terminal)."),
    ],
    to: Annotated[
        str | None,
        typer.Option("--to", help="Output format, when the output name does not tell it."),
    ] = None,
    atoms: Annotated[
        str | None,
        typer.Option(
            "--atoms",
            metavar="A:B",
            help="svgt -> svg: the atoms to draw (default: the first 256).",
        ),
    ] = None,
    json_out: JsonOption = False,
    quiet: QuietOption = False,
) -> None:
    """Convert between formats. Today: SVG-Tensor to an SVG picture (`atoms.svgt atoms.svg`)."""
    from matrixctl import convert as conv
    from matrixctl.errors import UsageError
    from matrixctl.formats import registry
    from matrixctl.io import STDIO, Source

    if json_out and dst == STDIO:
        raise UsageError("--json needs stdout, so the output cannot be - as well")
    dst_fmt = conv.destination_format(dst, to)
    with Source.open(src) as source:
        src_fmt = registry.sniff(source)
        if src_fmt is None:
            from matrixctl.codes import UNKNOWN_FORMAT
            from matrixctl.errors import FormatError

            raise FormatError(
                UNKNOWN_FORMAT, "format not recognised from its bytes", path=source.name
            )
        converter = conv.find(src_fmt, dst_fmt)
        options = {"atoms": atoms}
        conv.check_options(converter, options)
        result = converter.load()(source, dst, options)
    for text in result.notes:
        warn(text)
    if json_out:
        emit_json({"input": src, "output": dst, "from": src_fmt, "to": dst_fmt, **result.summary})
    elif not quiet:
        note(f"converted {src_fmt} -> {dst_fmt}: {dst}")
