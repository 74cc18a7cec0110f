"""`matrixctl tokenize model encode|decode`: a model's own tokenizer (GGUF or tokenizer.json) on
text and token streams, giving exactly the ids the model uses (docs/tokenizers.md)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer

from matrixctl.cli.common import JsonOption, QuietOption, SpoolLimitOption, emit_json, note

app = typer.Typer(
    help="A model's own tokenizer (from its GGUF or tokenizer.json): text to the model's ids "
    "(encode) and back (decode).",
    no_args_is_help=True,
)

ModelOption = Annotated[
    str,
    typer.Option(
        "--model",
        "-m",
        metavar="PATH",
        help="A GGUF file (vocabulary-only or a whole model), an `ingest gguf` folder, a "
        "tokenizer.json, or a folder holding one.",
    ),
]


class DecodeErrors(StrEnum):
    STRICT = "strict"
    REPLACE = "replace"


@app.command("encode")
def encode(
    input_path: Annotated[
        str,
        typer.Argument(metavar="[INPUT|-]", help="UTF-8 text; - or nothing reads stdin."),
    ] = "-",
    model: ModelOption = ...,  # type: ignore[assignment]
    output: Annotated[
        str,
        typer.Option(
            "-o",
            "--output",
            help="Output; - is stdout (a binary token stream is refused on a terminal).",
        ),
    ] = "-",
    ids: Annotated[
        bool,
        typer.Option(
            "--ids",
            help="Write the ids as text instead of a token stream: decimal, space-separated, "
            "one line (the whole input is one document); `decode` and `pack atoms` read it.",
        ),
    ] = False,
    add_special: Annotated[
        bool,
        typer.Option(
            "--add-special",
            help="Add the BOS/EOS tokens the model's metadata asks for (default: none).",
        ),
    ] = False,
    label: Annotated[
        str | None,
        typer.Option("--label", help="Label of the document frame. Default: the input path."),
    ] = None,
    jobs: Annotated[
        int,
        typer.Option(
            "--jobs",
            "-j",
            min=1,
            max=64,
            help="Worker processes for a large input, where the tokenizer's pre-tokenizer "
            "allows cutting it (byte-level BPE gpt-2/llama-bpe, WordPiece); the ids do not "
            "change.",
        ),
    ] = 1,
    json_out: JsonOption = False,
    quiet: QuietOption = False,
    spool_limit: SpoolLimitOption = None,
) -> None:
    """Encode UTF-8 text into exactly the ids of the model's tokenizer: those of llama.cpp's
    `llama_tokenize(..., add_special=false, parse_special=false)` for a GGUF, of Hugging Face
    `tokenizers`' `encode(text, add_special_tokens=False)` for a tokenizer.json. Text that
    looks like a special token (`<|endoftext|>`) is text.

    The output is a token stream (`MXTOKENS`, uint16 ids for a vocabulary of at most 65,536,
    else uint32) or, with --ids, the ids as text. --json prints the summary (the tokenizer's
    family, pre-tokenizer, source and its SHA-256); when the output is stdout the ids go into
    that document too, as its last field `ids`. The whole input is one document, encoded in
    memory.
    """
    import tempfile

    from matrixctl.cli import common
    from matrixctl.io import STDIO
    from matrixctl.tokenizing import model_encode_file

    common.tune_for_input(input_path)
    if json_out and output == STDIO:
        with tempfile.TemporaryFile(prefix="matrixctl-ids-") as spool:
            summary = model_encode_file(
                input_path,
                output,
                model=model,
                label=label,
                form="json",
                json_ids=spool,
                add_special=add_special,
                jobs=jobs,
            )
            emit_json(summary, last_array=("ids", spool))
        return
    summary = model_encode_file(
        input_path,
        output,
        model=model,
        label=label,
        form="text" if ids else "stream",
        add_special=add_special,
        jobs=jobs,
    )
    if json_out:
        emit_json(summary)
    else:
        t = summary["tokenizer"]
        note(
            f"encoded {summary['bytes']:,} bytes into {summary['tokens']:,} tokens "
            f"({summary['dtype']}, {t['family']}/{t['pre_tokenizer']}, "
            f"vocab_size {summary['vocab_size']:,})"
        )


@app.command("decode")
def decode(
    input_path: Annotated[
        str,
        typer.Argument(
            metavar="[INPUT|-]",
            help="A token stream, or whitespace-separated decimal ids; - or nothing reads stdin.",
        ),
    ] = "-",
    model: ModelOption = ...,  # type: ignore[assignment]
    output: Annotated[str, typer.Option("-o", "--output", help="Text output; - is stdout.")] = "-",
    errors: Annotated[
        DecodeErrors,
        typer.Option(
            "--errors",
            help="strict: ids whose bytes are not valid UTF-8 are an error naming the offset. "
            "replace: those bytes become U+FFFD.",
        ),
    ] = DecodeErrors.STRICT,
    quiet: QuietOption = False,
    spool_limit: SpoolLimitOption = None,
) -> None:
    """Decode the model's token ids back into UTF-8 text, as the model's tokenizer does:
    byte-level BPE gives back the exact text it encoded; SentencePiece turns U+2581 into
    spaces and drops the leading space it added; WordPiece joins `##` pieces and puts a space
    between words (lossy: docs/tokenizers.md)."""
    from matrixctl.cli.common import tune_for_input
    from matrixctl.tokenizing import model_decode_file

    tune_for_input(input_path)
    model_decode_file(input_path, output, model=model, errors=errors.value)
