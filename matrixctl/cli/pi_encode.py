"""What `tokenize pi encode` does once its options are parsed: by typer (cli/tokenize_pi.py)
or by the start-up fast path (cli/entry.py). No typer, rich or numpy here."""

from __future__ import annotations

from matrixctl.cli.common import emit_json, keep_freed_memory, note

LARGE_INPUT = 1 << 20  # bytes: from this size the allocator is tuned (`tuned_for`)


def tuned_for(input_path: str) -> bool:
    """Tune this process's allocator (`keep_freed_memory`) when the input is a regular file
    of at least LARGE_INPUT bytes (stdin redirected from one included): each 1 MiB read,
    its normalized text and its ids were fresh mappings the kernel faulted in and zeroed
    again, about 29,000 page faults for 20 MB at `--jobs 1` and 43,000 at `--jobs 2` (the
    forked workers inherit the setting). A small input, or a pipe whose size is not known,
    is left as it is: the setting costs `ctypes`' import, about 1.5 ms of a 40 ms
    one-line encode (docs/benchmarks.md, "π: the allocator")."""
    import os
    import stat

    try:
        st = os.fstat(0) if input_path == "-" else os.stat(input_path)
    except (OSError, ValueError):
        return False  # the encode reports a missing input itself
    if not stat.S_ISREG(st.st_mode) or st.st_size < LARGE_INPUT:
        return False
    return keep_freed_memory()


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

    tuned_for(input_path)
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
