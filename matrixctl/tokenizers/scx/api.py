"""The error-addressable SCX tokenizer API: a signed config, streaming encode and decode.

    tok = Tokenizer.load(registry_bytes, trusted_keys)     # UNSIGNED_REGISTRY unless signed
    resp = encode(tok, EncodeRequest(data, tok.h_tok))     # tokens, warnings, errors
    back = decode(tok, DecodeRequest(resp.tokens, tok.h_tok))

`Encoder` and `Decoder` do the same in bounded memory, block by block; they raise `ScxFailure`
(a FormatError carrying the spec's error object) at the first error and collect warnings.

The token stream grammar (docs/formats/scx.md, "Token stream"):

    stream  := TOK_CONFIG byte{32}  shard*  STREAM_END byte{8}
    shard   := SHARD_START  ([CHUNK_MARK] bundle)+  SHARD_END
    bundle  := BUNDLE_START lane{N} BUNDLE_END
             | BUNDLE_START lane{0..N-1} [[LANE_MARK] PAD_LANE byte{1..W-1}] BUNDLE_PAD BUNDLE_END
    lane    := [LANE_MARK] (composite | byte{W})

The 32 bytes after TOK_CONFIG are H_TOK; the 8 after STREAM_END the input's length (u64 LE).
Only the last bundle of a stream may be short (BUNDLE_PAD); every shard but the last holds
exactly S bundles. LANE_MARK and CHUNK_MARK appear only with emit_debug_markers.

The work is split by job: `config` (the signed config, `Tokenizer`, `load_config`), `encoder`
(`Encoder`, `encode_chunks`, `encode_file`), `decoder` (`Decoder`), `segment` (the decoder's
checking path, which names the first problem) and `issues` (`Issue`, `ScxFailure`); this module
holds the spec's request / response API and re-exports the names the rest of matrixctl uses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from matrixctl.tokenizers.scx.config import Tokenizer, authorize, load_config
from matrixctl.tokenizers.scx.decoder import DECODE_WINDOW, Decoder
from matrixctl.tokenizers.scx.encoder import BLOCK_BYTES, Encoder, encode_chunks, encode_file
from matrixctl.tokenizers.scx.issues import Issue, ScxFailure, fail

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    import numpy as np

__all__ = [
    "BLOCK_BYTES",
    "DECODE_WINDOW",
    "DecodeRequest",
    "DecodeResponse",
    "Decoder",
    "EncodeRequest",
    "EncodeResponse",
    "Encoder",
    "Issue",
    "ScxFailure",
    "Tokenizer",
    "authorize",
    "decode",
    "encode",
    "encode_bytes",
    "encode_chunks",
    "encode_file",
    "fail",
    "iter_decode",
    "load_config",
]


@dataclass(frozen=True)
class EncodeRequest:
    bytes: Any
    config_hash: bytes
    strict_alignment: bool = False
    emit_debug_markers: bool = False


@dataclass
class EncodeResponse:
    tokens: Any  # np.ndarray of uint16 (empty on failure)
    warnings: list[Issue] = field(default_factory=list)
    errors: list[Issue] = field(default_factory=list)
    pad_bytes: int = 0  # PAD-BYTEs that complete the last bundle

    @property
    def ok(self) -> bool:
        return not self.errors


@dataclass(frozen=True)
class DecodeRequest:
    tokens: Any
    config_hash: bytes
    strict_invertibility: bool = True


@dataclass
class DecodeResponse:
    bytes: bytes
    warnings: list[Issue] = field(default_factory=list)
    errors: list[Issue] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors


def _concat(parts: list[np.ndarray], dtype: str) -> np.ndarray:
    import numpy as np

    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


def encode(tok: Tokenizer, req: EncodeRequest) -> EncodeResponse:
    """The spec's encode: tokens, or no tokens and a non-empty `errors` list."""
    import numpy as np

    enc = Encoder(
        tok, strict_alignment=req.strict_alignment, emit_debug_markers=req.emit_debug_markers
    )
    try:
        tok.check_config_hash(req.config_hash, byte_offset=0)
        parts = enc.feed(req.bytes)
        parts += enc.finish()
    except ScxFailure as err:
        return EncodeResponse(np.zeros(0, dtype="<u2"), enc.warnings, [err.issue])
    return EncodeResponse(_concat(parts, "<u2"), enc.warnings, [], enc.pad_bytes)


def decode(tok: Tokenizer, req: DecodeRequest) -> DecodeResponse:
    """The spec's decode: bytes, or no bytes and a non-empty `errors` list."""
    import numpy as np

    dec = Decoder(tok, strict_invertibility=req.strict_invertibility)
    try:
        tok.check_config_hash(req.config_hash, token_index=0)
        parts = dec.feed(np.asarray(req.tokens, dtype=np.int64).astype("<u2", casting="unsafe"))
        parts += dec.finish()
    except ScxFailure as err:
        return DecodeResponse(b"", dec.warnings, [err.issue])
    return DecodeResponse(_concat(parts, "u1").tobytes(), dec.warnings, [])


def encode_bytes(tok: Tokenizer, data: bytes, **options: bool) -> np.ndarray:
    """encode() that raises ScxFailure instead of returning errors (tests, tools)."""
    enc = Encoder(tok, **options)
    parts = enc.feed(data)
    parts += enc.finish()
    return _concat(parts, "<u2")


def iter_decode(
    tok: Tokenizer, chunks: Iterable[np.ndarray], *, strict: bool = True
) -> Iterator[np.ndarray]:
    dec = Decoder(tok, strict_invertibility=strict)
    for chunk in chunks:
        yield from dec.feed(chunk)
    yield from dec.finish()
