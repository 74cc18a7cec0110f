"""The shared validation engine: findings, per-format rules, reports.

Each format contributes one module (named in `matrixctl.formats.registry`) that defines
`load(source)`, `describe(subject)` and rules registered with `@rule(format, name)`. `verify`
runs every rule; `inspect` runs the cheap ones (no payload scans) and shows the same findings.
"""

from matrixctl.findings import FileReport, Finding, finding

__all__ = ["FileReport", "Finding", "finding"]
