"""GGUF files for tests, built two independent ways (never by matrixctl's own code):

- by hand with `struct`, field by field from the GGUF spec (ggml docs/gguf.md), for golden
  bytes and hostile files that no writer would produce;
- with the `gguf` package's GGUFWriter, for small models with real tensors (F32, F16, BF16,
  Q8_0, Q5_0 quantized by `gguf.quants`; Q4_K and Q6_K blocks assembled by hand, since
  `gguf.quants` cannot quantize K-quants, with finite scales).
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

# Metadata value types (GGUF spec).
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)


def s(text: str | bytes) -> bytes:
    """A GGUF string: u64 length + bytes."""
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def kv(key: str | bytes, vtype: int, payload: bytes) -> bytes:
    return s(key) + struct.pack("<I", vtype) + payload


def kv_u32(key: str, value: int) -> bytes:
    return kv(key, U32, struct.pack("<I", value))


def kv_str(key: str, value: str | bytes) -> bytes:
    return kv(key, STR, s(value))


def kv_bool(key: str, value: int) -> bytes:
    return kv(key, BOOL, bytes([value]))


def arr_str(items: list[str] | list[bytes]) -> bytes:
    return struct.pack("<IQ", STR, len(items)) + b"".join(s(i) for i in items)


def arr_num(item_type: int, fmt: str, values: list) -> bytes:
    return struct.pack("<IQ", item_type, len(values)) + b"".join(
        struct.pack("<" + fmt, v) for v in values
    )


def tensor_info(name: str | bytes, dims: list[int], type_id: int, offset: int) -> bytes:
    return (
        s(name)
        + struct.pack("<I", len(dims))
        + b"".join(struct.pack("<Q", d) for d in dims)
        + struct.pack("<IQ", type_id, offset)
    )


def gguf(
    kvs: list[bytes],
    infos: list[bytes] = (),  # type: ignore[assignment]
    data: bytes = b"",
    *,
    version: int = 3,
    alignment: int = 32,
    pad: bool = True,
    tensor_count: int | None = None,
    kv_count: int | None = None,
) -> bytes:
    """Header + pairs + tensor infos, zero padding to `alignment` (when `pad` or there is
    data), then `data`."""
    head = (
        b"GGUF"
        + struct.pack("<I", version)
        + struct.pack("<Q", len(infos) if tensor_count is None else tensor_count)
        + struct.pack("<Q", len(kvs) if kv_count is None else kv_count)
    )
    body = head + b"".join(kvs) + b"".join(infos)
    if pad or data:
        body += bytes(-len(body) % alignment)
    return body + data


def small_vocab() -> list[bytes]:
    """A SentencePiece-like vocabulary: specials, the 256 byte tokens, then pieces."""
    return [
        b"<unk>",
        b"<s>",
        b"</s>",
        *[f"<0x{b:02X}>".encode() for b in range(256)],
        "▁the".encode(),
        "▁quick".encode(),
        "▁brown".encode(),
        "▁fox".encode(),
        "▁The".encode(),
        b"s",
        "▁".encode(),
    ]


# Models with real tensors, through the gguf package's writer ---------------------------------


def k_blocks(kind: str, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """Q4_K or Q6_K blocks with random quants and scales and finite f16 super-scales."""
    if kind == "Q4_K":  # d, dmin (f16), scales[12], qs[128]: 144 bytes
        d = rng.uniform(0.001, 0.05, n_blocks).astype(np.float16).view(np.uint8).reshape(-1, 2)
        dmin = rng.uniform(0.0, 0.02, n_blocks).astype(np.float16).view(np.uint8).reshape(-1, 2)
        rest = rng.integers(0, 256, (n_blocks, 140), dtype=np.uint8)
        return np.concatenate([d, dmin, rest], axis=1)
    # Q6_K: ql[128], qh[64], scales[16] (int8), d (f16): 210 bytes
    body = rng.integers(0, 256, (n_blocks, 208), dtype=np.uint8)
    d = rng.uniform(0.001, 0.05, n_blocks).astype(np.float16).view(np.uint8).reshape(-1, 2)
    return np.concatenate([body, d], axis=1)


def write_model(
    path: Path,
    *,
    vocab: list[bytes] | None = None,
    rows: int | None = None,
    cols: int = 256,
    embd_type: str = "Q8_0",
    extra: bool = True,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """A small llama-like model: `token_embd.weight` (rows x cols) in `embd_type`, and, with
    `extra`, one tensor of each other type. Returns the f32 values each tensor holds (what a
    reader must dequantize to)."""
    from gguf import GGMLQuantizationType as Q
    from gguf import GGUFWriter, quants

    rng = np.random.default_rng(seed)
    vocab = small_vocab() if vocab is None else vocab
    rows = len(vocab) if rows is None else rows
    w = GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_tokenizer_model("llama")
    w.add_token_list(vocab)
    w.add_token_scores([float(-i) for i in range(len(vocab))])
    types = [3 if t.startswith(b"<") and t.endswith(b">") else 1 for t in vocab]
    types = [6 if t.startswith(b"<0x") else ty for t, ty in zip(vocab, types, strict=True)]
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_space_prefix(True)
    expected: dict[str, np.ndarray] = {}

    def add(name: str, kind: str, shape: tuple[int, ...]) -> None:
        values = rng.standard_normal(shape).astype(np.float32)
        if kind == "F32":
            w.add_tensor(name, values)
            expected[name] = values
        elif kind == "F16":
            data = values.astype(np.float16)
            w.add_tensor(name, data)
            expected[name] = data.astype(np.float32)
        elif kind == "BF16":
            raw = quants.quantize(values, Q.BF16)
            w.add_tensor(name, raw, raw_dtype=Q.BF16)
            expected[name] = quants.dequantize(raw, Q.BF16)
        elif kind in ("Q4_K", "Q6_K"):
            n_blocks = values.size // 256
            raw = k_blocks(kind, n_blocks, rng).reshape(*shape[:-1], -1)
            w.add_tensor(name, raw, raw_dtype=Q[kind])
            expected[name] = quants.dequantize(raw, Q[kind])
        else:
            raw = quants.quantize(values, Q[kind])
            w.add_tensor(name, raw, raw_dtype=Q[kind])
            expected[name] = quants.dequantize(raw, Q[kind])

    add("token_embd.weight", embd_type, (rows, cols))
    if extra:
        add("output_norm.weight", "F32", (cols,))
        add("blk.0.attn_q.weight", "Q4_K", (2, 512))
        add("blk.0.attn_k.weight", "F16", (3, cols))
        add("blk.0.ffn_down.weight", "Q6_K", (2, 256))
        add("blk.0.ffn_up.weight", "Q5_0", (4, 64))
        add("blk.0.attn_v.weight", "BF16", (2, 8))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expected
