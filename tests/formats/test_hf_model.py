"""Hugging Face model folders as a convert source: a tiny BERT built here, every check."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from matrixctl.codes import Severity
from matrixctl.converters.tensors import open_source
from matrixctl.formats import embd, hf_model
from matrixctl.validate.engine import examine
from tests.helpers.bert_numpy import encode
from tests.helpers.cli import run_cli

TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", "##s", "a", "b"]
H, HEADS, INTER, LAYERS, POS = 4, 2, 8, 2, 16


def layer(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    p = f"encoder.layer.{n}"
    out = {}
    for part in ("query", "key", "value"):
        out[f"{p}.attention.self.{part}.weight"] = rng.standard_normal((H, H), np.float32)
        out[f"{p}.attention.self.{part}.bias"] = rng.standard_normal(H, np.float32)
    out[f"{p}.attention.output.dense.weight"] = rng.standard_normal((H, H), np.float32)
    out[f"{p}.attention.output.dense.bias"] = rng.standard_normal(H, np.float32)
    out[f"{p}.attention.output.LayerNorm.weight"] = np.ones(H, np.float32)
    out[f"{p}.attention.output.LayerNorm.bias"] = np.zeros(H, np.float32)
    out[f"{p}.intermediate.dense.weight"] = rng.standard_normal((INTER, H), np.float32)
    out[f"{p}.intermediate.dense.bias"] = rng.standard_normal(INTER, np.float32)
    out[f"{p}.output.dense.weight"] = rng.standard_normal((H, INTER), np.float32)
    out[f"{p}.output.dense.bias"] = rng.standard_normal(H, np.float32)
    out[f"{p}.output.LayerNorm.weight"] = np.ones(H, np.float32)
    out[f"{p}.output.LayerNorm.bias"] = np.zeros(H, np.float32)
    return out


def tiny_weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    w = {
        "embeddings.position_ids": np.arange(POS, dtype=np.int64)[None],
        "embeddings.word_embeddings.weight": rng.standard_normal((len(TOKENS), H), np.float32),
        "embeddings.position_embeddings.weight": rng.standard_normal((POS, H), np.float32),
        "embeddings.token_type_embeddings.weight": rng.standard_normal((2, H), np.float32),
        "embeddings.LayerNorm.weight": np.ones(H, np.float32),
        "embeddings.LayerNorm.bias": np.zeros(H, np.float32),
        "pooler.dense.weight": rng.standard_normal((H, H), np.float32),
        "pooler.dense.bias": np.zeros(H, np.float32),
    }
    for n in range(LAYERS):
        w.update(layer(rng, n))
    return w


CONFIG = {
    "_name_or_path": "someone/tiny-bert",
    "architectures": ["BertModel"],
    "hidden_act": "gelu",
    "hidden_size": H,
    "intermediate_size": INTER,
    "layer_norm_eps": 1e-12,
    "max_position_embeddings": POS,
    "model_type": "bert",
    "num_attention_heads": HEADS,
    "num_hidden_layers": LAYERS,
    "pad_token_id": 0,
    "type_vocab_size": 2,
    "vocab_size": len(TOKENS),
}


def make_model(
    folder: Path, *, config: dict | None = None, tokens: list[str] | None = None
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(CONFIG if config is None else config))
    save_file(tiny_weights(), str(folder / "model.safetensors"), metadata={"format": "pt"})
    toks = TOKENS if tokens is None else tokens
    (folder / "vocab.txt").write_text("".join(t + "\n" for t in toks))
    (folder / "special_tokens_map.json").write_text(
        json.dumps({"cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]"})
    )
    (folder / "tokenizer.json").write_text(
        json.dumps({"model": {"type": "WordPiece", "vocab": {t: i for i, t in enumerate(TOKENS)}}})
    )
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": H, "pooling_mode_mean_tokens": True})
    )
    (folder / "modules.json").write_text(
        json.dumps([{"type": "sentence_transformers.models.Normalize"}])
    )
    return folder


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return make_model(tmp_path / "tiny-model")


def codes_of(report) -> set[str]:
    return {f.code for f in report.findings}


def errors_of(report) -> set[str]:
    return {f.code for f in report.findings if f.severity is Severity.ERROR}


def test_folder_is_recognised_inspected_and_verified(model: Path) -> None:
    """Decision: a folder with config.json and model.safetensors is a Hugging Face model folder
    (format hf-model-dir), found by its files, never by its name."""
    report = examine(str(model), scan=True)[0]
    assert report.format == "hf-model-dir" and report.ok(strict=True), report.findings
    doc = run_cli("inspect", "--json", str(model)).json()["files"][0]
    assert doc["format"] == "hf-model-dir" and doc["token_count"] == len(TOKENS)
    assert doc["metadata"]["num_layers"] == str(LAYERS) and doc["tensor_count"] == 8 + 16 * LAYERS
    assert doc["special_tokens"]["cls"] == {"id": 2, "token": "[CLS]"}
    assert run_cli("verify", str(model)).code == 0
    other = model.parent / "other"
    other.mkdir()
    (other / "config.json").write_text("{}")
    result = run_cli("convert", str(other), str(model.parent / "o.weights"))
    assert result.code == 2 and "UNKNOWN_FOLDER" in result.stderr
    assert "has config.json but no model.safetensors" in result.stderr


def test_convert_fills_metadata_and_vocabulary_from_the_folder(model: Path) -> None:
    """Decision: EMBD metadata comes from config.json (num_hidden_layers -> num_layers,
    max_position_embeddings -> max_position_emb, ..., plus layer_norm_eps, hidden_act,
    model_type), the sentence-transformers files (pooling, normalize, embedding_dim) and
    model_name from config.json's _name_or_path (its last part; the folder's name without
    one); the vocabulary from vocab.txt, special ids from special_tokens_map.json, else BERT's
    [PAD] [UNK] [CLS] [SEP] [MASK]."""
    out = model.parent / "m.weights"
    result = run_cli("convert", str(model), str(out), env={"SOURCE_DATE_EPOCH": "0"})
    assert result.code == 0, result.stderr
    assert "left out 'embeddings.position_ids'" in result.stderr
    f = embd.parse(out.read_bytes(), out.stat().st_size)
    meta = f.meta
    assert meta["model_name"] == "tiny-bert" and meta["num_layers"] == "2"
    assert meta["num_attention_heads"] == "2" and meta["max_position_emb"] == str(POS)
    assert meta["layer_norm_eps"] == "1e-12" and meta["pooling"] == "mean"
    assert meta["normalize"] == "true" and meta["created_at"] == "1970-01-01T00:00:00Z"
    assert f.tokens == TOKENS
    assert f.special == {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}
    assert "pooler.dense.weight" in {t.name for t in f.tensors}
    assert examine(str(out), scan=True)[0].ok(strict=True)
    again = model.parent / "m2.weights"
    assert run_cli("convert", str(model), str(again), env={"SOURCE_DATE_EPOCH": "0"}).code == 0
    assert again.read_bytes() == out.read_bytes()
    cfg = dict(CONFIG)
    del cfg["_name_or_path"]
    (model / "config.json").write_text(json.dumps(cfg))
    assert run_cli("convert", str(model), str(out)).code == 0
    assert embd.parse(out.read_bytes(), out.stat().st_size).meta["model_name"] == "tiny-model"


def test_weights_give_the_same_embeddings(model: Path) -> None:
    """The numpy forward pass gives the same embeddings from the .weights (read with
    matrixctl's reader, config and pad id from the file) as from the folder's safetensors."""
    out = model.parent / "m.weights"
    assert run_cli("convert", str(model), str(out)).code == 0
    batch = [[2, 5, 6, 7, 3], [2, 8, 3], [2, 9, 9, 1, 5, 3]]
    want = encode(load_file(str(model / "model.safetensors")), batch, num_layers=2, num_heads=2)
    with open_source(str(out)) as src:
        meta = src.metadata()
        weights = {i.name: src.array(i).reshape(i.shape) for i in src.tensors()}
        got = encode(
            weights,
            batch,
            num_layers=int(meta["num_layers"]),
            num_heads=int(meta["num_attention_heads"]),
            eps=float(meta["layer_norm_eps"]),
            pad_id=src.special["pad"],
        )
    assert np.array_equal(got, want)


@pytest.mark.parametrize(("dtype", "name"), [("float16", "f16"), ("bfloat16", "bf16")])
def test_half_precision_is_an_explicit_option(model: Path, dtype: str, name: str) -> None:
    out = model.parent / f"{name}.weights"
    assert run_cli("convert", str(model), str(out), "--dtype", dtype).code == 0
    f = embd.parse(out.read_bytes(), out.stat().st_size)
    assert {t.dtype for t in f.tensors} == {name}
    assert examine(str(out), scan=True)[0].ok(strict=True)


@pytest.mark.parametrize("ext", [".safetensors", ".zt", ".npz"])
def test_folder_to_other_containers(model: Path, ext: str) -> None:
    out = model.parent / f"m{ext}"
    assert run_cli("convert", str(model), str(out)).code == 0
    want = tiny_weights()
    with open_source(str(out)) as src:
        got = {i.name: src.array(i).reshape(i.shape) for i in src.tensors()}
    assert sorted(got) == sorted(want)
    assert all(np.array_equal(got[k], want[k]) for k in want)
    stb = model.parent / "m.stb"
    refused = run_cli("convert", str(model), str(stb))
    assert refused.code == 1 and "--dtype 'embeddings.position_ids=D'" in refused.stderr
    assert run_cli("convert", str(model), str(stb), "--exclude", "*position_ids").code == 0


def test_vocab_txt_is_read_as_transformers_reads_it(tmp_path: Path) -> None:
    """Decision: one token per line, the line without its "\\n" (a "\\r" stays, as in
    transformers' load_vocab), id = line number; a final newline ends the last line."""
    path = tmp_path / "vocab.txt"
    path.write_bytes(b"[PAD]\na\r\n\xc3\xa9\nlast")
    assert hf_model.read_vocab(str(path)) == ["[PAD]", "a\r", "é", "last"]
    path.write_bytes(b"x\ny\n")
    assert hf_model.read_vocab(str(path)) == ["x", "y"]


@pytest.mark.parametrize(
    ("change", "code"),
    [
        (lambda m: (m / "config.json").write_text("{not json"), hf_model.HF_CONFIG),
        (lambda m: (m / "config.json").write_text("[1, 2]"), hf_model.HF_CONFIG),
        (
            lambda m: (m / "config.json").write_text(json.dumps({**CONFIG, "hidden_size": "4"})),
            hf_model.HF_CONFIG,
        ),
        (lambda m: (m / "vocab.txt").write_bytes(b"\xff\xfe"), hf_model.HF_FILE),
        (
            lambda m: (m / "config.json").write_text(json.dumps({**CONFIG, "hidden_size": 8})),
            hf_model.HF_MISMATCH,
        ),
        (
            lambda m: (m / "config.json").write_text(json.dumps({**CONFIG, "vocab_size": 5})),
            hf_model.HF_MISMATCH,
        ),
        (
            lambda m: (m / "config.json").write_text(
                json.dumps({**CONFIG, "num_hidden_layers": 1})
            ),
            hf_model.HF_MISMATCH,
        ),
        (
            lambda m: (m / "model.safetensors").write_bytes(
                (m / "model.safetensors").read_bytes()[:-10]
            ),
            "ST_TRUNCATED",  # a cut file: one root cause
        ),
    ],
)
def test_broken_folders(model: Path, change, code: str) -> None:
    change(model)
    report = examine(str(model), scan=True)[0]
    assert code in errors_of(report), report.findings
    assert run_cli("verify", str(model)).code == 1
    out = model.parent / "o.weights"
    result = run_cli("convert", str(model), str(out))
    assert result.code == 1 and code in result.stderr and not out.exists()


def test_vocab_misordered_against_tokenizer_json(model: Path) -> None:
    """A vocab.txt whose order differs from tokenizer.json's ids is HF_TOKENIZER (verify):
    exactly the silent failure a misordered vocabulary causes."""
    swapped = list(TOKENS)
    swapped[5], swapped[6] = swapped[6], swapped[5]
    (model / "vocab.txt").write_text("".join(t + "\n" for t in swapped))
    report = examine(str(model), scan=True)[0]
    assert errors_of(report) == {hf_model.HF_TOKENIZER}
    assert examine(str(model), scan=False)[0].ok()  # a scan: inspect does not read it


def test_warnings_for_missing_vocabulary_and_special_tokens(model: Path) -> None:
    """Decision: a folder without vocab.txt is valid (warning HF_NO_VOCAB) and converts to an
    EMBD file without a vocabulary; a special token missing from vocab.txt, or a pad_token_id
    naming another token, is a warning (HF_SPECIAL)."""
    (model / "special_tokens_map.json").write_text(json.dumps({"mask_token": "<mask>"}))
    (model / "config.json").write_text(json.dumps({**CONFIG, "pad_token_id": 1}))
    report = examine(str(model), scan=True)[0]
    assert codes_of(report) == {hf_model.HF_SPECIAL} and report.ok()
    (model / "vocab.txt").unlink()
    report = examine(str(model), scan=True)[0]
    assert codes_of(report) == {hf_model.HF_NO_VOCAB} and report.ok()
    out = model.parent / "nv.weights"
    result = run_cli("convert", str(model), str(out))
    assert result.code == 0 and "no vocabulary" in result.stderr
    assert embd.parse(out.read_bytes(), out.stat().st_size).tokens is None


def shard_model(folder: Path, parts: int = 3) -> dict[str, str]:
    """Turn the folder's model.safetensors into `parts` shards with an index, the way
    transformers' save_pretrained lays them out; return the weight_map."""
    weights = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    names = sorted(weights)
    shard_of = {
        n: f"model-{i % parts + 1:05d}-of-{parts:05d}.safetensors" for i, n in enumerate(names)
    }
    for i in range(parts):
        shard = f"model-{i + 1:05d}-of-{parts:05d}.safetensors"
        chunk = {n: weights[n] for n in names if shard_of[n] == shard}
        save_file(chunk, str(folder / shard), metadata={"format": "pt"})
    weight_map = {n: shard_of[n] for n in names}  # sorted by name, as transformers writes it
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return weight_map


def test_sharded_checkpoint_is_the_same_model(model: Path, tmp_path: Path) -> None:
    """A sharded checkpoint (model.safetensors.index.json) is the same model: inspect lists the
    shards, verify passes, every tensor converts to the same values. Decision: tensors come in
    the weight_map's order, so the output does not depend on where the shards were cut."""
    env = {"SOURCE_DATE_EPOCH": "0"}
    weight_map = shard_model(model, parts=3)
    assert not (model / "model.safetensors").exists()
    report = examine(str(model), scan=True)[0]
    assert report.format == "hf-model-dir" and report.ok() and not report.findings
    inspected = run_cli("inspect", "--json", str(model)).json()["files"][0]
    assert [s["file"] for s in inspected["shards"]] == [
        f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)
    ]
    assert inspected["tensor_count"] == len(tiny_weights())
    with open_source(str(model)) as src:
        assert [t.name for t in src.tensors()] == list(weight_map)
    back = tmp_path / "back.safetensors"
    assert run_cli("convert", str(model), str(back)).code == 0
    got = load_file(str(back))
    assert got.keys() == tiny_weights().keys()
    for name, arr in tiny_weights().items():
        assert np.array_equal(got[name], arr), name
    # Cut in two instead of three: the same .weights bytes.
    first = tmp_path / "three.weights"
    assert run_cli("convert", str(model), str(first), env=env).code == 0
    other = make_model(tmp_path / "two")
    shard_model(other, parts=2)
    second = tmp_path / "two.weights"
    assert run_cli("convert", str(other), str(second), env=env).code == 0
    assert first.read_bytes() == second.read_bytes()


def _rewrite_index(folder: Path, change) -> None:
    path = folder / "model.safetensors.index.json"
    doc = json.loads(path.read_text())
    change(doc["weight_map"])
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize(
    ("change", "field"),
    [
        # a tensor moved to the wrong shard
        (
            lambda wm: (
                wm.update({"pooler.dense.bias": "model-00001-of-00003.safetensors"})
                if wm["pooler.dense.bias"] != "model-00001-of-00003.safetensors"
                else wm.update({"pooler.dense.bias": "model-00002-of-00003.safetensors"})
            ),
            "weight_map/pooler.dense.bias",
        ),
        # a tensor the shards do not hold
        (
            lambda wm: wm.update({"ghost.weight": "model-00001-of-00003.safetensors"}),
            "weight_map/ghost.weight",
        ),
        # a tensor of a shard the index forgot
        (lambda wm: wm.pop("pooler.dense.bias"), "weight_map/pooler.dense.bias"),
    ],
)
def test_sharded_index_that_disagrees_with_the_shards(model: Path, change, field: str) -> None:
    shard_model(model)
    _rewrite_index(model, change)
    report = examine(str(model), scan=False)[0]
    assert [(f.code, f.field) for f in report.findings] == [(hf_model.HF_INDEX, field)]
    out = model.parent / "o.weights"
    result = run_cli("convert", str(model), str(out))
    assert result.code == 1 and "HF_INDEX" in result.stderr and not out.exists()


@pytest.mark.parametrize(
    "shard", ["../outside.safetensors", "/etc/passwd", "sub/x.safetensors", "..", "missing.st"]
)
def test_sharded_index_never_leaves_the_folder(model: Path, shard: str) -> None:
    """Decision: a shard name must be a plain file of the folder; anything else, or a missing
    shard, is HF_INDEX and nothing outside the folder is opened."""
    shard_model(model)
    (model.parent / "outside.safetensors").write_bytes(b"")
    _rewrite_index(model, lambda wm: wm.update({"pooler.dense.bias": shard}))
    result = run_cli("verify", str(model))
    assert result.code in (1, 2) and "HF_INDEX" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_tensor_in_two_shards_is_refused(model: Path) -> None:
    weight_map = shard_model(model)
    name = "pooler.dense.bias"
    other = next(s for s in sorted(set(weight_map.values())) if s != weight_map[name])
    extra = load_file(str(model / other))
    extra[name] = tiny_weights()[name]
    save_file(extra, str(model / other))
    report = examine(str(model), scan=False)[0]
    assert hf_model.HF_INDEX in errors_of(report)
    assert any(f"{name!r} is in" in f.message for f in report.findings)
