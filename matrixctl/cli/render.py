"""Human renderings of inspect descriptions and verify reports, on stderr.

The renderers draw the same data the `--json` documents carry: a description is a dict whose
scalar entries form a summary table, whose dict entries become key/value tables and whose lists of
dicts become tables. Every string is passed through `safe()` first, so a hostile file cannot send
escape sequences to the terminal.
"""

from __future__ import annotations

from typing import Any

from matrixctl.cli.common import console, safe
from matrixctl.codes import Severity
from matrixctl.findings import FileReport

SEVERITY_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}


def _text(value: Any) -> Any:
    from rich.text import Text

    if value is None:
        return Text("-", style="dim")
    if isinstance(value, bool):
        return Text("yes" if value else "no")
    if isinstance(value, int):
        return Text(f"{value:,}" if abs(value) >= 10_000 else str(value))
    if isinstance(value, list) and all(not isinstance(v, dict | list) for v in value):
        return Text(safe(", ".join(str(v) for v in value)))
    return Text(safe(value))


def _kv_table(title: str, data: dict[str, Any]) -> Any:
    from rich.table import Table

    table = Table(title=safe(title), title_justify="left", show_header=False, box=None)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    for key, value in data.items():
        shown = (
            ", ".join(f"{k}={v}" for k, v in value.items()) if isinstance(value, dict) else value
        )
        table.add_row(_text(key), _text(shown))
    return table


def _flat(row: dict[str, Any]) -> dict[str, Any]:
    """A row as people read it: a tensor row's `extra` entries become columns of their own,
    and a shortened list says how many items it leaves out (`count` and `shown` beside it)."""
    out = {k: v for k, v in row.items() if k != "extra"}
    extra = row.get("extra")
    if isinstance(extra, dict):
        out.update((k, v) for k, v in extra.items() if k not in out)
    if "count" in out and "shown" in out:
        count, shown = out["count"], out.pop("shown")
        if isinstance(count, int) and isinstance(shown, int) and count > shown:
            for key, value in out.items():
                if isinstance(value, list):
                    out[key] = [*value, f"... {count - shown:,} more"]
    return out


def _list_table(title: str, rows: list[dict[str, Any]]) -> Any:
    from rich.table import Table

    rows = [_flat(row) for row in rows]
    table = Table(title=safe(title), title_justify="left")
    columns: list[str] = []
    for row in rows:
        for key in row:
            if key not in columns:
                columns.append(key)
    for col in columns:
        table.add_column(safe(col), overflow="fold")
    for row in rows:
        table.add_row(*(_text(row.get(col)) for col in columns))
    return table


def findings_table(report: FileReport) -> Any:
    from rich.table import Table
    from rich.text import Text

    table = Table(show_header=True, box=None, pad_edge=False)
    for col in ("severity", "code", "offset", "field", "message"):
        table.add_column(col, overflow="fold" if col == "message" else "ellipsis")
    for f in report.findings:
        offset = "-" if f.offset is None else f"0x{f.offset:x}"
        table.add_row(
            Text(f.severity.value, style=SEVERITY_STYLE[f.severity]),
            Text(f.code),
            Text(offset),
            _text(f.field),
            _text(f.message),
        )
    return table


def suppressed_line(report: FileReport) -> Any:
    """ "N further findings follow from this" under a root cause (a truncated file)."""
    from rich.text import Text

    n = report.suppressed
    verb = "follows" if n == 1 else "follow"
    return Text(f"{n} further finding{'s' * (n != 1)} {verb} from this", style="dim")


def render_description(report: FileReport, doc: dict[str, Any] | None) -> None:
    from rich.text import Text

    con = console()
    head = Text()
    head.append(safe(report.path), style="bold")
    head.append(f"  {report.format or 'unknown format'}")
    if doc and isinstance(doc.get("size"), int):
        head.append(f"  {doc['size']:,} bytes", style="dim")
    con.print(head)
    if doc:
        scalars = {k: v for k, v in doc.items() if not isinstance(v, dict | list) and k != "size"}
        if scalars:
            con.print(_kv_table("", scalars))
        for key, value in doc.items():
            items = value.get("items") if isinstance(value, dict) else None
            if isinstance(items, list) and all(isinstance(i, dict) for i in items):
                # A sample: {"count", "shown", "items"} (inspect --full shows every item).
                count, items = value.get("count"), value["items"]
                title = key if count == len(items) else f"{key} (first {len(items)} of {count:,})"
                if items:
                    con.print(_list_table(title, items))
            elif isinstance(value, dict):
                con.print(_kv_table(key, value))
            elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
                if key == "fields":
                    continue  # the byte map is for --json readers and docs
                rows = [_quoted_text(r) for r in value] if key == "id_text" else value
                con.print(_list_table(key, rows))
    if report.findings:
        con.print(findings_table(report))
        if report.suppressed:
            con.print(suppressed_line(report))
    else:
        con.print(Text("no findings in the structural checks", style="green"))
    if report.skipped:
        con.print(
            Text(
                f"not checked here: {', '.join(report.skipped)} (run `matrixctl verify`)",
                style="dim",
            )
        )
    con.print()


def _quoted_text(row: dict[str, Any]) -> dict[str, Any]:
    """A token's text in quotes with escapes, so leading spaces and controls can be seen; ids
    without thousands separators (as in `ids`)."""
    import json

    row = {**row, "id": str(row["id"])}
    text = row.get("text")
    if text is not None and row.get("kind") != "byte":
        row["text"] = json.dumps(text, ensure_ascii=False)
    return row


