"""Load, describe and validate Hugging Face model folders (`inspect MODEL_DIR`, `verify
MODEL_DIR`, and the checks `convert MODEL_DIR ...` runs first).

Structural rules: config.json and the small files; model.safetensors (or each shard of a
sharded checkpoint, and the index against the shards) through the safetensors rules;
special tokens against vocab.txt; config.json against the tensors and the vocabulary.
Scans: the safetensors payload rules, and vocab.txt against tokenizer.json token by token.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

from matrixctl.errors import FormatError
from matrixctl.findings import Finding, finding, findings_of, from_error
from matrixctl.formats import embd, hf_model, st_container
from matrixctl.tensors import tensor_row
from matrixctl.validate.engine import rule, rules_for

FMT = hf_model.FORMAT


class ShardSubject:
    """One safetensors file of the folder, parsed (or the error that stopped its parse)."""

    def __init__(self, shard: hf_model.Shard) -> None:
        from matrixctl.validate.st_container import StSubject

        self.name = shard.name
        self.st: StSubject | None = None
        self.error: FormatError | None = None
        try:
            self.st = StSubject(
                shard.source, st_container.parse(shard.source.buf, shard.source.size)
            )
        except FormatError as err:
            self.error = err


class HfSubject:
    def __init__(self, model: hf_model.HfModel) -> None:
        self.model = model
        self.shards = [ShardSubject(shard) for shard in model.weights]

    def close(self) -> None:
        self.model.close()

    @property
    def parsed(self) -> bool:
        """Every safetensors file parsed without a structural problem."""
        return all(s.st is not None and not s.st.st.problems for s in self.shards)

    def tensors(self) -> list[Any]:
        return [t for s in self.shards if s.st is not None for t in s.st.st.tensors]

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {t.name: t.shape for t in self.tensors()}


def load_dir(path: str) -> HfSubject:
    return HfSubject(hf_model.load(path))


def describe(s: HfSubject) -> dict[str, Any]:
    m = s.model
    out: dict[str, Any] = {}
    cfg = m.config
    for key in (
        "model_type",
        "architectures",
        "hidden_act",
        "layer_norm_eps",
        *hf_model.CONFIG_KEYS,
    ):
        if key in cfg:
            out[key] = cfg[key] if not isinstance(cfg[key], list) else ", ".join(map(str, cfg[key]))
    if m.weight_map is None:
        out["weights"] = f"{hf_model.WEIGHTS}, {m.weights_size:,} bytes"
    else:
        out["weights"] = f"{len(m.weights)} shards ({hf_model.INDEX}), {m.weights_size:,} bytes"
        out["shards"] = [{"file": sh.name, "bytes": sh.source.size} for sh in m.weights]
    if all(sh.st is not None for sh in s.shards):
        out["tensor_count"] = len(s.tensors())
    out["token_count"] = len(m.tokens) if m.tokens is not None else None
    out["metadata"] = m.model_metadata()
    if m.tokens is not None:
        out["special_tokens"] = {
            name: {"id": None if i == embd.NO_TOKEN else i, "token": m.special_text.get(name)}
            for name, i in m.special.items()
        }
    if all(sh.st is not None for sh in s.shards):
        out["tensors"] = [
            tensor_row(t.name, t.dtype, t.shape, t.offset, t.nbytes, {"file": sh.name})
            for sh in s.shards
            if sh.st is not None
            for t in sh.st.st.tensors
        ]
    return out


def _st_findings(s: HfSubject, scan: bool) -> Iterator[Finding]:
    for shard in s.shards:
        name = shard.name
        if shard.st is None:
            if shard.error is not None and not scan:
                err = shard.error
                yield finding(err.code, f"{name}: {err.message}", offset=err.offset, field=name)
            continue
        for r in rules_for(st_container.FORMAT):
            if r.scan != scan:
                continue
            try:
                found = list(r.fn(shard.st))
            except FormatError as err:
                found = [from_error(err)]
            for f in found:
                yield finding(
                    f.code,
                    f"{name}: {f.message}",
                    offset=f.offset,
                    field=f"{name}/{f.field}" if f.field else name,
                    severity=f.severity,
                )


@rule(FMT, "config.json and the folder's files")
def check_files(s: HfSubject) -> Iterator[Finding]:
    yield from findings_of(s.model.problems)


@rule(FMT, "model.safetensors (or each shard) structure")
def check_weights(s: HfSubject) -> Iterator[Finding]:
    yield from _st_findings(s, scan=False)


@rule(FMT, "the shard index agrees with the shards")
def check_index(s: HfSubject) -> Iterator[Finding]:
    weight_map = s.model.weight_map
    if weight_map is None or not s.parsed:
        return
    seen: dict[str, str] = {}
    for shard in s.shards:
        assert shard.st is not None
        for t in shard.st.st.tensors:
            if t.name in seen:
                yield finding(
                    hf_model.HF_INDEX,
                    f"tensor {t.name!r} is in {seen[t.name]} and in {shard.name}",
                    field=f"{shard.name}/{t.name}",
                )
                continue
            seen[t.name] = shard.name
            listed = weight_map.get(t.name)
            if listed != shard.name:
                where = "in no weight_map entry" if listed is None else f"listed under {listed}"
                yield finding(
                    hf_model.HF_INDEX,
                    f"tensor {t.name!r} of {shard.name} is {where}",
                    field=f"weight_map/{t.name}",
                )
    for name, shard_name in weight_map.items():
        if name not in seen:
            yield finding(
                hf_model.HF_INDEX,
                f"weight_map puts {name!r} in {shard_name}, which has no such tensor",
                field=f"weight_map/{name}",
            )


@rule(FMT, "special tokens are in vocab.txt")
def check_special(s: HfSubject) -> Iterator[Finding]:
    m = s.model
    if m.tokens is None:
        return
    for name, value in m.special.items():
        if value == embd.NO_TOKEN:
            yield finding(
                hf_model.HF_SPECIAL,
                f"{name} token {m.special_text.get(name)!r} is not in vocab.txt",
                field=f"{hf_model.SPECIAL_MAP}/{name}_token",
            )
    pad = m.config.get("pad_token_id")
    want = m.special.get("pad")
    if isinstance(pad, int) and want is not None and want not in (embd.NO_TOKEN, pad):
        yield finding(
            hf_model.HF_SPECIAL,
            f"config.json pad_token_id is {pad}, but {m.special_text.get('pad')!r} is token "
            f"{want} of vocab.txt",
            field="config.json/pad_token_id",
        )


@rule(FMT, "config.json agrees with the tensors and vocab.txt")
def check_config(s: HfSubject) -> Iterator[Finding]:
    m = s.model
    if not s.parsed:
        return
    meta = m.model_metadata()
    cfg_vocab = m.config.get("vocab_size")
    if m.tokens is not None and isinstance(cfg_vocab, int) and len(m.tokens) > cfg_vocab:
        yield finding(
            hf_model.HF_MISMATCH,
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
        yield finding(hf_model.HF_MISMATCH, message, field=where)


@rule(FMT, "model.safetensors (or each shard) payload", scan=True)
def check_weights_payload(s: HfSubject) -> Iterator[Finding]:
    yield from _st_findings(s, scan=True)


@rule(FMT, "vocab.txt agrees with tokenizer.json", scan=True)
def check_tokenizer(s: HfSubject) -> Iterator[Finding]:
    m = s.model
    path = m.file(hf_model.TOKENIZER)
    if m.tokens is None or not os.path.isfile(path):
        return
    try:
        doc = hf_model.read_json(path, hf_model.TOKENIZER)
    except FormatError as err:
        yield finding(err.code, err.message, field=hf_model.TOKENIZER)
        return
    model = doc.get("model")
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if not isinstance(vocab, dict):
        return  # not a WordPiece-style tokenizer.json: nothing to compare
    for i, tok in enumerate(m.tokens):
        got = vocab.get(tok)
        if got is not None and got != i and m.tokens.index(tok) == i:
            yield finding(
                hf_model.HF_TOKENIZER,
                f"token {tok!r} is id {i} in vocab.txt but {json.dumps(got)} in tokenizer.json",
                field=f"{hf_model.VOCAB}[{i}]",
            )
            return
    if len(vocab) != len(set(m.tokens)):
        yield finding(
            hf_model.HF_TOKENIZER,
            f"tokenizer.json has {len(vocab):,} tokens, vocab.txt {len(set(m.tokens)):,} "
            "distinct ones",
            field=hf_model.TOKENIZER,
        )
