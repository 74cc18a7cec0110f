"""`matrixctl ingest`: turn sources (documents, GGUF models) into verified packs.

Each source kind is a command in its own module (`ingest_docs.py`, `ingest_gguf.py`), registered
on this group with one line below.
"""

from __future__ import annotations

import typer

from matrixctl.cli import ingest_docs, ingest_gguf

app = typer.Typer(help="Ingest documents or models into verified packs.", no_args_is_help=True)
app.command("docs")(ingest_docs.docs)
app.command("merge")(ingest_docs.merge)
app.command("gguf")(ingest_gguf.gguf)
