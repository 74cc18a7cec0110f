"""Findings (one problem found in a file), the problems a codec's lenient parser records, and
the report of one file."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from matrixctl.codes import Severity, severity_of
from matrixctl.errors import MatrixError


@dataclass(frozen=True)
class Finding:
    code: str
    severity: Severity
    message: str
    offset: int | None = None
    field: str | None = None

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


@dataclass(frozen=True)
class Problem:
    """One problem a codec's lenient parser found and read past (every format's parser records
    this one type). The format's handler in `matrixctl/validate/` reports it as a `Finding`;
    `rule` names the rule that reports it when a codec splits its problems among several."""

    code: str
    message: str
    offset: int | None = None
    field: str | None = None
    rule: str | None = None

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


@dataclass
class FileReport:
    """What was checked in one file and what was found."""

    path: str
    format: str | None
    findings: list[Finding] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    unreadable: bool = False
    # Findings that only follow from a root cause (a truncated file): counted, not listed.
    suppressed: int = 0

    def count(self, severity: Severity) -> int:
        return sum(1 for f in self.findings if f.severity is severity)

    def ok(self, strict: bool = False) -> bool:
        if self.unreadable or self.count(Severity.ERROR):
            return False
        return not (strict and self.count(Severity.WARNING))

    def exit_code(self, strict: bool = False) -> int:
        if self.unreadable:
            return 2
        return 0 if self.ok(strict) else 1

    def to_json(self, strict: bool = False) -> dict[str, Any]:
        return {
            "path": self.path,
            "format": self.format,
            "ok": self.ok(strict),
            "findings": [f.to_json() for f in self.findings],
            "checks": list(self.checks),
            "skipped": list(self.skipped),
            "suppressed": self.suppressed,
        }
