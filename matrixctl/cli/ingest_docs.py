"""`matrixctl ingest docs` and `matrixctl ingest merge`: documents to verified ingest packs."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any

import typer

from matrixctl.cli.common import (
    JsonOption,
    QuietOption,
    SpoolLimitOption,
    console,
    emit_json,
    note,
    safe,
    stderr_is_terminal,
)


class PackDtype(StrEnum):
    auto = "auto"
    uint16 = "uint16"
    uint32 = "uint32"


class MissingField(StrEnum):
    skip = "skip"
    error = "error"


def _input_kinds() -> type[StrEnum]:
    """--input-kind's choices: auto and every kind the registry holds (ingest/kinds/)."""
    from matrixctl.ingest import kinds

    made: type[StrEnum] = StrEnum("InputKind", {name: name for name in ("auto", *kinds.NAMES)})  # type: ignore[misc]
    return made


if TYPE_CHECKING:
    InputKind = StrEnum
else:
    InputKind = _input_kinds()
AUTO_KIND = InputKind("auto")


def parse_size(text: str) -> int:
    """`4096`, `64K`, `256M`, `2G` (binary multiples) to bytes."""
    from matrixctl.errors import UsageError

    value = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = 1
    for suffix, mult in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30)):
        if value.endswith(suffix):
            value, scale = value[:-1], mult
            break
    if not value.isdigit() or int(value) < 1:
        raise UsageError(f"--max-doc-size must look like 4096, 64K, 256M or 2G, got {text!r}")
    return int(value) * scale


class OnError(StrEnum):
    fail = "fail"
    skip = "skip"


class EncodingErrors(StrEnum):
    error = "error"
    replace_ = "replace"
    skip_file = "skip-file"


@contextmanager
def ingest_progress(total_files: int, total_bytes: int) -> Iterator[Any]:
    """Files, bytes, tokens per second and ETA on stderr, only when it is a terminal."""
    if not stderr_is_terminal() or os.environ.get("MATRIXCTL_NO_PROGRESS"):
        yield None
        return
    import time

    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TextColumn("{task.fields[tps]}"),
        TimeRemainingColumn(),
        console=console(),
        transient=True,
    ) as bar:
        task = bar.add_task(f"files 0/{total_files}", total=total_bytes or None, tps="")
        start = time.monotonic()

        def tick(files: int, nbytes: int, tokens: int) -> None:
            rate = tokens / max(1e-6, time.monotonic() - start)
            bar.update(
                task,
                completed=nbytes,
                description=f"files {files}/{total_files}",
                tps=f"{rate:,.0f} tok/s",
            )

        yield tick


