"""`matrixctl convert`: one registry of converters between formats.

A converter is found by (source format, destination format). The source format is sniffed from
the file's bytes; the destination format comes from `--to` or, failing that, from the output
file's extension (an output has no bytes to sniff yet). Each converter is a function
`convert(source, dst_path, options) -> Result` in a module imported only when used; `source` is
the opened input (`matrixctl.io.Source`), so stdin works too.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from matrixctl import codes
from matrixctl.errors import UsageError

if TYPE_CHECKING:
    from matrixctl.io import Source

CONVERT_UNSUPPORTED = codes.define(
    "CONVERT_UNSUPPORTED", "No converter exists between the two formats.", group="convert"
)


@dataclass
class Result:
    """What a conversion did, for the command to report (never printed by the converter)."""

    summary: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


ConvertFn = Callable[["Source", str, dict[str, Any]], Result]


@dataclass(frozen=True)
class Converter:
    src: str
    dst: str
    target: str  # "module:function"
    options: tuple[str, ...] = ()

    def load(self) -> ConvertFn:
        module, _, name = self.target.partition(":")
        fn: ConvertFn = getattr(importlib.import_module(module), name)
        return fn


CONVERTERS: list[Converter] = [
    Converter("svgt", "svg", "matrixctl.convert.svg:svgt_to_svg", options=("atoms",)),
]

# Destination format by output extension (outputs only: inputs are always sniffed).
OUTPUT_EXTENSIONS: dict[str, str] = {".svg": "svg"}


def destination_format(dst: str, to: str | None) -> str:
    if to:
        known = {c.dst for c in CONVERTERS}
        if to not in known:
            raise UsageError(
                f"--to {to!r} is not a format convert can write ({', '.join(sorted(known))})"
            )
        return to
    ext = os.path.splitext(dst)[1].lower()
    fmt = OUTPUT_EXTENSIONS.get(ext)
    if fmt is None:
        raise UsageError(
            f"cannot tell the output format from {dst!r}",
            hint=f"name it with one of {', '.join(sorted(OUTPUT_EXTENSIONS))} or pass --to FORMAT",
        )
    return fmt


def find(src_fmt: str, dst_fmt: str) -> Converter:
    for conv in CONVERTERS:
        if conv.src == src_fmt and conv.dst == dst_fmt:
            return conv
    sources = sorted({c.src for c in CONVERTERS if c.dst == dst_fmt})
    raise UsageError(
        f"cannot convert {src_fmt} to {dst_fmt}",
        code=CONVERT_UNSUPPORTED,
        hint=f"{dst_fmt} can be made from: {', '.join(sources) or 'nothing yet'}",
    )


def check_options(conv: Converter, options: dict[str, Any]) -> None:
    for name, value in options.items():
        if value is not None and name not in conv.options:
            flag = "--" + name.replace("_", "-")
            raise UsageError(f"{flag} does not apply to {conv.src} -> {conv.dst}")
