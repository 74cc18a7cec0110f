"""`SOURCE_DATE_EPOCH`: the one reader of the time outputs may record (reproducible builds).

No output carries wall-clock time (docs/architecture.md, "Same inputs, same bytes"): a format
that records a creation time takes it from an explicit option or from here. The variable, when
set and not blank, must be a whole number of seconds since 1970-01-01 UTC; anything else is a
usage error with one message wherever it is read (before this module, the npz writer ignored a
bad value and the SCX and ingest writers took a negative one).
"""

from __future__ import annotations

import os

from matrixctl.errors import UsageError


def source_date_epoch() -> int | None:
    """The seconds of `SOURCE_DATE_EPOCH`, or None when it is unset or blank."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    if not epoch:
        return None
    if not epoch.isdigit() or not epoch.isascii():
        raise UsageError(f"SOURCE_DATE_EPOCH must be a whole number of seconds, got {epoch!r}")
    return int(epoch)


def source_date_text() -> str | None:
    """`SOURCE_DATE_EPOCH` as `YYYY-MM-DDTHH:MM:SSZ` (UTC), or None when it is not set."""
    seconds = source_date_epoch()
    if seconds is None:
        return None
    import datetime  # only when the variable is set (start-up time)

    try:
        when = datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)
    except (ValueError, OverflowError, OSError):
        raise UsageError(
            f"SOURCE_DATE_EPOCH must be a whole number of seconds, got {str(seconds)!r}"
        ) from None
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")
