"""Load, describe and validate a Hugging Face `tokenizer.json` as a model tokenizer.

`inspect` shows what `tokenize model` would use: the family, pre-tokenizer, vocabulary size,
special tokens and the BOS/EOS the post-processor adds. `verify`: the file is a UTF-8 JSON
object with a `model` object (HF_TOKENIZER_JSON, error), and its vocabulary data is consistent
(TOKENIZER_VOCAB, error). A sound tokenizer.json whose model or options matrixctl does not
implement exactly is intact: that is an info finding (HF_TOKENIZER_UNSUPPORTED, exit 0), never
a failure; `tokenize model` and `ingest docs --tokenizer` refuse it with TOKENIZER_UNSUPPORTED.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from matrixctl import codes
from matrixctl.errors import FormatError
from matrixctl.findings import Finding, finding
from matrixctl.formats import hf_tokenizer
from matrixctl.io import Source
from matrixctl.validate.engine import rule, sample, shown

FMT = hf_tokenizer.FORMAT
PREVIEW = 12
MAX_BYTES = 1 << 30
G = FMT
HF_TOKENIZER_JSON = codes.define(
    "HF_TOKENIZER_JSON",
    "A tokenizer.json is not a UTF-8 JSON object with a model object (or exceeds 1 GiB).",
    group=G,
)
HF_TOKENIZER_UNSUPPORTED = codes.define(
    "HF_TOKENIZER_UNSUPPORTED",
    "An intact tokenizer.json whose model or options matrixctl does not implement exactly "
    "(tokenize model refuses it; verify passes it).",
    group=G,
    unsupported=True,
)


@dataclass
class TokenizerSubject:
    src: Source
    obj: dict[str, Any] | None
    tok: Any  # the ModelTokenizer, or None
    findings: list[Finding]


def load(src: Source) -> TokenizerSubject:
    from matrixctl.tokenizers.model.base import TOKENIZER_UNSUPPORTED
    from matrixctl.tokenizers.model.load import from_tokenizer_json

    if src.size > MAX_BYTES:
        return TokenizerSubject(
            src, None, None, [finding(HF_TOKENIZER_JSON, f"{src.size:,} bytes, over 1 GiB")]
        )
    try:
        obj = json.loads(bytes(src.buf[: src.size]))
    except UnicodeDecodeError as exc:
        bad = finding(HF_TOKENIZER_JSON, f"not UTF-8: {exc.reason}", offset=exc.start)
        return TokenizerSubject(src, None, None, [bad])
    except (ValueError, RecursionError) as exc:
        return TokenizerSubject(src, None, None, [finding(HF_TOKENIZER_JSON, f"not JSON: {exc}")])
    if not isinstance(obj, dict) or not isinstance(obj.get("model"), dict):
        bad = finding(HF_TOKENIZER_JSON, "not a JSON object with a model object", field="model")
        return TokenizerSubject(src, None, None, [bad])
    try:
        tok = from_tokenizer_json(obj)
    except FormatError as err:
        code = HF_TOKENIZER_UNSUPPORTED if err.code == TOKENIZER_UNSUPPORTED else err.code
        return TokenizerSubject(src, obj, None, [finding(code, err.message, field=err.field)])
    return TokenizerSubject(src, obj, tok, [])


def describe(s: TokenizerSubject) -> dict[str, Any]:
    out: dict[str, Any] = {"size": s.src.size}
    obj = s.obj
    if obj is None:
        return out
    model = obj.get("model") or {}
    out["model_type"] = model.get("type")
    for key in ("normalizer", "pre_tokenizer", "post_processor", "decoder"):
        part = obj.get(key)
        out[key] = part.get("type") if isinstance(part, dict) else None
    if s.tok is not None:
        out["tokenizer"] = s.tok.describe()
    added = obj.get("added_tokens")
    if isinstance(added, list):
        special = [
            {"id": a.get("id"), "text": a.get("content")}
            for a in added
            if isinstance(a, dict) and a.get("special")
        ]
        out["special_tokens"] = sample(special[: shown(PREVIEW)], len(special))
    return out


@rule(FMT, "JSON object with a model; a tokenizer matrixctl builds exactly")
def check(s: TokenizerSubject) -> Iterator[Finding]:
    yield from s.findings
