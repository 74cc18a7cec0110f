"""`matrixctl convert`: from one format to another."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from typer.core import TyperCommand, TyperOption

from matrixctl.cli.common import JsonOption, QuietOption, SpoolLimitOption

TO_HELP = "Output format, when the output name does not tell it: "


class _ToOption(TyperOption):
    """`--to`, whose help lists the formats convert can write. The list comes from the
    converter registry (`matrixctl.converters.describe_writable`), which imports every codec, so
    it is computed only when the help is shown (--help, docs), never when a command runs."""

    @property
    def help(self) -> str:
        from matrixctl.converters import describe_writable

        return TO_HELP + describe_writable() + "."

    @help.setter
    def help(self, value: str | None) -> None:
        pass


class ConvertCommand(TyperCommand):
    """The `convert` command: its `--to` option is a `_ToOption`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if param.name == "to":
                param.__class__ = _ToOption


def convert(
    src: Annotated[
        str,
        typer.Argument(
            metavar="SRC",
            help="Input file (format sniffed from its bytes), or a Hugging Face model folder "
            "(config.json + model.safetensors).",
        ),
    ],
    dst: Annotated[
        str,
        typer.Argument(metavar="DST", help="Output file; - writes to stdout (not a terminal)."),
    ],
    to: Annotated[
        str | None,
        typer.Option("--to", metavar="FORMAT", help=TO_HELP + "see --help."),
    ] = None,
    atoms: Annotated[
        str | None,
        typer.Option(
            "--atoms",
            metavar="A:B",
            help="svgt -> svg: the atoms to draw (default: the first 256).",
        ),
    ] = None,
    select: Annotated[
        list[str] | None,
        typer.Option(
            "--select",
            metavar="GLOB",
            help="Tensor containers: convert only tensors whose name matches GLOB (repeatable).",
        ),
    ] = None,
    exclude: Annotated[
        list[str] | None,
        typer.Option(
            "--exclude",
            metavar="GLOB",
            help="Tensor containers: leave out tensors whose name matches GLOB (repeatable; "
            "applied after --select), e.g. --exclude 'pooler.*'.",
        ),
    ] = None,
    dtype: Annotated[
        list[str] | None,
        typer.Option(
            "--dtype",
            metavar="D|GLOB=D",
            help="Tensor containers: cast every floating-point tensor to D, or the tensors "
            "matching GLOB to D (repeatable; later ones win). Without it nothing is cast and "
            "a tensor the output cannot hold is refused. Token ids from a .npy: uint16 or "
            "uint32, the id dtype to write.",
        ),
    ] = None,
    vocab_size: Annotated[
        int | None,
        typer.Option(
            "--vocab-size",
            metavar="N",
            help=".npy to a token stream or MATRIX-ATOM: the vocab_size to declare (every id "
            "must be below it). Default: none for a stream, largest id + 1 for atoms.",
        ),
    ] = None,
    compress: Annotated[
        str | None,
        typer.Option(
            "--compress",
            metavar="zstd[:LEVEL]|none",
            help="zTensor output: store components zstd-compressed (level 1-22, default 3).",
        ),
    ] = None,
    digest: Annotated[
        str | None,
        typer.Option(
            "--digest",
            metavar="crc32c|sha256|none",
            help="zTensor output: the per-component digest (default crc32c).",
        ),
    ] = None,
    quantize: Annotated[
        str | None,
        typer.Option(
            "--quantize",
            metavar="q8_0",
            help="GGUF output: store floating tensors of rank >= 2 whose rows are whole "
            "32-element blocks as Q8_0 (quantized by matrixctl); the others keep their type.",
        ),
    ] = None,
    zt_version: Annotated[
        int | None,
        typer.Option(
            "--zt-version",
            metavar="1|2",
            help="zTensor output: the container version (default: 2 when the input is zTensor "
            "2, else 1.1; docs/formats/ztensor2.md says why).",
        ),
    ] = None,
    meta: Annotated[
        list[str] | None,
        typer.Option(
            "--meta",
            metavar="KEY=VALUE",
            help="Tensor containers: set a file metadata entry (repeatable; later ones win), "
            "e.g. --meta model_name=all-MiniLM-L6-v2 for EMBD .weights.",
        ),
    ] = None,
    per_file: Annotated[
        int | None,
        typer.Option(
            "--per-file",
            metavar="N",
            help="STB output: at most N tensors per .stb file (1-256, default 256); more "
            "tensors go to further files NAME.1.stb, NAME.2.stb, ... listed in the sidecar. "
            "16 suits runtimes whose loader addresses at most 16 files of 16 tensors (the STB "
            "spec's KHΛNARY runtime and its G_LOAD_BIN_TENSOR instruction).",
        ),
    ] = None,
    densify: Annotated[
        bool,
        typer.Option(
            "--densify",
            help="Store sparse tensors dense when the output has no sparse layout (lossless; "
            "needs memory for one dense tensor).",
        ),
    ] = False,
    keep_quantized: Annotated[
        bool,
        typer.Option(
            "--keep-quantized",
            help="GGUF input: store quantized tensors as their raw ggml blocks (zTensor "
            "quantized_group, lossless) instead of dequantizing them to f32.",
        ),
    ] = False,
    json_out: JsonOption = False,
    quiet: QuietOption = False,
    spool_limit: SpoolLimitOption = None,
) -> None:
    """Convert between formats: tensor containers (zTensor, safetensors, NumPy .npy/.npz,
    EMBD .weights, STB .stb) into one another, a Hugging Face model folder or a GGUF model into
    any of them, SVG-Tensor to an SVG picture (`atoms.svgt atoms.svg`), and token ids to .npy
    and back: a token stream (.mxt) to a 1-D array, MATRIX-ATOM (.bin) to atoms x atom_size.

    Tensor names, shapes and values are preserved; a tensor the output cannot hold exactly is
    refused (nothing is written) unless --dtype asks for a cast. Streams one tensor at a time.
    """
    from matrixctl.cli.convert_fast import run

    run(
        src,
        dst,
        to=to,
        atoms=atoms,
        select=select,
        exclude=exclude,
        dtype=dtype,
        vocab_size=vocab_size,
        compress=compress,
        digest=digest,
        quantize=quantize,
        zt_version=zt_version,
        meta=meta,
        per_file=per_file,
        densify=densify,
        keep_quantized=keep_quantized,
        json_out=json_out,
        quiet=quiet,
    )