def render_verify(reports: list[FileReport], strict: bool) -> None:
    from rich.text import Text

    con = console()
    for report in reports:
        ok = report.ok(strict)
        line = Text()
        line.append("OK  " if ok else "FAIL", style="bold green" if ok else "bold red")
        if report.verdict() == "unsupported":  # the third verdict, before a long path is cut
            line.append(" intact, not convertible:", style="yellow")
        line.append(f" {safe(report.path)}")
        line.append(f"  ({report.format or 'unknown format'})", style="dim")
        errors, warnings = report.count(Severity.ERROR), report.count(Severity.WARNING)
        bits = [f"{len(report.checks)} checks"]
        if errors:
            bits.append(f"{errors} error{'s' * (errors != 1)}")
        if warnings:
            bits.append(f"{warnings} warning{'s' * (warnings != 1)}")
        line.append("  " + ", ".join(bits), style="dim")
        con.print(line)
        if report.findings:
            con.print(findings_table(report))
            if report.suppressed:
                con.print(suppressed_line(report))
    if len(reports) > 1:
        bad = sum(1 for r in reports if not r.ok(strict))
        con.print(
            Text(f"{len(reports)} files: {len(reports) - bad} ok, {bad} failed", style="bold")
        )


def _num(value: Any) -> Any:
    from rich.text import Text

    if value is None:
        return Text("-", style="dim")
    if isinstance(value, float):
        return Text(f"{value:.6g}")
    return _text(value)


def _tensor_stats_table(rows: list[dict[str, Any]]) -> Any:
    from rich.table import Table
    from rich.text import Text

    table = Table(title="stats", title_justify="left")
    for col in ("tensor", "dtype", "shape", "count", "min", "max", "mean", "std", "zeros"):
        table.add_column(col, justify="left" if col in ("tensor", "dtype", "shape") else "right")
    table.add_column("NaN", justify="right")
    table.add_column("Inf", justify="right")
    for row in rows:
        st = row["stats"]
        head = (_text(row["name"]), _text(row["dtype"]), _text("x".join(map(str, row["shape"]))))
        if "not_computed" in st:
            table.add_row(*head, Text(safe(st["not_computed"]), style="dim"), *([""] * 7))
            continue
        flagged = [Text(f"{st[k]:,}", style="bold red" if st[k] else "dim") for k in ("nan", "inf")]
        table.add_row(
            *head,
            *(_num(st[k]) for k in ("count", "min", "max", "mean", "std", "zeros")),
            *flagged,
        )
    return table


def _histogram_table(bins: list[dict[str, int]], what: str) -> Any:
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"document lengths ({what} bins, tokens)", title_justify="left")
    table.add_column("length", justify="right")
    table.add_column("documents", justify="right")
    table.add_column("", min_width=10)
    most = max((b["documents"] for b in bins), default=0) or 1
    for b in bins:
        span = str(b["from"]) if b["from"] == b["to"] else f"{b['from']:,}-{b['to']:,}"
        bar = "█" * round(30 * b["documents"] / most) if b["documents"] else ""
        table.add_row(span, f"{b['documents']:,}", Text(bar, style="cyan"))
    return table


def _top_ids_table(rows: list[dict[str, Any]]) -> Any:
    from rich.table import Table
    from rich.text import Text

    table = Table(title="most frequent ids", title_justify="left")
    table.add_column("id", justify="right")
    table.add_column("count", justify="right")
    table.add_column("share", justify="right")
    with_text = any("text" in r for r in rows)
    if with_text:
        table.add_column("text")
        table.add_column("role")
    for r in rows:
        cells = [Text(str(r["id"])), Text(f"{r['count']:,}"), Text(f"{100 * r['share']:.2f}%")]
        if with_text:
            text = r.get("text")
            # Quoted and escaped: a space, a newline or an escape sequence stays visible.
            cells.append(Text("-", style="dim") if text is None else Text(f"'{safe(text)}'"))
            cells.append(_text(r.get("role")))
        table.add_row(*cells)
    return table


def render_stats(
    report: FileReport, numbers: dict[str, Any] | None, why: str | None = None
) -> None:
    """The numbers of `inspect --stats`, after the description; `why` says why there are none."""
    from rich.text import Text

    con = console()
    if numbers is None:
        if why is None:
            why = "the structural checks failed" if not report.ok() else "none for this format"
        con.print(Text(f"stats: {why}", style="dim"))
        con.print()
        return
    if "tensors" in numbers:
        con.print(_tensor_stats_table(numbers["tensors"]))
        con.print(Text("min, max, mean, std over the finite values; std with ddof=0", style="dim"))
        con.print()
        return
    summary = {
        k: v
        for k, v in numbers.items()
        if not isinstance(v, list | dict) and k not in ("length_bins", "padding_share")
    }
    if "padding_share" in numbers:
        summary["padding share"] = f"{100 * numbers['padding_share']:.2f}%"
    con.print(_kv_table("stats", summary))
    if numbers.get("length_histogram"):
        con.print(_histogram_table(numbers["length_histogram"], numbers["length_bins"]))
    if numbers.get("top_ids"):
        con.print(_top_ids_table(numbers["top_ids"]))
    con.print()
