"""Pick a model tokenizer's family from its metadata (docs/tokenizers.md).

`from_gguf_kv(kv)` reads `tokenizer.ggml.model`; `from_tokenizer_json(obj)` reads a Hugging Face
`tokenizer.json`'s `model.type`. A family matrixctl does not implement exactly is
TOKENIZER_UNSUPPORTED, named; the family modules are imported only when chosen.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from matrixctl.errors import FormatError
from matrixctl.tokenizers.model.base import (
    TOKENIZER_UNSUPPORTED,
    TOKENIZER_VOCAB,
    ModelTokenizer,
    kv_get,
)

# tokenizer.ggml.model -> the family that implements it exactly.
GGUF_FAMILIES = {"gpt2": "bpe", "gemma4": "gemma4", "llama": "spm", "bert": "wpm", "t5": "ugm"}


def family_of(model: str | None, pre: str | None) -> tuple[str | None, str | None]:
    """(family, None) when matrixctl tokenizes a GGUF of this `tokenizer.ggml.model` and
    `tokenizer.ggml.pre` exactly, else (family or None, why not), without building anything
    (what `inspect` shows; building may still find bad vocabulary data)."""
    family = GGUF_FAMILIES.get(model or "")
    if family is None:
        return None, f"tokenizer.ggml.model {model!r} is not a family matrixctl implements"
    if family == "bpe":
        from matrixctl.tokenizers.model.bpe import LLAMA_PRE

        if pre not in LLAMA_PRE:
            return family, f"pre-tokenizer {pre!r} is not one matrixctl implements exactly"
    return family, None


def from_gguf_kv(kv: Mapping[str, Any]) -> ModelTokenizer:
    """The tokenizer of a GGUF's metadata (its key-value pairs as plain Python values)."""
    model = kv_get(kv, "tokenizer.ggml.model", str)
    if model == "gpt2":
        from matrixctl.tokenizers.model.bpe import ByteLevelBPE

        return ByteLevelBPE.from_gguf_kv(kv)
    if model == "gemma4":
        from matrixctl.tokenizers.model.gemma4 import Gemma4

        return Gemma4.from_gguf_kv(kv)
    if model == "llama":
        from matrixctl.tokenizers.model.spm import SentencePiece

        return SentencePiece.from_gguf_kv(kv)
    if model == "bert":
        from matrixctl.tokenizers.model.wpm import WordPiece

        return WordPiece.from_gguf_kv(kv)
    if model == "t5":
        from matrixctl.tokenizers.model.ugm import Unigram

        return Unigram.from_gguf_kv(kv)
    raise FormatError(
        TOKENIZER_UNSUPPORTED,
        f"tokenizer.ggml.model {model!r} is not a tokenizer family matrixctl implements exactly",
        field="tokenizer.ggml.model",
    )


def from_tokenizer_json(obj: Mapping[str, Any]) -> ModelTokenizer:
    """The tokenizer of a parsed Hugging Face `tokenizer.json`."""
    if not isinstance(obj, Mapping):
        raise FormatError(TOKENIZER_VOCAB, "a tokenizer.json is a JSON object", field="model")
    model = obj.get("model")
    if not isinstance(model, Mapping):
        raise FormatError(TOKENIZER_VOCAB, "tokenizer.json has no model object", field="model")
    kind = model.get("type")
    if kind == "BPE":
        from matrixctl.tokenizers.model.bpe import ByteLevelBPE

        return ByteLevelBPE.from_tokenizer_json(obj)
    if kind == "WordPiece":
        from matrixctl.tokenizers.model.wpm import WordPiece

        return WordPiece.from_tokenizer_json(dict(obj))
    if kind == "Unigram":
        from matrixctl.tokenizers.model.ugm import Unigram

        return Unigram.from_tokenizer_json(dict(obj))
    raise FormatError(
        TOKENIZER_UNSUPPORTED,
        f"tokenizer.json model type {kind!r} is not one matrixctl implements exactly",
        field="model.type",
    )
