"""A small numpy forward pass of a BERT sentence encoder (all-MiniLM-L6-v2 and kin).

Used by the embedding-parity tests: weights go in as a name -> array mapping (from whichever
container is under test), token ids in, L2-normalized mean-pooled sentence embeddings out.
Written from the BERT architecture: embeddings (word + position + token type) and LayerNorm,
then per layer self-attention with an additive mask, residual and LayerNorm, a GELU (erf) feed
forward, residual and LayerNorm; then mean pooling over real tokens and L2 normalization.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

_erf = np.frompyfunc(math.erf, 1, 1)


def gelu(x: np.ndarray) -> np.ndarray:
    """Exact GELU: x * (1 + erf(x / sqrt(2))) / 2 (the one BERT uses, not the tanh variant)."""
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)).astype(x.dtype))


def layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def encode(
    weights: Mapping[str, np.ndarray],
    batch: Sequence[Sequence[int]],
    *,
    num_layers: int,
    num_heads: int,
    eps: float = 1e-12,
    pad_id: int = 0,
) -> np.ndarray:
    """Embeddings of each id sequence (padded into one batch, masked), shape (batch, hidden)."""
    w = {k: np.asarray(v, dtype=np.float64) for k, v in weights.items()}
    n = max(len(s) for s in batch)
    ids = np.full((len(batch), n), pad_id, dtype=np.int64)
    mask = np.zeros((len(batch), n), dtype=np.float64)
    for i, seq in enumerate(batch):
        ids[i, : len(seq)] = seq
        mask[i, : len(seq)] = 1.0
    x = (
        w["embeddings.word_embeddings.weight"][ids]
        + w["embeddings.position_embeddings.weight"][np.arange(n)][None, :, :]
        + w["embeddings.token_type_embeddings.weight"][0][None, None, :]
    )
    x = layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)
    hidden = x.shape[-1]
    head = hidden // num_heads
    additive = (1.0 - mask)[:, None, None, :] * -1e9  # padded keys get no attention

    def dense(h: np.ndarray, name: str) -> np.ndarray:
        # One 2-D product: numpy's stacked (3-D) matmul with a transposed operand skips BLAS
        # and is ~50x slower here.
        flat = h.reshape(-1, h.shape[-1]) @ w[f"{name}.weight"].T
        return flat.reshape(*h.shape[:-1], -1) + w[f"{name}.bias"]

    def split(h: np.ndarray) -> np.ndarray:
        return h.reshape(h.shape[0], n, num_heads, head).transpose(0, 2, 1, 3)

    for layer in range(num_layers):
        p = f"encoder.layer.{layer}"
        q = split(dense(x, f"{p}.attention.self.query"))
        k = split(dense(x, f"{p}.attention.self.key"))
        v = split(dense(x, f"{p}.attention.self.value"))
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(head) + additive
        scores -= scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(axis=-1, keepdims=True)
        ctx = (probs @ v).transpose(0, 2, 1, 3).reshape(x.shape[0], n, hidden)
        x = layer_norm(
            x + dense(ctx, f"{p}.attention.output.dense"),
            w[f"{p}.attention.output.LayerNorm.weight"],
            w[f"{p}.attention.output.LayerNorm.bias"],
            eps,
        )
        inner = gelu(dense(x, f"{p}.intermediate.dense"))
        x = layer_norm(
            x + dense(inner, f"{p}.output.dense"),
            w[f"{p}.output.LayerNorm.weight"],
            w[f"{p}.output.LayerNorm.bias"],
            eps,
        )
    pooled = (x * mask[:, :, None]).sum(axis=1) / mask.sum(axis=1, keepdims=True)
    return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)
