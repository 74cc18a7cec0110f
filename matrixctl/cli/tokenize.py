"""`matrixctl tokenize`: the tokenizer command groups.

Each tokenizer family is its own typer app in its own module (`tokenize_pi.py`,
`tokenize_scx.py`), added to this group with one `app.add_typer(...)` line below.
"""

from __future__ import annotations

import typer

from matrixctl.cli import tokenize_pi, tokenize_scx

app = typer.Typer(help="Tokenize text or bytes into token streams, and back.", no_args_is_help=True)
app.add_typer(tokenize_pi.app, name="pi")
app.add_typer(tokenize_scx.app, name="scx")
