"""`matrixctl pack`: token ids to MATRIX-ATOM files, atoms to SVG-Tensor grids."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer

from matrixctl.cli.common import (
    JsonOption,
    QuietOption,
    SpoolLimitOption,
    emit_json,
    json_needs_stdout,
    note,
    progress,
)

app = typer.Typer(help="Pack token ids into fixed-width files.", no_args_is_help=True)


class AtomDtype(StrEnum):
    auto = "auto"
    uint16 = "uint16"
    uint32 = "uint32"


OutOption = Annotated[
    str, typer.Option("-o", "--output", help="Output file; - writes to stdout (not a terminal).")
]


@app.command("atoms")
def atoms(
    output: OutOption,
    atom_size: Annotated[
        int, typer.Option("--atom-size", "-n", min=1, help="Tokens per atom (fixed width).")
    ],
    input_path: Annotated[
        str,
        typer.Argument(
            metavar="[INPUT|-]",
            help="A token stream (from `tokenize`) or whitespace-separated decimal ids; "
            "- or nothing reads stdin.",
        ),
    ] = "-",
    dtype: Annotated[
        AtomDtype,
        typer.Option(
            "--dtype",
            help="Id width. auto: uint16 when vocab_size <= 65536 (or, with no vocabulary "
            "size, when every id fits), else uint32. Ids are never wrapped.",
        ),
    ] = AtomDtype.auto,
    vocab_size: Annotated[
        int | None,
        typer.Option(
            "--vocab-size",
            min=1,
            help="Vocabulary size; every id must be below it. Default: the stream's declared "
            "size, else the largest id + 1.",
        ),
    ] = None,
    pad_id: Annotated[
        int, typer.Option("--pad-id", min=0, help="Id that pads the last atom to full width.")
    ] = 0,
    json_out: JsonOption = False,
    quiet: QuietOption = False,
    spool_limit: SpoolLimitOption = None,
) -> None:
    """Pack token ids into a MATRIX-ATOM v1 file (streaming, bounded memory, atomic)."""
    from matrixctl.atoms import input_size, write_atoms

    json_needs_stdout(json_out, output)
    _hint_terminal_input(input_path)
    with progress("packing", input_size(input_path)) as bar:
        summary = write_atoms(
            input_path,
            output,
            atom_size=atom_size,
            dtype=dtype.value,
            vocab_size=vocab_size,
            pad_id=pad_id,
            tick=bar.advance,
        )
    if json_out:
        emit_json(summary)
    elif not quiet:
        note(
            f"packed {summary['tokens']:,} tokens (+{summary['padding']} padding) into "
            f"{summary['atom_count']:,} atoms of {summary['atom_size']} as {summary['dtype']}, "
            f"vocab_size {summary['vocab_size']:,} -> {output}"
        )


def _hint_terminal_input(input_path: str) -> None:
    import sys

    from matrixctl.io import STDIO

    if input_path == STDIO and sys.stdin.isatty():
        note("reading token ids from the terminal; end with Ctrl-D")


@app.command("svgt")
def svgt(
    atoms_path: Annotated[str, typer.Argument(metavar="ATOMS", help="A MATRIX-ATOM file.")],
    output: OutOption,
    grid: Annotated[
        str, typer.Option("--grid", help="ROWSxCOLS of each atom's grid; ROWS*COLS = atom_size.")
    ],
    json_out: JsonOption = False,
    quiet: QuietOption = False,
    spool_limit: SpoolLimitOption = None,
) -> None:
    """Project MATRIX-ATOM atoms onto RxC grids in an SVG-Tensor file (ids must fit uint16)."""
    from matrixctl.atoms import input_size, write_svgt

    json_needs_stdout(json_out, output)
    with progress("projecting", input_size(atoms_path)) as bar:
        summary = write_svgt(atoms_path, output, grid=grid, tick=bar.advance)
    if json_out:
        emit_json(summary)
    else:
        note(f"projected {summary['atom_count']:,} atoms onto {summary['grid']} grids -> {output}")


@app.command("shards")
def shards(
    output: Annotated[
        str, typer.Option("-o", "--output", help="Folder to create: manifest, registry, shards.")
    ],
    registry: Annotated[
        str,
        typer.Option(
            "--registry", "-r", help="A signed SCX registry file (from `tokenize scx sign`)."
        ),
    ],
    input_path: Annotated[
        str,
        typer.Argument(
            metavar="[INPUT|-]", help="The binary file to align; - or nothing is stdin."
        ),
    ] = "-",
    trust: Annotated[
        list[str] | None,
        typer.Option(
            "--trust",
            metavar="FILE",
            help="Trusted public signing keys (`.pub` files); repeatable. Default: "
            "MATRIXCTL_SCX_TRUST. Nothing is trusted otherwise.",
        ),
    ] = None,
    created_at: Annotated[
        str | None,
        typer.Option(
            "--created-at",
            metavar="YYYY-MM-DDTHH:MM:SSZ",
            help="The manifest's created_at. Default: SOURCE_DATE_EPOCH, else null (no clock "
            "time in artifacts).",
        ),
    ] = None,
    strict_alignment: Annotated[
        bool,
        typer.Option(
            "--strict-alignment",
            help="Refuse input that is not a whole number of bundles instead of padding it.",
        ),
    ] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Replace an existing shard folder (or empty folder).")
    ] = False,
    json_out: JsonOption = False,
    quiet: QuietOption = False,
    spool_limit: SpoolLimitOption = None,
) -> None:
    """Cut a binary file into SCX shards and write the tokenizer manifest (manifest.json).

    The signed registry's alignment settings say how: bundles of N lanes of W bytes (the last
    bundle padded with the registry's pad byte), shards of shard_bundles bundles. The folder
    holds the shard files, a copy of the registry and manifest.json, which records the hash of
    every shard's bytes with and without padding; it appears whole or not at all.
    """
    from matrixctl.tokenizers.scx import api, manifest
    from matrixctl.tokenizers.scx import shards as scx_shards

    stamp = manifest.created_at_from(created_at)
    tok, registry_bytes = api.load_config(registry, trust)
    from matrixctl.atoms import input_size

    with progress("aligning", input_size(input_path)) as bar:
        summary = scx_shards.write_shards(
            input_path,
            output,
            tok,
            registry_bytes,
            created_at=stamp,
            strict_alignment=strict_alignment,
            force=force,
            tick=bar.advance,
        )
    for text in summary["warnings"]:
        from matrixctl.cli.common import warn

        warn(text)
    if json_out:
        emit_json(summary)
    else:
        note(
            f"aligned {summary['bytes']:,} bytes into {summary['shards']} shard(s) of up to "
            f"{summary['shard_bundles']:,} bundles of {summary['bundle_bytes']} bytes -> "
            f"{output}/manifest.json (manifest hash {summary['manifest_hash'][:16]}...)"
        )
