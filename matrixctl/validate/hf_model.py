"""Load, describe and validate Hugging Face model folders (`inspect MODEL_DIR`, `verify
MODEL_DIR`, and the checks `convert MODEL_DIR ...` runs first).

Structural rules: config.json and the small files; model.safetensors through the safetensors
rules; special tokens against vocab.txt; config.json against the tensors and the vocabulary.
Scans: the safetensors payload rules, and vocab.txt against tokenizer.json token by token.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

from matrixctl.errors import FormatError
from matrixctl.formats import embd
from matrixctl.formats import hf_model as hf
from matrixctl.formats import st_container as stc
from matrixctl.validate.engine import rule, rules_for
from matrixctl.validate.findings import Finding, finding, from_error

FMT = hf.FORMAT


class HfSubject:
    def __init__(self, model: hf.HfModel) -> None:
        from matrixctl.validate.st_container import StSubject

        self.model = model
        self.st_error: FormatError | None = None
        self.st: StSubject | None = None
        try:
            self.st = StSubject(model.weights, stc.parse(model.weights.buf, model.weights.size))
        except FormatError as err:
            self.st_error = err

    def close(self) -> None:
        self.model.close()

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {t.name: t.shape for t in self.st.st.tensors} if self.st else {}


def load_dir(path: str) -> HfSubject:
    return HfSubject(hf.load(path))


def describe(s: HfSubject) -> dict[str, Any]:
    m = s.model
    out: dict[str, Any] = {}
    cfg = m.config
    for key in ("model_type", "architectures", "hidden_act", "layer_norm_eps", *hf.CONFIG_KEYS):
        if key in cfg:
            out[key] = cfg[key] if not isinstance(cfg[key], list) else ", ".join(map(str, cfg[key]))
    out["weights"] = f"{hf.WEIGHTS}, {m.weights.size:,} bytes"
    if s.st is not None:
        out["tensor_count"] = len(s.st.st.tensors)
    out["token_count"] = len(m.tokens) if m.tokens is not None else None
    out["metadata"] = m.model_metadata()
    if m.tokens is not None:
        out["special_tokens"] = {
            name: {"id": None if i == embd.NO_TOKEN else i, "token": m.special_text.get(name)}
            for name, i in m.special.items()
        }
    if s.st is not None:
        out["tensors"] = [
            {"name": t.name, "dtype": t.dtype, "shape": list(t.shape), "bytes": t.nbytes}
            for t in s.st.st.tensors
        ]
    return out


def _st_findings(s: HfSubject, scan: bool) -> Iterator[Finding]:
    if s.st is None:
        if s.st_error is not None and not scan:
            err = s.st_error
            yield finding(
                err.code, f"{hf.WEIGHTS}: {err.message}", offset=err.offset, field=err.field
            )
        return
    for r in rules_for(stc.FORMAT):
        if r.scan != scan:
            continue
        try:
            found = list(r.fn(s.st))
        except FormatError as err:
            found = [from_error(err)]
        for f in found:
            yield finding(
                f.code,
                f"{hf.WEIGHTS}: {f.message}",
                offset=f.offset,
                field=f"{hf.WEIGHTS}/{f.field}" if f.field else hf.WEIGHTS,
                severity=f.severity,
            )


@rule(FMT, "config.json and the folder's files")
def check_files(s: HfSubject) -> Iterator[Finding]:
    for code, message, where in s.model.problems:
        yield finding(code, message, field=where)


@rule(FMT, "model.safetensors structure")
def check_weights(s: HfSubject) -> Iterator[Finding]:
    yield from _st_findings(s, scan=False)


@rule(FMT, "special tokens are in vocab.txt")
def check_special(s: HfSubject) -> Iterator[Finding]:
    m = s.model
    if m.tokens is None:
        return
    for name, value in m.special.items():
        if value == embd.NO_TOKEN:
            yield finding(
                hf.HF_SPECIAL,
                f"{name} token {m.special_text.get(name)!r} is not in vocab.txt",
                field=f"{hf.SPECIAL_MAP}/{name}_token",
            )
    pad = m.config.get("pad_token_id")
    want = m.special.get("pad")
    if isinstance(pad, int) and want is not None and want not in (embd.NO_TOKEN, pad):
        yield finding(
            hf.HF_SPECIAL,
            f"config.json pad_token_id is {pad}, but {m.special_text.get('pad')!r} is token "
            f"{want} of vocab.txt",
            field="config.json/pad_token_id",
        )


@rule(FMT, "config.json agrees with the tensors and vocab.txt")
def check_config(s: HfSubject) -> Iterator[Finding]:
    m = s.model
    if s.st is None or s.st.st.problems:
        return
    meta = m.model_metadata()
    cfg_vocab = m.config.get("vocab_size")
    if m.tokens is not None and isinstance(cfg_vocab, int) and len(m.tokens) > cfg_vocab:
        yield finding(
            hf.HF_MISMATCH,
            f"vocab.txt has {len(m.tokens):,} tokens, config.json vocab_size is {cfg_vocab:,}",
            field="config.json/vocab_size",
        )
    missing = [k for k in embd.INTEGER_KEYS if k not in meta]
    if missing:
        return  # not a BERT-style config: nothing to compare
    count = len(m.tokens) if m.tokens is not None else None
    for where, message in embd.model_problems(meta, count, s.shapes()):
        if where == "vocab_size":
            continue  # reported above with the file names
        yield finding(hf.HF_MISMATCH, message, field=where)


@rule(FMT, "model.safetensors payload", scan=True)
def check_weights_payload(s: HfSubject) -> Iterator[Finding]:
    yield from _st_findings(s, scan=True)


@rule(FMT, "vocab.txt agrees with tokenizer.json", scan=True)
def check_tokenizer(s: HfSubject) -> Iterator[Finding]:
    m = s.model
    path = m.file(hf.TOKENIZER)
    if m.tokens is None or not os.path.isfile(path):
        return
    try:
        doc = hf.read_json(path, hf.TOKENIZER)
    except FormatError as err:
        yield finding(err.code, err.message, field=hf.TOKENIZER)
        return
    model = doc.get("model")
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if not isinstance(vocab, dict):
        return  # not a WordPiece-style tokenizer.json: nothing to compare
    for i, tok in enumerate(m.tokens):
        got = vocab.get(tok)
        if got is not None and got != i and m.tokens.index(tok) == i:
            yield finding(
                hf.HF_TOKENIZER,
                f"token {tok!r} is id {i} in vocab.txt but {json.dumps(got)} in tokenizer.json",
                field=f"{hf.VOCAB}[{i}]",
            )
            return
    if len(vocab) != len(set(m.tokens)):
        yield finding(
            hf.HF_TOKENIZER,
            f"tokenizer.json has {len(vocab):,} tokens, vocab.txt {len(set(m.tokens)):,} "
            "distinct ones",
            field=hf.TOKENIZER,
        )
