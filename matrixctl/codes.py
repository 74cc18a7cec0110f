"""The registry of stable diagnostic codes.

Every finding a validator reports and every error a codec or command raises carries one of these
codes. Codes are part of the public contract (scripts match on them, docs/errors.md lists them), so
a code is never renamed or reused for another meaning. Modules declare their codes at import time
with `define`, next to the code that raises them.
"""

from __future__ import annotations

from enum import StrEnum

from matrixctl.records import FrozenRecord


class Severity(StrEnum):
    """How bad a finding is. `error` makes a file invalid; `warning` only under --strict."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


class CodeInfo(FrozenRecord):
    __slots__ = ("code", "group", "severity", "summary")
    code: str
    summary: str
    group: str
    severity: Severity

    def __init__(self, code: str, summary: str, group: str, severity: Severity) -> None:
        self._init(code, summary, group, severity)


CODES: dict[str, CodeInfo] = {}
# Codes of the third verdict: the file is intact, but holds something matrixctl does not
# convert (a structured .npy, a safetensors dtype it has no type for). Info severity: verify
# passes the file (exit 0), `convert` refuses it (CONVERT_NOT_TENSOR).
UNSUPPORTED: set[str] = set()


def define(
    code: str,
    summary: str,
    *,
    group: str,
    severity: Severity = Severity.ERROR,
    unsupported: bool = False,
) -> str:
    """Declare a code once and return it, so modules can write `X = define("X", ...)`.
    `unsupported=True` declares a code of the third verdict (intact, not convertible): its
    severity is info."""
    if unsupported:
        severity = Severity.INFO
        UNSUPPORTED.add(code)
    info = CodeInfo(code, summary, group, severity)
    known = CODES.get(code)
    if known is not None and known != info:
        raise RuntimeError(f"diagnostic code {code} is defined twice with different meanings")
    CODES[code] = info
    return code


def severity_of(code: str) -> Severity:
    info = CODES.get(code)
    return info.severity if info is not None else Severity.ERROR


# Codes shared by every command. Format-specific codes live beside their codec.
G = "general"
USAGE = define("USAGE", "A command-line argument or option is wrong.", group=G)
IO_NOT_FOUND = define("IO_NOT_FOUND", "An input path does not exist.", group=G)
IO_IS_DIR = define("IO_IS_DIR", "A file was expected but the path is a folder.", group=G)
IO_PERMISSION = define(
    "IO_PERMISSION", "A path cannot be read or written for lack of permission.", group=G
)
IO_READ = define("IO_READ", "The operating system failed to read an input.", group=G)
IO_WRITE = define("IO_WRITE", "The operating system failed to write an output.", group=G)
OUT_TTY = define(
    "OUT_TTY",
    "Binary output to a terminal was refused; redirect it or name an output file.",
    group=G,
)
OUT_NO_SPACE = define(
    "OUT_NO_SPACE",
    "An output could not be written: no space left on the device or quota (ENOSPC, EDQUOT).",
    group=G,
)
OUT_TOO_LARGE = define(
    "OUT_TOO_LARGE",
    "An output exceeds the file size limit (ulimit -f) or the file system's (EFBIG).",
    group=G,
)
OUT_EXISTS_DIR = define("OUT_EXISTS_DIR", "An output path names an existing folder.", group=G)
UNKNOWN_FORMAT = define(
    "UNKNOWN_FORMAT", "The file's leading bytes match no format matrixctl knows.", group=G
)
TRUNCATED = define(
    "TRUNCATED", "The input ends before a structure it declares is complete.", group=G
)
INTERRUPTED = define(
    "INTERRUPTED", "The command was interrupted; no output was left behind.", group=G
)
INTERNAL = define(
    "INTERNAL", "A bug in matrixctl; please report it with the command line.", group=G
)
