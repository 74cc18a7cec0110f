"""Rule registry and runner.

A rule is a function `subject -> Iterable[Finding]` registered for one format. Rules marked
`scan=True` read the payload (CRCs, digests, id ranges) and run only under `verify`; the others
check structure and run under `inspect` too. A rule that raises a `FormatError` becomes an error
finding; the remaining rules still run, and they skip themselves when what they need is broken.

One root cause, one finding: a rule registered with `cause=True` compares the file's length with
what its header declares and runs before the others. When it reports an error (the file is cut
short), every later finding only follows from the missing bytes: the other rules still run, but
their findings are counted in `FileReport.suppressed` instead of listed, except those of rules
registered with `header=True` (they read only the header, which the cut left whole).
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from matrixctl import codes
from matrixctl.codes import Severity
from matrixctl.errors import FormatError, InputError, MatrixError
from matrixctl.findings import FileReport, Finding, Problem, finding, findings_of, from_error
from matrixctl.io import Folder
from matrixctl.records import FrozenRecord

RuleFn = Callable[[Any], Iterable[Finding]]
F = TypeVar("F", bound=RuleFn)


class Rule(FrozenRecord):
    __slots__ = ("cause", "fn", "format", "header", "name", "scan")
    format: str
    name: str
    fn: RuleFn
    scan: bool
    cause: bool
    header: bool

    def __init__(
        self,
        format: str,
        name: str,
        fn: RuleFn,
        scan: bool,
        cause: bool = False,
        header: bool = False,
    ) -> None:
        self._init(format, name, fn, scan, cause, header)


_RULES: dict[str, list[Rule]] = {}
_FULL: contextvars.ContextVar[bool] = contextvars.ContextVar("full", default=False)


def shown(limit: int) -> int | None:
    """How many elements a description shows of a long array: `limit`, or None (all of them)
    under `inspect --full`. A shortened array always sits beside its `count` and `shown`
    (docs/json.md, "Shortened arrays"); it never ends in a placeholder element."""
    return None if _FULL.get() else limit


def sample(items: list[Any], count: int) -> dict[str, Any]:
    """A description's preview of `count` things: the first `shown` of them, never padded."""
    return {"count": count, "shown": len(items), "items": items}


def rule(
    fmt: str, name: str, *, scan: bool = False, cause: bool = False, header: bool = False
) -> Callable[[F], F]:
    """Register `fn` as a rule of format `fmt`. `name` is what reports list as checked.

    `cause=True` marks the rule that finds a truncated file (fewer bytes than the header
    declares): it runs first, and its error makes the findings of the other rules consequences.
    `header=True` marks a rule that reads only the header's own bytes: a cut after the header
    cannot cause its findings, so they are always listed.
    """

    def register(fn: F) -> F:
        rules = _RULES.setdefault(fmt, [])
        if any(r.name == name for r in rules):
            raise RuntimeError(f"rule {fmt}/{name} registered twice")
        rules.append(Rule(fmt, name, fn, scan, cause, header))
        _PLANS.pop((fmt, False), None)
        _PLANS.pop((fmt, True), None)
        return fn

    return register


def problem_rule(fmt: str, name: str, problems: Callable[[Any], Iterable[Problem]]) -> None:
    """Register the rule `name` of `fmt` that reports the problems its codec's parser recorded
    under that rule name (`problems(subject)` gives them all)."""
    rule(fmt, name)(lambda subject: findings_of(problems(subject), name))


def cut_short(code: str, size: int, want: int, field: str) -> Iterator[Finding]:
    """A cause rule's finding when the file (`size` bytes) is shorter than the length its
    header's `field` declares (`want`)."""
    if size < want:
        yield finding(
            code,
            f"file is {size:,} bytes; {field} says {want:,} (cut at byte {size:,})",
            offset=size,
            field=field,
        )


