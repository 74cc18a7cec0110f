"""EMBD model metadata: the required keys, their forms, and the BERT encoder the metadata
describes (checked against the vocabulary and the tensor shapes)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from matrixctl.formats.embd.layout import (
    EMBD_META_MISSING,
    EMBD_META_VALUE,
)

REQUIRED_KEYS = (
    "model_name",
    "model_version",
    "embedding_dim",
    "vocab_size",
    "num_layers",
    "num_attention_heads",
    "hidden_size",
    "intermediate_size",
    "max_position_emb",
    "created_at",
)
INTEGER_KEYS = (
    "embedding_dim",
    "vocab_size",
    "num_layers",
    "num_attention_heads",
    "hidden_size",
    "intermediate_size",
    "max_position_emb",
)
CREATED_AT = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})")
EPOCH_TEXT = "1970-01-01T00:00:00Z"
DEFAULT_VERSION = "0.0.0"


# Model metadata -----------------------------------------------------------------------------


def created_at_now() -> str | None:
    """created_at from SOURCE_DATE_EPOCH, or None when it is not set."""
    from matrixctl.epoch import source_date_text

    return source_date_text()


def decimal(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() else None


def check_metadata(meta: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """(code, key, message) for every missing required key and malformed value."""
    out = []
    for key in REQUIRED_KEYS:
        if key not in meta:
            out.append((EMBD_META_MISSING, key, f"required key {key!r} is missing"))
    for key in INTEGER_KEYS:
        if key in meta and decimal(meta[key]) is None:
            out.append((EMBD_META_VALUE, key, f"{key} is {meta[key]!r:.40}, not a decimal integer"))
    if "created_at" in meta and not CREATED_AT.fullmatch(meta["created_at"]):
        out.append(
            (
                EMBD_META_VALUE,
                "created_at",
                f"created_at {meta['created_at']!r:.40} is not an ISO 8601 date-time "
                "(YYYY-MM-DDTHH:MM:SSZ)",
            )
        )
    return out


def layer_indices(names: list[str]) -> set[int]:
    out = set()
    for name in names:
        m = re.match(r"encoder\.layer\.(\d+)\.", name)
        if m:
            out.add(int(m.group(1)))
    return out


def bert_shapes(meta: Mapping[str, str]) -> dict[str, tuple[int, ...]] | None:
    """The tensors (name -> shape) the spec lists for a BERT encoder with this metadata, or
    None when a number needed is missing."""
    vals = {k: decimal(meta.get(k, "")) for k in INTEGER_KEYS}
    v, hid, inter, pos, layers = (
        vals["vocab_size"],
        vals["hidden_size"],
        vals["intermediate_size"],
        vals["max_position_emb"],
        vals["num_layers"],
    )
    if v is None or hid is None or inter is None or pos is None or layers is None:
        return None
    shapes: dict[str, tuple[int, ...]] = {
        "embeddings.word_embeddings.weight": (v, hid),
        "embeddings.position_embeddings.weight": (pos, hid),
        "embeddings.LayerNorm.weight": (hid,),
        "embeddings.LayerNorm.bias": (hid,),
    }
    for n in range(layers):
        p = f"encoder.layer.{n}"
        for part in ("query", "key", "value"):
            shapes[f"{p}.attention.self.{part}.weight"] = (hid, hid)
            shapes[f"{p}.attention.self.{part}.bias"] = (hid,)
        shapes[f"{p}.attention.output.dense.weight"] = (hid, hid)
        shapes[f"{p}.attention.output.dense.bias"] = (hid,)
        shapes[f"{p}.attention.output.LayerNorm.weight"] = (hid,)
        shapes[f"{p}.attention.output.LayerNorm.bias"] = (hid,)
        shapes[f"{p}.intermediate.dense.weight"] = (inter, hid)
        shapes[f"{p}.intermediate.dense.bias"] = (inter,)
        shapes[f"{p}.output.dense.weight"] = (hid, inter)
        shapes[f"{p}.output.dense.bias"] = (hid,)
        shapes[f"{p}.output.LayerNorm.weight"] = (hid,)
        shapes[f"{p}.output.LayerNorm.bias"] = (hid,)
    return shapes


def model_problems(
    meta: Mapping[str, str], token_count: int | None, shapes: Mapping[str, tuple[int, ...]]
) -> list[tuple[str, str]]:
    """(field, message) for every disagreement between the metadata, the vocabulary and the
    tensors. The BERT checks run when the file has `embeddings.word_embeddings.weight`."""
    out: list[tuple[str, str]] = []
    vals = {k: decimal(meta.get(k, "")) for k in INTEGER_KEYS}
    vocab = vals["vocab_size"]
    if vocab is not None and token_count is not None and token_count > vocab:
        out.append(
            (
                "vocab_size",
                f"the vocabulary has {token_count:,} tokens but vocab_size is {vocab:,}: ids "
                "past vocab_size have no embedding",
            )
        )
    heads, hid = vals["num_attention_heads"], vals["hidden_size"]
    if heads is not None and hid is not None and (heads == 0 or hid % heads):
        out.append(
            (
                "num_attention_heads",
                f"hidden_size {hid} is not a multiple of num_attention_heads {heads}",
            )
        )
    if "embeddings.word_embeddings.weight" not in shapes:
        return out
    want = bert_shapes(meta)
    if want is None:
        return out
    for name, shape in want.items():
        got = shapes.get(name)
        if got is None:
            out.append((name, f"BERT tensor {name!r} is missing"))
        elif tuple(got) != shape:
            out.append((name, f"{name!r} has shape {list(got)}, the metadata gives {list(shape)}"))
    tt = shapes.get("embeddings.token_type_embeddings.weight")
    if hid is not None and tt is not None and (len(tt) != 2 or tt[1] != hid):
        out.append(
            (
                "embeddings.token_type_embeddings.weight",
                f"'embeddings.token_type_embeddings.weight' has shape {list(tt)}, expected "
                f"[types, {hid}]",
            )
        )
    layers = vals["num_layers"] or 0
    extra = sorted(n for n in layer_indices(list(shapes)) if n >= layers)
    if extra:
        out.append(
            (
                "num_layers",
                f"num_layers is {layers} but the file has encoder.layer.{extra[0]}: a runtime "
                "would skip it",
            )
        )
    if hid is not None:
        pooler = {"pooler.dense.weight": (hid, hid), "pooler.dense.bias": (hid,)}
        for name, shape in pooler.items():
            got = shapes.get(name)
            if got is not None and tuple(got) != shape:
                out.append((name, f"{name!r} has shape {list(got)}, expected {list(shape)}"))
    return out
