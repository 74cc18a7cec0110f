"""What `tokenize pi encode` does once its options are parsed: by typer (cli/tokenize_pi.py)
or by the start-up fast path (cli/entry.py). No typer, rich or numpy here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, BinaryIO

from matrixctl.cli import common
from matrixctl.cli.common import emit_json, note


def run(
    *,
    input_path: str = "-",
    symbols: str | None = None,
    output: str = "-",
    ids: bool = False,
    label: str | None = None,
    jobs: int = 1,
    json_out: bool = False,
) -> None:
    from matrixctl.tokenizing import encode_file

    common.tune_for_input(input_path)
    report_encoding(
        lambda form, json_ids: encode_file(
            input_path,
            output,
            symbols=symbols,
            label=label,
            form=form,
            json_ids=json_ids,
            jobs=jobs,
        ),
        output=output,
        ids=ids,
        json_out=json_out,
        detail=lambda summary: f"{summary['dtype']}, vocab_size {summary['vocab_size']:,}",
    )


def report_encoding(
    encode: Callable[[str, BinaryIO | None], dict[str, Any]],
    *,
    output: str,
    ids: bool,
    json_out: bool,
    detail: Callable[[dict[str, Any]], str],
) -> None:
    """Run an encode (`tokenize pi` or `tokenize model`: `encode(form, json_ids)` returns its
    summary) and report it: with --json and stdout as the output, the ids go into the one
    document (spooled first, its last field `ids`); else the stream or ids go to the output
    and the summary to --json or a note."""
    from matrixctl.io import STDIO

    if json_out and output == STDIO:  # stdout carries one document: the ids go in it
        import tempfile

        with tempfile.TemporaryFile(prefix="matrixctl-ids-") as spool:
            emit_json(encode("json", spool), last_array=("ids", spool))
        return
    summary = encode("text" if ids else "stream", None)
    if json_out:
        emit_json(summary)
    else:
        note(
            f"encoded {summary['bytes']:,} bytes into {summary['tokens']:,} tokens "
            f"({detail(summary)})"
        )