def first_nonzero(buf: Any, start: int, end: int, chunk: int = 1 << 20) -> int | None:
    """The offset of the first byte of `buf[start:end]` that is not 0x00, or None when every
    byte is zero. Each chunk is compared whole with zeros (memcmp speed); only a chunk that
    differs is searched."""
    end = min(end, len(buf))
    zeros = bytes(min(chunk, max(0, end - start)))
    for pos in range(start, end, chunk):
        piece = bytes(buf[pos : min(end, pos + chunk)])
        if piece != zeros[: len(piece)]:
            return pos + len(piece) - len(piece.lstrip(b"\x00"))
    return None


def rules_for(fmt: str) -> list[Rule]:
    return list(_RULES.get(fmt, []))


def _plan(fmt: str, scan: bool) -> tuple[tuple[Rule, ...], tuple[str, ...]]:
    """The rules of `fmt` to run (root-cause rules first, then in registration order) and the
    names of those skipped (scan rules, when `scan` is off): made once per format and mode,
    again only after a rule is registered."""
    plan = _PLANS.get((fmt, scan))
    if plan is None:
        ordered = sorted(rules_for(fmt), key=lambda r: not r.cause)  # stable
        run = tuple(r for r in ordered if scan or not r.scan)
        skipped = tuple(r.name for r in ordered if r.scan and not scan)
        plan = _PLANS[(fmt, scan)] = (run, skipped)
    return plan


_PLANS: dict[tuple[str, bool], tuple[tuple[Rule, ...], tuple[str, ...]]] = {}


def run_rules(fmt: str, subject: Any, report: FileReport, *, scan: bool) -> None:
    """Run the rules of `fmt` on `subject` into `report`, root-cause rules first."""
    run, skipped = _plan(fmt, scan)
    report.skipped.extend(skipped)
    checks = report.checks
    roots: set[str] = set()  # codes of root-cause errors
    for r in run:
        found: list[Finding] = []
        try:
            found.extend(r.fn(subject))
        except FormatError as err:
            found.append(from_error(err))
        checks.append(r.name)
        if not found:
            continue
        if roots and not (r.cause or r.header):
            # Consequences of the root cause: counted, not listed (a repeat is not counted).
            report.suppressed += sum(f.code not in roots for f in found)
            continue
        report.findings.extend(found)
        if r.cause:
            roots |= {f.code for f in found if f.severity is Severity.ERROR}


def handler(fmt: str) -> Any:
    """Import the module that loads, describes and validates `fmt` (lazily: start-up time)."""
    mod = _HANDLERS.get(fmt)
    if mod is None:
        from matrixctl.formats.registry import get

        mod = _HANDLERS[fmt] = importlib.import_module(get(fmt).handler)
    return mod


_HANDLERS: dict[str, Any] = {}  # format -> its handler module, once imported


def _load(load: Callable[[Any], Any], arg: Any, report: FileReport) -> Any:
    try:
        return load(arg)
    except FormatError as err:
        report.findings.append(from_error(err))
        report.checks.append("structure")
        return None


def examine(
    path: str,
    *,
    scan: bool,
    describe: bool = False,
    fmt: str | None = None,
    full: bool = False,
    ids: Any = None,
) -> tuple[FileReport, dict[str, Any] | None]:
    """Open, sniff and check one path; with `describe`, also return the format's description.

    `scan=True` runs every rule (verify); `scan=False` only the structural ones (inspect).
    `full=True` makes the description list every element of its long arrays (`shown`).
    Unreadable inputs give a report marked unreadable (exit code 2), never an exception.
    `ids` (a `matrixctl.validate.ids.IdPreview`) adds an id preview to the description of a
    format whose handler has `describe_ids` (token streams, MATRIX-ATOM).
    """
    token = _FULL.set(full)
    try:
        for attempt in range(100):
            report, desc = _examine_held(path, scan=scan, describe=describe, fmt=fmt, ids=ids)
            if not (report.unreadable and attempt < 99 and _swap_in_progress(path)):
                break
            import time

            time.sleep(0.01)  # between a writer's two renames: the new version is next
    finally:
        _FULL.reset(token)
    if scan and path != "-" and os.path.isdir(path):
        report.findings.extend(_stale_findings(path))
    elif path != "-":
        report.findings.extend(_torn_findings(path))
    return report, desc


