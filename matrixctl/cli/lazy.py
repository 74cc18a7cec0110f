"""Command groups whose subcommands are imported and built only when they are called.

Building a click command from a typer function inspects its signature and evaluates its
annotations; importing its module imports what the module needs. A one-line `tokenize pi
encode` needs neither for the other twenty commands, so a group's `commands` mapping holds a
`Lazy` entry per subcommand and turns it into the click command on first access. The names
(for `No such command` and its suggestions) need no import; `--help` of a group, `make docs`
and shell completion read every entry and so build every subcommand, exactly as before.

The built commands are the ones typer builds for `app.add_typer(sub, name=...)` and
`app.command(name)(function)` under the root's settings (no rich markup, no completion), so
options, help texts, usage lines and errors do not change (tests/cli/test_startup.py,
tests/cli/test_docs.py).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Lazy:
    """A subcommand by where it lives: `module.attribute` is a `typer.Typer` (a command group)
    or a command function; `cls` names a click command class in the same module."""

    module: str
    attribute: str
    cls: str | None = None

    def build(self, name: str) -> Any:
        import typer
        from typer.main import get_command

        module = importlib.import_module(self.module)
        target = getattr(module, self.attribute)
        host = typer.Typer(add_completion=False, rich_markup_mode=None)
        if isinstance(target, typer.Typer):
            host.add_typer(target, name=name)
            command = get_command(host).commands[name]  # type: ignore[attr-defined]
        else:
            options = {"cls": getattr(module, self.cls)} if self.cls else {}
            host.command(name, **options)(target)
            command = get_command(host)  # one command and no callback: the command itself
        subcommands = getattr(module, "SUBCOMMANDS", None)
        if subcommands is not None:  # a group whose own subcommands are lazy too
            command.commands = LazyCommands(subcommands)
        return command


class LazyCommands(MutableMapping[str, Any]):
    """A group's subcommands in registration order; a `Lazy` entry is built when read."""

    def __init__(self, entries: dict[str, Any]) -> None:
        self._entries = dict(entries)

    def __getitem__(self, name: str) -> Any:
        entry = self._entries[name]
        if isinstance(entry, Lazy):
            entry = self._entries[name] = entry.build(name)
        return entry

    def __setitem__(self, name: str, command: Any) -> None:
        self._entries[name] = command

    def __delitem__(self, name: str) -> None:
        del self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
