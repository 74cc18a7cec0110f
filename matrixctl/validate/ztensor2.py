"""zTensor v2 files: recognised and reported in one line (see matrixctl.formats.ztensor2)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from matrixctl.formats import ztensor2
from matrixctl.io import Source
from matrixctl.validate.engine import rule
from matrixctl.validate.findings import Finding, from_error

FMT = ztensor2.FORMAT


class Zt2Subject:
    def __init__(self, src: Source) -> None:
        self.src = src
        self.footer = ztensor2.footer(src.buf, src.size)


def load(src: Source) -> Zt2Subject:
    return Zt2Subject(src)


def describe(s: Zt2Subject) -> dict[str, Any]:
    out: dict[str, Any] = {"size": s.src.size}
    if s.footer:
        out["footer"] = s.footer
    return out


@rule(FMT, "zTensor version")
def check_version(s: Zt2Subject) -> Iterator[Finding]:
    err = ztensor2.unsupported(s.src)
    err.path = None
    yield from_error(err)
