"""`matrixctl tokenize model encode|decode`: a model's own tokenizer (GGUF or tokenizer.json) on
text and token streams, giving exactly the ids the model uses (docs/tokenizers.md)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from matrixctl.cli.common import JsonOption, QuietOption, SpoolLimitOption
from matrixctl.cli.tokenize_options import (
    DecodeErrors,
    IdsFlag,
    LabelOption,
    StreamOutput,
    TextInput,
    TextOutput,
    TokenInput,
)

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


@app.command("encode")
def encode(
    input_path: TextInput = "-",
    model: ModelOption = ...,  # type: ignore[assignment]
    output: StreamOutput = "-",
    ids: IdsFlag = False,
    add_special: Annotated[
        bool,
        typer.Option(
            "--add-special",
            help="Add the BOS/EOS tokens the model's metadata asks for (default: none).",
        ),
    ] = False,
    label: LabelOption = None,
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
    from matrixctl.cli import common
    from matrixctl.cli.pi_encode import report_encoding
    from matrixctl.tokenizing import model_encode_file

    common.tune_for_input(input_path)

    def detail(summary: dict[str, Any]) -> str:
        t = summary["tokenizer"]
        return (
            f"{summary['dtype']}, {t['family']}/{t['pre_tokenizer']}, "
            f"vocab_size {summary['vocab_size']:,}"
        )

    report_encoding(
        lambda form, json_ids: model_encode_file(
            input_path,
            output,
            model=model,
            label=label,
            form=form,
            json_ids=json_ids,
            add_special=add_special,
            jobs=jobs,
            record=json_out,
        ),
        output=output,
        ids=ids,
        json_out=json_out,
        detail=detail,
    )


@app.command("decode")
def decode(
    input_path: TokenInput = "-",
    model: ModelOption = ...,  # type: ignore[assignment]
    output: TextOutput = "-",
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
