"""The spec's error object (`Issue`, also the shape of a warning) and `ScxFailure`, the
FormatError that carries one."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from matrixctl.errors import FormatError


@dataclass(frozen=True)
class Issue:
    """The spec's Error object (and, with the same shape, a Warning)."""

    code: str
    message: str
    byte_offset: int | None = None
    token_index: int | None = None
    context: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        position: dict[str, int] = {}
        if self.byte_offset is not None:
            position["byte_offset"] = self.byte_offset
        if self.token_index is not None:
            position["token_index"] = self.token_index
        return {
            "code": self.code,
            "message": self.message,
            "position": position,
            "context": dict(self.context),
        }

    def where(self) -> str:
        if self.token_index is not None:
            return f"token[{self.token_index}]"
        if self.byte_offset is not None:
            return f"byte[{self.byte_offset}]"
        return ""


class ScxFailure(FormatError):
    """A FormatError that carries the spec's error object (exit code 1 on the command line)."""

    def __init__(self, issue: Issue, *, offset: int | None = None) -> None:
        where = issue.where() or None
        if offset is None and issue.byte_offset is not None:
            offset = issue.byte_offset
        super().__init__(issue.code, issue.message, offset=offset, field=where)
        self.issue = issue


def fail(code: str, message: str, **kw: Any) -> ScxFailure:
    ctx = {k: str(v) for k, v in kw.pop("context", {}).items()}
    return ScxFailure(Issue(code, message, context=ctx, **kw))