def _torn_findings(path: str) -> list[Finding]:
    """A file of a set (an STB set) a killed run left half published: TORN_SET, an error."""
    from matrixctl.io import TORN_SET, set_members

    folder = os.path.dirname(os.path.abspath(path))
    name = os.path.basename(os.path.abspath(path))
    members = set_members(folder)
    if name not in members:
        return []
    others = sorted(members)
    return [
        finding(
            TORN_SET,
            f"is one of {', '.join(others)}, whose replacement a killed run left half done "
            f"({os.path.basename(members[name])} holds the rest); the next matrixctl run "
            "writing into this folder completes it",
            field=name,
        )
    ]


def _examine_held(
    path: str, *, scan: bool, describe: bool, fmt: str | None, ids: Any = None
) -> tuple[FileReport, dict[str, Any] | None]:
    """A folder is read through one directory handle (Linux: /proc/self/fd/N), so a folder
    renamed over the path while it is read does not mix members of two versions. A version
    replaced (and perhaps deleted) during the read is read again, the new one through a handle
    of its own, up to 200 times: a writer that replaces a pack every few milliseconds still
    leaves a reader a whole version, never a mix or a false finding."""
    if path == "-" or not os.path.isdir("/proc/self/fd"):
        return _examine(path, scan=scan, describe=describe, fmt=fmt, ids=ids)
    fd = _open_folder(path)
    if fd < 0:
        return _examine(path, scan=scan, describe=describe, fmt=fmt, ids=ids)
    try:
        for attempt in range(200):
            failure: MatrixError | OSError | None = None
            try:
                report, desc = _examine(
                    f"/proc/self/fd/{fd}", scan=scan, describe=describe, fmt=fmt, ids=ids
                )
            except (MatrixError, OSError) as exc:  # a member gone with a deleted version?
                failure = exc
            held = os.fstat(fd)
            now = _stat_when_back(path)
            if now is None or (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
                if failure is not None:
                    raise failure
                break
            if failure is not None and attempt == 199:
                raise failure
            # Replaced while it was read (and the old version may be being deleted): read the
            # new one, through a handle of its own.
            os.close(fd)
            fd = _open_folder(path)
            if fd < 0:  # gone for good: what was read belongs to a version that is gone
                return _examine(path, scan=scan, describe=describe, fmt=fmt, ids=ids)
    finally:
        if fd >= 0:
            os.close(fd)
    report.path = path
    return report, desc


def _open_folder(path: str) -> int:
    """A handle on the folder at `path`, waiting out the moment between a replacement's two
    renames (the path missing while a temporary name of it exists); -1 if it is no folder."""
    import time

    for _attempt in range(400):
        if os.path.isdir(path):
            try:
                return os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
            except OSError:
                pass
        if os.path.lexists(path) and not os.path.isdir(path):
            return -1
        if not os.path.lexists(path) and not _temp_names_of(path):
            return -1
        time.sleep(0.005)
    return -1


def _temp_names_of(path: str) -> list[str]:
    """The temporary names of this path in its folder (`.NAME.*.tmp`): while one exists, a
    writer may be replacing it, so a moment's absence is worth waiting out."""
    folder = os.path.dirname(os.path.abspath(path)) or "."
    base = os.path.basename(os.path.abspath(path))
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return [n for n in names if n.startswith(f".{base}.") and n.endswith(".tmp")]


def _stat_when_back(path: str, wait: float = 2.0) -> os.stat_result | None:
    """The path's stat; a path caught between a replacement's two renames (missing for a
    moment) is waited for, up to `wait` seconds. None if it stays missing."""
    import time

    deadline = time.monotonic() + wait
    while True:
        try:
            return os.stat(path)
        except FileNotFoundError:
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.005)
        except OSError:
            return None


