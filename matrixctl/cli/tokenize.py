"""`matrixctl tokenize`: the tokenizer command groups.

Each tokenizer family is its own typer app in its own module (`tokenize_pi.py`,
`tokenize_scx.py`, `tokenize_model.py`), added to this group with one line in `SUBCOMMANDS`
below (imported and built only when called: cli/lazy.py).
"""

from __future__ import annotations

import typer

from matrixctl.cli.lazy import Lazy

app = typer.Typer(help="Tokenize text or bytes into token streams, and back.", no_args_is_help=True)
SUBCOMMANDS = {
    "pi": Lazy("matrixctl.cli.tokenize_pi", "app"),
    "scx": Lazy("matrixctl.cli.tokenize_scx", "app"),
    "model": Lazy("matrixctl.cli.tokenize_model", "app"),
}
