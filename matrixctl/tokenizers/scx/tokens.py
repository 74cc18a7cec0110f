"""SCX-TOK-V1 constants: the token space, the fixed control-token table, error codes, hashes.

Token ids are u16. The reserved ranges of the spec, and the ids this implementation fixes in
them (docs/formats/scx.md, "Token space"):

    0x0000-0x00FF  RAW_BYTE          BYTE_0x00 .. BYTE_0xFF (the byte value is the id)
    0x0100-0x01FF  LANE_CONTROL      0x0100 BUNDLE_START, 0x0101 BUNDLE_END,
                                     0x0102 PAD_LANE, 0x0103 LANE_MARK (debug)
    0x0200-0x02FF  SUBSTRATE_MARKER  0x0200 SHARD_START, 0x0201 SHARD_END,
                                     0x0202 BUNDLE_PAD, 0x0203 CHUNK_MARK (debug)
    0x0300-0x03FF  AGL_CONTROL       0x0300 TOK_CONFIG, 0x0301 STREAM_END,
                                     0x0310 + i  ERR_<code i> (error sentinels, spec order)
    0x0400-0xFFFF  COMPOSITE         assigned by the registry, densely from 0x0400

Every other id in 0x0100-0x03FF is reserved and unassigned: a stream holding one is
UNKNOWN_TOKEN. All hashes are blake3-256.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from enum import IntEnum, IntFlag
from typing import Any

from matrixctl import codes

SPEC_NAME = "SCX-TOK-V1"
SPEC_VERSION = 1
HASH_BYTES = 32

# Reserved ranges.
RAW_FIRST, RAW_LAST = 0x0000, 0x00FF
LANE_FIRST, LANE_LAST = 0x0100, 0x01FF
SUBSTRATE_FIRST, SUBSTRATE_LAST = 0x0200, 0x02FF
AGL_FIRST, AGL_LAST = 0x0300, 0x03FF
COMPOSITE_FIRST = 0x0400
TOKEN_LIMIT = 1 << 16
MAX_COMPOSITES = TOKEN_LIMIT - COMPOSITE_FIRST

# Lane control tokens.
BUNDLE_START = 0x0100
BUNDLE_END = 0x0101
PAD_LANE = 0x0102
LANE_MARK = 0x0103
# Substrate markers.
SHARD_START = 0x0200
SHARD_END = 0x0201
BUNDLE_PAD = 0x0202
CHUNK_MARK = 0x0203
# AGL / pi control.
TOK_CONFIG = 0x0300
STREAM_END = 0x0301
ERR_FIRST = 0x0310

# An id that is never valid in a stream, used inside the encoder for "no token in this slot".
SKIP = 0x01FF


class Kind(IntEnum):
    """RegistryEntry.kind (u8 on disk)."""

    RAW_BYTE = 0
    LANE_CONTROL = 1
    SUBSTRATE_MARKER = 2
    AGL_CONTROL = 3
    COMPOSITE = 4


class Flag(IntFlag):
    """RegistryEntry.flags (u8 on disk); bits 4-7 must be zero."""

    IS_REVERSIBLE = 1 << 0
    IS_ERROR_SENTINEL = 1 << 1
    IS_RESERVED = 1 << 2
    IS_DEPRECATED = 1 << 3


KNOWN_FLAGS = 0x0F


class LaneMode(IntEnum):
    """lane_mode (u8 on disk). SCXQ2 and SCXQ4 fix the lane width; CUSTOM declares it."""

    SCXQ2 = 1
    SCXQ4 = 2
    CUSTOM = 3


LANE_WIDTHS = {LaneMode.SCXQ2: 2, LaneMode.SCXQ4: 4}
MAX_LANE_WIDTH = 8  # a lane's key must fit 64 bits for the vectorized lookup


G = "scx"
# The spec's ErrorCode enum, in the spec's order (the order fixes the sentinel ids and H_API).
UNKNOWN_TOKEN = codes.define(
    "UNKNOWN_TOKEN", "A token id is not assigned by the registry or the SCX-TOK-V1 table.", group=G
)
INVALID_BUNDLE_BOUNDARY = codes.define(
    "INVALID_BUNDLE_BOUNDARY",
    "SCX bundle structure is broken: a token outside a bundle, a bundle of the wrong size, "
    "a lane split by a composite, a misplaced PAD_LANE or BUNDLE_PAD.",
    group=G,
)
MISALIGNED_SHARD = codes.define(
    "MISALIGNED_SHARD",
    "SCX shard structure breaks the registry's alignment rules: shard markers out of place, a "
    "shard of the wrong bundle count, a short bundle before the end, or unaligned input under "
    "strict_alignment.",
    group=G,
)
UNSIGNED_REGISTRY = codes.define(
    "UNSIGNED_REGISTRY",
    "The SCX config carries no valid signature from a trusted signing key (or no trusted keys were "
    "given).",
    group=G,
)
UNSUPPORTED_VERSION = codes.define(
    "UNSUPPORTED_VERSION",
    "An SCX version field, or a config hash (H_TOK), is not the one this implementation has.",
    group=G,
)
INVERTIBILITY_VIOLATION = codes.define(
    "INVERTIBILITY_VIOLATION",
    "Decoding would not give back the bytes that encode into this stream (a non-canonical "
    "token, a deprecated composite, padding other than the registry's pad byte, a byte count "
    "that disagrees).",
    group=G,
)
INTERNAL_INVARIANT_BROKEN = codes.define(
    "INTERNAL_INVARIANT_BROKEN",
    "An SCX self-check failed inside matrixctl (a bug), or a producer marked this error.",
    group=G,
)

ERROR_CODES: tuple[str, ...] = (
    UNKNOWN_TOKEN,
    INVALID_BUNDLE_BOUNDARY,
    MISALIGNED_SHARD,
    UNSIGNED_REGISTRY,
    UNSUPPORTED_VERSION,
    INVERTIBILITY_VIOLATION,
    INTERNAL_INVARIANT_BROKEN,
)
ERROR_SENTINELS: dict[int, str] = {ERR_FIRST + i: code for i, code in enumerate(ERROR_CODES)}


@dataclass(frozen=True)
class Fixed:
    token_id: int
    name: str
    kind: Kind
    flags: int


def _fixed_table() -> tuple[Fixed, ...]:
    rows: list[Fixed] = [
        Fixed(b, f"BYTE_0x{b:02X}", Kind.RAW_BYTE, Flag.IS_REVERSIBLE | Flag.IS_RESERVED)
        for b in range(256)
    ]
    lane = Kind.LANE_CONTROL
    sub = Kind.SUBSTRATE_MARKER
    agl = Kind.AGL_CONTROL
    res = int(Flag.IS_RESERVED)
    rows += [
        Fixed(BUNDLE_START, "BUNDLE_START", lane, res),
        Fixed(BUNDLE_END, "BUNDLE_END", lane, res),
        Fixed(PAD_LANE, "PAD_LANE", lane, res),
        Fixed(LANE_MARK, "LANE_MARK", lane, res),
        Fixed(SHARD_START, "SHARD_START", sub, res),
        Fixed(SHARD_END, "SHARD_END", sub, res),
        Fixed(BUNDLE_PAD, "BUNDLE_PAD", sub, res),
        Fixed(CHUNK_MARK, "CHUNK_MARK", sub, res),
        Fixed(TOK_CONFIG, "TOK_CONFIG", agl, res),
        Fixed(STREAM_END, "STREAM_END", agl, res),
    ]
    rows += [
        Fixed(tid, f"ERR_{code}", agl, res | Flag.IS_ERROR_SENTINEL)
        for tid, code in ERROR_SENTINELS.items()
    ]
    return tuple(rows)


FIXED: tuple[Fixed, ...] = _fixed_table()
FIXED_BY_ID: dict[int, Fixed] = {f.token_id: f for f in FIXED}
LAST_FIXED_ID = FIXED[-1].token_id


def token_name(token_id: int, registry_names: dict[int, str] | None = None) -> str:
    """A human name for an id: `BUNDLE_START`, `BYTE_0x41`, a composite's semantics, or hex."""
    fixed = FIXED_BY_ID.get(token_id)
    if fixed is not None:
        return fixed.name
    if registry_names and token_id in registry_names:
        return f"composite 0x{token_id:04X} {registry_names[token_id]!r}"
    return f"0x{token_id:04X}"


