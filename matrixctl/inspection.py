"""What `inspect` computes for one path, for the CLI (`matrixctl inspect`) and the Python API
(`matrixctl.inspect`) alike: the structural report, the format's description, and with
`stats` the numbers read from the payload. `Inspection.entry()` is the path's entry of the
`--json` document (docs/json.md); the API returns the whole document built from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from matrixctl.findings import FileReport


@dataclass
class Inspection:
    path: str
    report: FileReport
    description: dict[str, Any] | None
    numbers: dict[str, Any] | None
    stats: bool

    def entry(self) -> dict[str, Any]:
        """This path's entry of the `--json` document."""
        report = self.report
        doc: dict[str, Any] = {"path": report.path, "format": report.format}
        doc.update(self.description or {})
        doc["findings"] = [f.to_json() for f in report.findings]
        doc["checks"] = report.checks
        doc["skipped"] = report.skipped
        doc["suppressed"] = report.suppressed
        if self.stats:
            attach_stats(doc, self.numbers)
        return doc


def inspect_path(
    path: str, *, full: bool = False, stats: bool = False, ids: Any = None
) -> Inspection:
    """Open, sniff and structurally check `path`, describe it, and with `stats` read its
    numbers. `ids` is the id preview (`matrixctl.validate.ids.IdPreview`; None: the default
    one, as `inspect` without --ids). Never raises for a bad input: the report carries it."""
    from matrixctl.validate.engine import examine
    from matrixctl.validate.ids import IdPreview

    preview = IdPreview() if ids is None else ids
    report, desc = examine(path, scan=False, describe=True, full=full, ids=preview)
    numbers = read_stats(path, report) if stats else None
    return Inspection(path, report, desc, numbers, stats)


def read_stats(path: str, report: FileReport) -> dict[str, Any] | None:
    """The numbers of a file whose structural checks pass; a problem reading them becomes a
    finding of the report (exit 1). A pipe on stdin was consumed by the checks: no numbers.
    Nor for an intact file matrixctl does not read as tensors (the "unsupported" verdict: its
    info finding says why)."""
    if not report.ok() or report.format is None or (path == "-" and not stdin_is_file()):
        return None
    if report.verdict() == "unsupported":
        return None
    from matrixctl.errors import FormatError
    from matrixctl.findings import from_error
    from matrixctl.stats import stats_for

    try:
        return stats_for(path, report.format)
    except FormatError as err:
        report.findings.append(from_error(err))
        return None


def stdin_is_file() -> bool:
    import os
    import stat
    import sys

    try:
        return stat.S_ISREG(os.fstat(sys.stdin.fileno()).st_mode)
    except (OSError, ValueError, AttributeError):
        return False


def attach_stats(doc: dict[str, Any], numbers: dict[str, Any] | None) -> None:
    """Each tensor row of the description gets its `stats`; token numbers go under `stats`."""
    rows = doc.get("tensors")
    if (numbers is not None and "tensors" not in numbers) or not isinstance(rows, list):
        doc["stats"] = numbers
        return
    tensors = numbers["tensors"] if numbers is not None else []
    by_name = {row["name"]: row["stats"] for row in tensors}
    for row in rows:
        name = row.get("name")
        if name is None and "tensor_id" in row:  # STB without its sidecar
            name = f"tensor_{row['tensor_id']}"
        row["stats"] = by_name.get(name)
