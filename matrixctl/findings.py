"""Findings (one problem found in a file), the problems a codec's lenient parser records, and
the report of one file."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from matrixctl.codes import UNSUPPORTED, Severity, severity_of
from matrixctl.errors import MatrixError
from matrixctl.records import FrozenRecord, Record


class Finding(FrozenRecord):
    __slots__ = ("code", "field", "message", "offset", "severity")
    code: str
    severity: Severity
    message: str
    offset: int | None
    field: str | None

    def __init__(
        self,
        code: str,
        severity: Severity,
        message: str,
        offset: int | None = None,
        field: str | None = None,
    ) -> None:
        self._init(code, severity, message, offset, field)

    def to_json(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "severity": self.severity.value,
            "message": self.message,
            "offset": self.offset,
            "field": self.field,
        }


def finding(
    code: str,
    message: str,
    *,
    offset: int | None = None,
    field: str | None = None,
    severity: Severity | None = None,
) -> Finding:
    """A finding whose severity defaults to the one its code was defined with."""
    return Finding(code, severity or severity_of(code), message, offset, field)


def from_error(err: MatrixError) -> Finding:
    return Finding(err.code, Severity.ERROR, err.message, err.offset, err.field)


class Problem(FrozenRecord):
    """One problem a codec's lenient parser found and read past (every format's parser records
    this one type). The format's handler in `matrixctl/validate/` reports it as a `Finding`;
    `rule` names the rule that reports it when a codec splits its problems among several."""

    __slots__ = ("code", "field", "message", "offset", "rule")
    code: str
    message: str
    offset: int | None
    field: str | None
    rule: str | None

    def __init__(
        self,
        code: str,
        message: str,
        offset: int | None = None,
        field: str | None = None,
        rule: str | None = None,
    ) -> None:
        self._init(code, message, offset, field, rule)

    @property
    def severity(self) -> Severity:
        return severity_of(self.code)

    def finding(self) -> Finding:
        return finding(self.code, self.message, offset=self.offset, field=self.field)


def findings_of(problems: Iterable[Problem], rule: str | None = None) -> Iterator[Finding]:
    """The problems as findings, in the order recorded; only those of `rule` when given."""
    for p in problems:
        if rule is None or p.rule == rule:
            yield p.finding()


def has_error(problems: Iterable[Problem], *rules: str) -> bool:
    """Whether a problem of error severity was recorded (under one of `rules`, when given)."""
    return any(p.severity is Severity.ERROR and (not rules or p.rule in rules) for p in problems)


class FileReport(Record):
    """What was checked in one file and what was found. `suppressed` counts the findings that
    only follow from a root cause (a truncated file): counted, not listed."""

    __slots__ = ("checks", "findings", "format", "path", "skipped", "suppressed", "unreadable")

    def __init__(
        self,
        path: str,
        format: str | None,
        findings: list[Finding] | None = None,
        checks: list[str] | None = None,
        skipped: list[str] | None = None,
        unreadable: bool = False,
        suppressed: int = 0,
    ) -> None:
        self.path = path
        self.format = format
        self.findings: list[Finding] = [] if findings is None else findings
        self.checks: list[str] = [] if checks is None else checks
        self.skipped: list[str] = [] if skipped is None else skipped
        self.unreadable = unreadable
        self.suppressed = suppressed

    def count(self, severity: Severity) -> int:
        return sum(1 for f in self.findings if f.severity is severity)

    def ok(self, strict: bool = False) -> bool:
        if self.unreadable or self.count(Severity.ERROR):
            return False
        return not (strict and self.count(Severity.WARNING))

    def verdict(self) -> str:
        """The verdict class: "unreadable" (the path could not be read: exit 2), "damaged" (an
        error finding: exit 1), "unsupported" (intact, but holding what matrixctl does not
        convert: an info finding of an `unsupported` code, exit 0) or "intact" (exit 0).
        Warnings leave the verdict as it is (`ok(strict=True)` fails on them)."""
        if self.unreadable:
            return "unreadable"
        if self.count(Severity.ERROR):
            return "damaged"
        if any(f.code in UNSUPPORTED for f in self.findings):
            return "unsupported"
        return "intact"

    def exit_code(self, strict: bool = False) -> int:
        if self.unreadable:
            return 2
        return 0 if self.ok(strict) else 1

    def to_json(self, strict: bool = False) -> dict[str, Any]:
        return {
            "path": self.path,
            "format": self.format,
            "ok": self.ok(strict),
            "verdict": self.verdict(),
            "findings": [f.to_json() for f in self.findings],
            "checks": list(self.checks),
            "skipped": list(self.skipped),
            "suppressed": self.suppressed,
        }