def docs(
    srcs: Annotated[
        list[str],
        typer.Argument(
            metavar="SRC...",
            help="Files and folders of HTML, JSON, JSON Lines, Markdown, text (UTF-8), Parquet "
            "or Arrow; gzip, zstd, xz or bzip2 compressed ones too; - for stdin "
            "(docs/inputs.md).",
        ),
    ],
    output: Annotated[
        str, typer.Option("-o", "--output", metavar="PACKDIR", help="The pack folder to write.")
    ],
    symbols: Annotated[
        str | None,
        typer.Option(
            "--symbols", "-s", metavar="MAP", help="A pi_symbol_map.json. Default: the bundled map."
        ),
    ] = None,
    tokenizer: Annotated[
        str | None,
        typer.Option(
            "--tokenizer",
            "-t",
            metavar="PATH",
            help="Tokenize with a model's own tokenizer instead of π: a GGUF file, an `ingest "
            "gguf` folder, a tokenizer.json or a folder holding one. The pack holds exactly "
            "the model's ids; vocab_size, id width and EOS are the model's "
            "(docs/tokenizers.md).",
        ),
    ] = None,
    atom_size: Annotated[
        int, typer.Option("--atom-size", "-n", min=1, help="Tokens per atom.")
    ] = 256,
    dtype: Annotated[
        PackDtype, typer.Option("--dtype", help="Id width; auto: uint16 when vocab_size <= 65536.")
    ] = PackDtype.auto,
    svgt: Annotated[
        str | None,
        typer.Option(
            "--svgt",
            metavar="RxC",
            help="Also write atoms.svgt, the atoms on RxC grids (R*C = atom size).",
        ),
    ] = None,
    eos_id: Annotated[
        str | None,
        typer.Option(
            "--eos-id",
            metavar="ID|none",
            help="End-of-document token closing every document. Default: the map's "
            "eos_id (with --tokenizer: the model's EOS); none: no separator.",
        ),
    ] = None,
    jobs: Annotated[
        int, typer.Option("--jobs", "-j", min=1, help="Worker processes (same output for any N).")
    ] = 1,
    shard: Annotated[
        str | None,
        typer.Option(
            "--shard",
            metavar="I/N",
            help="Take only shard I of N of the input files (stable key: the path); "
            "combine the shard packs with `ingest merge`.",
        ),
    ] = None,
    text_field: Annotated[
        str,
        typer.Option(
            "--text-field",
            help="JSON / JSON Lines / Parquet / Arrow: the field or column holding the text; "
            "a.b is the field b inside a (a key or column named a.b itself wins).",
        ),
    ] = "text",
    missing_field: Annotated[
        MissingField,
        typer.Option(
            "--missing-field",
            help="A JSON document without a string text field: skip it (counted in "
            "the manifest) or stop with an error.",
        ),
    ] = MissingField.skip,
    encoding_errors: Annotated[
        EncodingErrors,
        typer.Option(
            "--encoding-errors",
            help="A file that is not UTF-8: stop with an error naming the file and byte "
            "offset, replace bad bytes with U+FFFD, or skip the file (listed in the "
            "manifest).",
        ),
    ] = EncodingErrors.error,
    on_error: Annotated[
        OnError,
        typer.Option(
            "--on-error",
            help="A file that fails (unreadable, not parseable, bad encoding, too large): "
            "stop with its error, or skip it and go on (each skipped file is named in the "
            "report and in the manifest's skipped list with its error code).",
        ),
    ] = OnError.fail,
    strict: Annotated[
        bool,
        typer.Option(
            "--strict",
            help="A file in a folder that is not a document (binary after any "
            "decompression) is an error, as for a file named on the command line; "
            "--on-error then decides.",
        ),
    ] = False,
    max_doc_size: Annotated[
        str,
        typer.Option(
            "--max-doc-size",
            metavar="SIZE",
            help="Largest document read whole: a JSON Lines line, an HTML or JSON file, a "
            "Parquet/Arrow cell (4096, 64K, 256M, 2G). Larger: INGEST_TOO_LARGE for the file.",
        ),
    ] = "256M",
    input_kind: Annotated[
        InputKind,
        typer.Option(
            "--input-kind",
            help="The kind of every input (stdin included) instead of names and bytes; "
            "compression is still recognised.",
        ),
    ] = AUTO_KIND,
    executor: Annotated[
        str,
        typer.Option(
            "--executor",
            metavar="local|dask",
            help="local: --jobs processes here; dask: the work units as tasks on a Dask "
            "cluster (a LocalCluster of --jobs workers, or --scheduler), staged beside "
            "PACKDIR; same pack bytes (docs/scale-out.md).",
        ),
    ] = "local",
    scheduler: Annotated[
        str | None,
        typer.Option(
            "--scheduler",
            metavar="ADDRESS",
            help="--executor dask: an existing scheduler (tcp://HOST:8786 or tls://...). "
            "Default: $DASK_SCHEDULER_ADDRESS, else a local cluster. A scheduler silent for "
            "$MATRIXCTL_DASK_TIMEOUT seconds (default 30) stops the build.",
        ),
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="--executor dask: reuse the staged units of an interrupted build whose "
            "completion record and hashes check out; redo the rest.",
        ),
    ] = False,
    json_out: JsonOption = False,
    quiet: QuietOption = False,
    spool_limit: SpoolLimitOption = None,
) -> None:
    """Turn documents into a complete ingest pack: atoms, symbol map, document index,
    optional SVG-Tensor projection and a manifest with the SHA-256 of every artifact and source.

    The pack is built in a hidden temporary folder beside PACKDIR and renamed into place only
    when complete; an existing PACKDIR is replaced only on success, and only if it is an ingest
    pack or an empty folder. Output bytes do not depend on --jobs or on the order the file
    system lists files in; no time is recorded unless SOURCE_DATE_EPOCH is set.
    """
    from matrixctl.cli.common import keep_freed_memory
    from matrixctl.ingest.docs import IngestOptions, ingest_docs
    from matrixctl.ingest.sources import enumerate_sources

    keep_freed_memory()
    opts = IngestOptions(
        symbols=symbols,
        tokenizer=tokenizer,
        atom_size=atom_size,
        dtype=dtype.value,
        svgt=svgt,
        eos_id=eos_id,
        jobs=jobs,
        shard=shard,
        text_field=text_field,
        missing_field=missing_field.value,
        encoding_errors=encoding_errors.value,
        on_error=on_error.value,
        strict=strict,
        max_doc_size=parse_size(max_doc_size),
        input_kind=input_kind.value,
        executor=executor,
        scheduler=scheduler,
        resume=resume,
    )
    total_files = total_bytes = 0
    if stderr_is_terminal():
        files, _ = enumerate_sources(srcs, exclude=[output], on_error=on_error.value)
        total_files, total_bytes = len(files), sum(f.size for f in files)
    with ingest_progress(total_files, total_bytes) as tick:
        summary = ingest_docs(srcs, output, opts, tick=tick)
    if json_out:
        emit_json(summary)
    else:
        for skipped in summary["skipped_files"]:
            note(f"skipped {safe(skipped['path'])}: {safe(skipped['reason'])}")
        if summary["skipped"]:
            note(
                f"skipped {summary['skipped']:,} files ({summary['skipped_bytes']:,} bytes read; "
                "listed in the manifest's skipped)"
            )
        if summary["skipped_records"]:
            note(
                f"skipped {summary['skipped_records']:,} records inside ingested files (no "
                f"{opts.text_field!r} field, or unreadable: counted per file in the manifest)"
            )
        note(
            f"ingested {summary['files']:,} files ({summary['bytes']:,} bytes): "
            f"{summary['documents']:,} documents, {summary['tokens']:,} tokens in "
            f"{summary['atoms']:,} atoms of {summary['atom_size']} ({summary['dtype']}) -> "
            f"{output}"
        )
        if "executor" in summary:
            ex = summary["executor"]
            note(
                f"dask ({safe(ex['scheduler'])}): {ex['units']:,} work units, "
                f"{ex['reused']:,} reused, {ex['redone']:,} done in this run"
            )


def merge(
    packs: Annotated[list[str], typer.Argument(metavar="PACK...", help="Shard packs to combine.")],
    output: Annotated[
        str, typer.Option("-o", "--output", metavar="PACKDIR", help="The merged pack folder.")
    ],
    json_out: JsonOption = False,
    quiet: QuietOption = False,
) -> None:
    """Combine shard packs (from `ingest docs --shard I/N`, all N shards) into one pack.

    Every input pack is verified first (hashes, consistency). The documents are put back in
    the order of the unsharded input list, so the merged pack is byte-identical to the pack one
    `ingest docs` without --shard would have written. Packs that are not shards are
    concatenated in the order given.
    """
    from matrixctl.ingest.merge import merge_packs

    summary = merge_packs(packs, output)
    if json_out:
        emit_json(summary)
    else:
        note(
            f"merged {summary['packs']} packs: {summary['documents']:,} documents, "
            f"{summary['tokens']:,} tokens -> {output}"
        )
