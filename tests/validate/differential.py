"""Shared pieces of the differential tests: run `verify` on a file and compare its verdict with
the one a format's reference library gives (docs/reliability.md, "Verdict classes").

The rule, for every case: where the reference reads the file, `verify` exits 0 (its verdict is
`intact` or `unsupported`); where the reference refuses it, `verify` exits 1 or 2 with an error
finding of the format's own codes (never a traceback, never INTERNAL).
"""

from __future__ import annotations

from pathlib import Path

from matrixctl.codes import Severity
from matrixctl.findings import FileReport
from matrixctl.validate.engine import examine


class Case:
    """One generated file: `name` is its file name (the extension matters only where no
    format's bytes claim it), `data` its bytes."""

    __slots__ = ("data", "id", "name")

    def __init__(self, id: str, name: str, data: bytes) -> None:
        self.id = id
        self.name = name
        self.data = data

    def write(self, folder: Path) -> Path:
        path = folder / self.name
        path.write_bytes(self.data)
        return path


def verify_report(path: Path) -> FileReport:
    return examine(str(path), scan=True)[0]


def assert_agrees(
    report: FileReport, reference_reads: bool, prefixes: tuple[str, ...], why: str = ""
) -> None:
    """`verify`'s verdict on a file agrees with the reference's (`reference_reads`); a refusal
    carries an error code starting with one of `prefixes` (the format's own codes)."""
    listing = [(f.code, f.severity.value, f.message) for f in report.findings]
    if reference_reads:
        assert report.exit_code() == 0, (why, listing)
        assert report.verdict() in ("intact", "unsupported"), (why, listing)
        return
    assert report.exit_code() in (1, 2), (why, "the reference refuses it", listing)
    errors = [f.code for f in report.findings if f.severity is Severity.ERROR]
    assert errors, (why, listing)
    assert "INTERNAL" not in errors, (why, listing)
    assert any(code.startswith(prefixes) for code in errors), (why, prefixes, listing)
