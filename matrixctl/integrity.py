"""What a damaged integrity field does to the verdict.

A digest or checksum whose algorithm is unknown or whose text cannot be read is an error by
default: one changed byte must not turn a checked file into an unchecked one. A user who
knowingly holds files with digests matrixctl cannot compute relaxes that to a warning with
`verify --allow-unknown-digest` or `MATRIXCTL_ALLOW_UNKNOWN_DIGEST=1` (any command).
"""

from __future__ import annotations

import os

from matrixctl.codes import Severity

ENV_ALLOW_UNKNOWN = "MATRIXCTL_ALLOW_UNKNOWN_DIGEST"

_allow_unknown = False


def set_allow_unknown(allow: bool) -> None:
    """Set by the command line (`verify --allow-unknown-digest`) for this process."""
    global _allow_unknown
    _allow_unknown = allow


def allow_unknown() -> bool:
    return _allow_unknown or os.environ.get(ENV_ALLOW_UNKNOWN, "") not in ("", "0")


def unknown_severity() -> Severity:
    """ERROR by default; WARNING when the user relaxed it."""
    return Severity.WARNING if allow_unknown() else Severity.ERROR
