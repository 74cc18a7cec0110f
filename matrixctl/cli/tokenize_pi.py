"""`matrixctl tokenize pi encode|decode`: the π symbol-map tokenizer on text and token streams."""

from __future__ import annotations

from typing import Annotated

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
    help="The π symbol-map tokenizer: text to a token stream (encode) and back (decode).",
    no_args_is_help=True,
)

SymbolsOption = Annotated[
    str | None,
    typer.Option(
        "--symbols",
        "-s",
        metavar="MAP",
        help="A pi_symbol_map.json. Default: the bundled map (NFKC, byte fallback, 65,536 ids).",
    ),
]


@app.command("encode")
def encode(
    input_path: TextInput = "-",
    symbols: SymbolsOption = None,
    output: StreamOutput = "-",
    ids: IdsFlag = False,
    label: LabelOption = None,
    jobs: Annotated[
        int,
        typer.Option(
            "--jobs",
            "-j",
            min=1,
            max=64,
            help="Worker processes for a large input (the ids and the output do not change).",
        ),
    ] = 1,
    json_out: JsonOption = False,
    quiet: QuietOption = False,
    spool_limit: SpoolLimitOption = None,
) -> None:
    """Encode UTF-8 text into a token stream (`MXTOKENS`) that `pack atoms` reads, or into ids
    a person can read (--ids, --json).

    Streams: memory stays flat whatever the input size. The text is normalized with the
    map's normalization, then matched greedily (leftmost-longest) against the symbols;
    characters no symbol covers become byte tokens (byte fallback) or unk_id. The whole
    input is one document, closed by a DOC frame labelled with --label or the input path.

    --json prints the summary (map hash, counts) as one document; when the output is stdout
    the ids go into that document too, as its last field `ids`.

    --jobs N cuts the input into 1 MB units at places where the tokens provably do not depend
    on the cut, and encodes them in N processes (docs/formats/pi-symbol-map.md).
    """
    from matrixctl.cli.pi_encode import run

    run(
        input_path=input_path,
        symbols=symbols,
        output=output,
        ids=ids,
        label=label,
        jobs=jobs,
        json_out=json_out,
    )


@app.command("decode")
def decode(
    input_path: TokenInput = "-",
    symbols: SymbolsOption = None,
    output: TextOutput = "-",
    errors: Annotated[
        DecodeErrors,
        typer.Option(
            "--errors",
            help="strict: byte tokens that are not valid UTF-8, or ids with no text, are an "
            "error naming the token. replace: they become U+FFFD.",
        ),
    ] = DecodeErrors.STRICT,
    quiet: QuietOption = False,
    spool_limit: SpoolLimitOption = None,
) -> None:
    """Decode token ids back into UTF-8 text (the exact inverse of encode, after normalization).

    Symbol ids give their text; byte ids are reassembled into UTF-8; unk_id gives U+FFFD;
    pad_id and eos_id give nothing.
    """
    from matrixctl.cli.common import tune_for_input
    from matrixctl.tokenizing import decode_file

    tune_for_input(input_path)
    decode_file(input_path, output, symbols=symbols, errors=errors.value)