def _swap_in_progress(path: str) -> bool:
    """The path is missing while a live matrixctl run holds a temporary name for it: a
    replacement is between its two renames."""
    if path == "-" or os.path.lexists(path):
        return False
    temps = _temp_names_of(path)
    if not temps:
        return False
    from matrixctl.io import stale_temps

    folder = os.path.dirname(os.path.abspath(path)) or "."
    dead = {os.path.basename(p) for p, _pid in stale_temps(folder)}
    return any(n not in dead for n in temps)


def _stale_findings(folder: str) -> list[Finding]:
    """verify of a folder: the temporary files and folders dead runs left in it."""
    from matrixctl.io import STALE_TEMP, aside_of, stale_temps

    out = []
    for path, pid in stale_temps(folder):
        name = os.path.basename(path)
        dest = aside_of(name)
        if name.split(".mx")[0].endswith(".set") and os.path.isdir(path):
            what = (
                "a file set a run (pid {pid}) was killed while putting in place (verify of "
                "its files reports TORN_SET); the next run writing into this folder completes it"
            )
        elif dest is None:
            what = "temporary output of a dead run (pid {pid}); the next run writing the same "
            what += "output removes it, or delete it"
        else:
            what = (
                f"the previous {dest}, set aside by a run (pid {{pid}}) killed while replacing "
                f"it; the next run writing {dest} puts it back if {dest} is missing, else "
                "removes it"
            )
        out.append(finding(STALE_TEMP, f"{name}: " + what.format(pid=pid), field=name))
    return out


def _examine(
    path: str, *, scan: bool, describe: bool, fmt: str | None, ids: Any = None
) -> tuple[FileReport, dict[str, Any] | None]:
    from matrixctl.formats import registry
    from matrixctl.opening import open_path

    name = "<stdin>" if path == "-" else path
    with contextlib.ExitStack() as stack:
        try:
            src, fmt = stack.enter_context(open_path(path, fmt))
        except MatrixError as err:
            report = FileReport(name, None, unreadable=isinstance(err, InputError))
            report.findings.append(from_error(err))
            return report, None
        if isinstance(src, Folder):
            assert fmt is not None
            report = FileReport(name, fmt)
            mod = handler(fmt)
            subject = _load(mod.load_dir, path, report)
            return _finish(mod, fmt, subject, report, scan=scan, describe=describe, ids=ids)
        if fmt is None:
            report = FileReport(src.name, None)
            head = src.head(8)
            message = (
                f"unrecognised leading bytes {head!r}" if head else "empty file: no format is empty"
            )
            report.findings.append(finding(codes.UNKNOWN_FORMAT, message, offset=0))
            hint = registry.explain_unknown(src)
            if hint:
                report.findings[-1] = finding(codes.UNKNOWN_FORMAT, hint, offset=0)
            return report, None
        report = FileReport(src.name, fmt)
        mod = handler(fmt)
        subject = _load(mod.load, src, report)
        return _finish(mod, fmt, subject, report, scan=scan, describe=describe, ids=ids)


def _finish(
    mod: Any,
    fmt: str,
    subject: Any,
    report: FileReport,
    *,
    scan: bool,
    describe: bool,
    ids: Any = None,
) -> tuple[FileReport, dict[str, Any] | None]:
    if subject is None:
        return report, None
    try:
        run_rules(fmt, subject, report, scan=scan)
        if not describe:
            return report, None
        desc = mod.describe(subject)
        if ids is not None and hasattr(mod, "describe_ids"):
            desc.update(mod.describe_ids(subject, ids))
        return report, desc
    finally:
        close = getattr(subject, "close", None)
        if close is not None:
            close()
