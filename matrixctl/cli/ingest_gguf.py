"""`matrixctl ingest gguf`: a GGUF model's tokenizer and token embeddings, ingested apart."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer

from matrixctl.cli.common import (
    JsonOption,
    QuietOption,
    SpoolLimitOption,
    emit_json,
    note,
    progress,
    warn,
)


class Embeddings(StrEnum):
    zt = "zt"
    safetensors = "safetensors"
    stb = "stb"
    npy = "npy"
    none = "none"


class EmbdDtype(StrEnum):
    f32 = "f32"
    f16 = "f16"


def gguf(
    model: Annotated[
        str,
        typer.Argument(metavar="MODEL.gguf", help="A GGUF model or vocabulary file; - is stdin."),
    ],
    output: Annotated[
        str, typer.Option("-o", "--output", metavar="DIR", help="The folder to write.")
    ],
    embeddings: Annotated[
        Embeddings,
        typer.Option(
            "--embeddings",
            help="Container for token_embd.weight (row i = token i): zTensor, safetensors, STB, "
            "NumPy .npy, or none.",
        ),
    ] = Embeddings.zt,
    dtype: Annotated[
        EmbdDtype | None,
        typer.Option(
            "--dtype",
            help="Element type of the stored embeddings (dequantized or cast chunk by chunk; a "
            "value f16 cannot hold is refused). Default: f32.",
        ),
    ] = None,
    keep_quantized: Annotated[
        bool,
        typer.Option(
            "--keep-quantized",
            help="Store quantized embeddings losslessly as their raw ggml blocks (zTensor "
            "quantized_group with the ggml type recorded; needs --embeddings zt).",
        ),
    ] = False,
    json_out: JsonOption = False,
    quiet: QuietOption = False,
    spool_limit: SpoolLimitOption = None,
) -> None:
    """Ingest a GGUF model: its vocabulary as a π symbol map (symbol i = GGUF token i), the
    rest of its tokenizer as gguf_tokenizer.json, and token_embd.weight apart, with a manifest
    holding the SHA-256 of the source and of every file.

    The symbol map records how the vocabulary marks spaces (SentencePiece ▁, byte-level BPE Ġ,
    WordPiece), so `tokenize pi encode --symbols DIR/pi_symbol_map.json` gives whole-word
    tokens; `<0xNN>` byte tokens become its byte fallback. The report and the manifest name the
    model's tokenizer type (BPE, SentencePiece, WordPiece) and, measured on a bundled sample,
    how often π cuts text as that tokenizer does (a warning under 100 %: π gives the model's
    ids, not necessarily its segmentation). The folder is built beside DIR and
    renamed into place only when complete; an existing DIR is replaced only by a complete new
    one, and only if `ingest gguf` wrote it or it is empty.
    """
    from matrixctl.ingest.gguf import Options, ingest_gguf
    from matrixctl.io import Source

    with Source.open(model) as src, progress("ingesting", None) as bar:
        opts = Options(
            embeddings=embeddings.value,
            dtype=dtype.value if dtype is not None else None,
            keep_quantized=keep_quantized,
            progress=bar,
        )
        manifest = ingest_gguf(src, output, opts)
    notes = manifest.pop("notes", [])
    tokenizer_line, tokenizer_warning = manifest.pop("report")
    for text in notes:
        warn(text)
    if json_out:
        if tokenizer_warning:
            warn(tokenizer_line)
        emit_json({"output": output, **manifest})
        return
    tok = manifest["tokenizer"]
    marking = (tok.get("space_marking") or {}).get("scheme", "none")
    line = (
        f"ingested {tok['vocab_size']:,} tokens ({tok['model']}, space marking {marking}, "
        f"{tok['special_symbols']:,} special"
    )
    if tok["byte_fallback"]:
        line += f", byte fallback at {tok['byte_base_id']}"
    line += ")"
    embd = manifest.get("embeddings")
    if embd:
        shape = " x ".join(f"{d:,}" for d in embd["shape"])
        line += (
            f" and {embd['tensor']} {shape} ({embd['source_type']} -> {embd['dtype']} "
            f"{embd['layout']}, {embd['file']})"
        )
    note(f"{line} -> {output}")
    (warn if tokenizer_warning else note)(tokenizer_line)