# The error-addressable API schema. H_API is blake3-256 of API_SCHEMA_BYTES: the canonical JSON
# text (keys sorted, no spaces, ASCII) of this document. Changing an error code, an option or a
# field of the API changes H_API, hence H_TOK, hence every signature.
API_SCHEMA: dict[str, Any] = {
    "api": "SCX-TOK-V1 error-addressable tokenizer API",
    "schema_version": 1,
    "token_id": "u16",
    "error_codes": list(ERROR_CODES),
    "encode_request": [
        "bytes",
        "config_hash",
        "options.emit_debug_markers",
        "options.strict_alignment",
    ],
    "encode_response": ["errors", "tokens", "warnings"],
    "decode_request": ["config_hash", "options.strict_invertibility", "tokens"],
    "decode_response": ["bytes", "errors", "warnings"],
    "error": ["code", "context", "message", "position.byte_offset", "position.token_index"],
    "warning": ["code", "context", "message", "position.byte_offset", "position.token_index"],
}


def canonical_json(doc: Any) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


API_SCHEMA_BYTES = canonical_json(API_SCHEMA)


def blake3_256(*parts: bytes | memoryview) -> bytes:
    from blake3 import blake3

    h = blake3()
    for part in parts:
        h.update(part)
    return h.digest()


def h_api() -> bytes:
    return blake3_256(API_SCHEMA_BYTES)


H_TOK_DOMAIN = b"SCX-TOK-V1\x00"


def h_tok_preimage(lane_mode: int, h_reg: bytes, h_align: bytes, h_api_: bytes) -> bytes:
    """The 109 bytes H_TOK hashes: domain, spec version, lane_mode, H_REG, H_ALIGN, H_API."""
    return H_TOK_DOMAIN + struct.pack("<BB", SPEC_VERSION, lane_mode) + h_reg + h_align + h_api_


def h_tok(lane_mode: int, h_reg: bytes, h_align: bytes, h_api_: bytes) -> bytes:
    return blake3_256(h_tok_preimage(lane_mode, h_reg, h_align, h_api_))
