"""Generate the reference parts of docs/cli.md and docs/errors.md from the code.

    python -m matrixctl.cli.docgen --write    # rewrite the generated sections in place
    python -m matrixctl.cli.docgen --check    # exit 1 when a generated section is stale

Only the text between the BEGIN/END markers is generated; the prose around it is written by hand.
A test runs the check, so a command, option or diagnostic code missing from the docs fails CI.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BEGIN = "<!-- BEGIN GENERATED: {name} (python -m matrixctl.cli.docgen --write) -->"
END = "<!-- END GENERATED: {name} -->"


def _walk(cmd: Any, path: list[str]) -> list[tuple[list[str], Any]]:
    out = [(path, cmd)]
    subs = getattr(cmd, "commands", None)
    if subs:
        for name in sorted(subs):
            out.extend(_walk(subs[name], [*path, name]))
    return out


def click_context(cmd: Any, name: str) -> Any:
    from matrixctl.cli.app import command_tree

    context_class = type(
        command_tree().make_context("matrixctl", ["--help"], resilient_parsing=True)
    )
    return context_class(cmd, info_name=name)


def commands() -> list[tuple[list[str], Any]]:
    """Every (path, click command) pair of the CLI, the root first."""
    from matrixctl.cli.app import command_tree

    return _walk(command_tree(), ["matrixctl"])


def _param_doc(param: Any, ctx: Any) -> tuple[str, str, str]:
    record = param.get_help_record(ctx) or (param.name, "")
    names, text = record
    kind = "argument" if param.param_type_name == "argument" else "option"
    if kind == "argument":
        names = names.split(" <", 1)[0]
    return f"`{names}`".replace("|", "\\|"), kind, text.replace("|", "\\|")


def cli_reference() -> str:
    lines: list[str] = []
    for path, cmd in commands():
        if path == ["matrixctl"]:
            continue
        title = " ".join(path)
        lines.append(f"### `{title}`")
        lines.append("")
        help_text = (cmd.help or "").strip()
        if help_text:
            lines.append(help_text.replace("\b\n", ""))
            lines.append("")
        if getattr(cmd, "commands", None):
            lines.append("Subcommands: " + ", ".join(f"`{n}`" for n in sorted(cmd.commands)))
            lines.append("")
            continue
        rows = []
        ctx = click_context(cmd, title)
        for param in cmd.params:
            if param.name == "help":
                continue
            name, kind, text = _param_doc(param, ctx)
            rows.append(f"| {name} | {kind} | {' '.join(text.split())} |")
        if rows:
            lines.append("| name | kind | meaning |")
            lines.append("| --- | --- | --- |")
            lines.extend(rows)
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def import_everything() -> None:
    """Import every module of the package so every diagnostic code is defined."""
    from matrixctl.package import PACKAGE_DIR

    for mod in pkgutil.walk_packages([PACKAGE_DIR], "matrixctl."):
        if mod.name.endswith("__main__"):
            continue
        importlib.import_module(mod.name)


def errors_reference() -> str:
    from matrixctl.codes import CODES

    import_everything()
    groups: dict[str, list[Any]] = {}
    for info in CODES.values():
        groups.setdefault(info.group, []).append(info)
    lines: list[str] = []
    for group in sorted(groups, key=lambda g: (g != "general", g)):
        lines.append(f"### {group}")
        lines.append("")
        lines.append("| code | severity | meaning |")
        lines.append("| --- | --- | --- |")
        for info in sorted(groups[group], key=lambda i: i.code):
            lines.append(f"| `{info.code}` | {info.severity.value} | {info.summary} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


SECTIONS = {
    ("docs/cli.md", "commands"): cli_reference,
    ("docs/errors.md", "codes"): errors_reference,
}


def render(text: str, name: str, body: str) -> str:
    begin, end = BEGIN.format(name=name), END.format(name=name)
    if begin not in text or end not in text:
        raise SystemExit(f"markers for {name} are missing")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body}{end}{tail}"


def main(argv: list[str]) -> int:
    write = "--write" in argv
    stale = []
    for (rel, name), fn in SECTIONS.items():
        path = ROOT / rel
        text = path.read_text(encoding="utf-8")
        new = render(text, name, fn())
        if new != text:
            stale.append(rel)
            if write:
                path.write_text(new, encoding="utf-8")
    if stale and not write:
        sys.stderr.write(f"stale generated docs: {', '.join(stale)}; run `make docs`\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
