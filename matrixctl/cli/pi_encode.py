"""What `tokenize pi encode` does once its options are parsed: by typer (cli/tokenize_pi.py)
or by the start-up fast path (cli/entry.py). No typer, rich or numpy here."""

from __future__ import annotations

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
    from matrixctl.io import STDIO
    from matrixctl.tokenizing import encode_file

    common.tune_for_input(input_path)
    if json_out and output == STDIO:  # stdout carries one document: the ids go in it
        import tempfile

        with tempfile.TemporaryFile(prefix="matrixctl-ids-") as spool:
            summary = encode_file(
                input_path,
                output,
                symbols=symbols,
                label=label,
                form="json",
                json_ids=spool,
                jobs=jobs,
            )
            emit_json(summary, last_array=("ids", spool))
        return
    form = "text" if ids else "stream"
    summary = encode_file(input_path, output, symbols=symbols, label=label, form=form, jobs=jobs)
    if json_out:
        emit_json(summary)
    else:
        note(
            f"encoded {summary['bytes']:,} bytes into {summary['tokens']:,} tokens "
            f"({summary['dtype']}, vocab_size {summary['vocab_size']:,})"
        )
