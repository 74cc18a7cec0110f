"""SCX-TOK-V1 test vectors, typed by hand from docs/formats/scx.md (not by the code under test).

The registry bytes follow the byte tables of docs/formats/scx.md field by field; the 256
RAW_BYTE entries and the control-token entries follow the fixed table there (a loop over the
byte values is the table's own rule). Hashes come from the `blake3` package and signatures from
`cryptography` with the fixed test key below: independent implementations, applied to the
bytes the docs say each hash or signature covers. The token vectors are lists of ids written
out by hand from the grammar. `python tests/helpers/scx_golden.py` rewrites tests/golden/scx_*.

The private key below is a TEST KEY ONLY, committed on purpose so the signed golden registry is
reproducible (Ed25519 signatures are deterministic). Never trust it.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from blake3 import blake3

TEST_KEY_SEED = bytes(range(32))  # the Ed25519 private key seed 00 01 02 ... 1f

# The API schema's canonical JSON text (docs/formats/scx.md, "H_API").
API_SCHEMA_TEXT = (
    b'{"api":"SCX-TOK-V1 error-addressable tokenizer API",'
    b'"decode_request":["config_hash","options.strict_invertibility","tokens"],'
    b'"decode_response":["bytes","errors","warnings"],'
    b'"encode_request":["bytes","config_hash","options.emit_debug_markers",'
    b'"options.strict_alignment"],'
    b'"encode_response":["errors","tokens","warnings"],'
    b'"error":["code","context","message","position.byte_offset","position.token_index"],'
    b'"error_codes":["UNKNOWN_TOKEN","INVALID_BUNDLE_BOUNDARY","MISALIGNED_SHARD",'
    b'"UNSIGNED_REGISTRY","UNSUPPORTED_VERSION","INVERTIBILITY_VIOLATION",'
    b'"INTERNAL_INVARIANT_BROKEN"],'
    b'"schema_version":1,"token_id":"u16",'
    b'"warning":["code","context","message","position.byte_offset","position.token_index"]}'
)


def entry(token_id: int, kind: int, width: int, flags: int, pattern: bytes, sem: str) -> bytes:
    """token_id u16, kind u8, lane_width u8, flags u8, pattern_len u8, semantics_len u16, ..."""
    raw = sem.encode("utf-8")
    return (
        struct.pack("<HBBBBH", token_id, kind, width, flags, len(pattern), len(raw)) + pattern + raw
    )


# Fixed table: RAW_BYTE entries (kind 0, flags IS_REVERSIBLE|IS_RESERVED = 0x05).
RAW_ENTRIES = b"".join(entry(b, 0, 0, 0x05, bytes([b]), f"BYTE_0x{b:02X}") for b in range(256))
CONTROL_ENTRIES = (
    entry(0x0100, 1, 0, 0x04, b"", "BUNDLE_START")
    + entry(0x0101, 1, 0, 0x04, b"", "BUNDLE_END")
    + entry(0x0102, 1, 0, 0x04, b"", "PAD_LANE")
    + entry(0x0103, 1, 0, 0x04, b"", "LANE_MARK")
    + entry(0x0200, 2, 0, 0x04, b"", "SHARD_START")
    + entry(0x0201, 2, 0, 0x04, b"", "SHARD_END")
    + entry(0x0202, 2, 0, 0x04, b"", "BUNDLE_PAD")
    + entry(0x0203, 2, 0, 0x04, b"", "CHUNK_MARK")
    + entry(0x0300, 3, 0, 0x04, b"", "TOK_CONFIG")
    + entry(0x0301, 3, 0, 0x04, b"", "STREAM_END")
    # error sentinels: IS_RESERVED|IS_ERROR_SENTINEL = 0x06
    + entry(0x0310, 3, 0, 0x06, b"", "ERR_UNKNOWN_TOKEN")
    + entry(0x0311, 3, 0, 0x06, b"", "ERR_INVALID_BUNDLE_BOUNDARY")
    + entry(0x0312, 3, 0, 0x06, b"", "ERR_MISALIGNED_SHARD")
    + entry(0x0313, 3, 0, 0x06, b"", "ERR_UNSIGNED_REGISTRY")
    + entry(0x0314, 3, 0, 0x06, b"", "ERR_UNSUPPORTED_VERSION")
    + entry(0x0315, 3, 0, 0x06, b"", "ERR_INVERTIBILITY_VIOLATION")
    + entry(0x0316, 3, 0, 0x06, b"", "ERR_INTERNAL_INVARIANT_BROKEN")
)
# Composites (kind 4, lane_width 2, IS_REVERSIBLE 0x01; 0x09 adds IS_DEPRECATED).
COMPOSITE_ENTRIES = (
    entry(0x0400, 4, 2, 0x01, b"th", "th")
    + entry(0x0401, 4, 2, 0x01, b"e ", "e_")
    + entry(0x0402, 4, 2, 0x09, b"\x00\x00", "zero")
)
ENTRIES = RAW_ENTRIES + CONTROL_ENTRIES + COMPOSITE_ENTRIES

REGISTRY_BODY = (
    b"SCXTKREG"  # 0x00 magic
    + bytes.fromhex("01")  # 0x08 version 1
    + bytes.fromhex("01")  # 0x09 lane_mode SCXQ2
    + bytes.fromhex("02")  # 0x0A lane_width 2
    + bytes.fromhex("00")  # 0x0B pad_byte 0x00
    + bytes.fromhex("0000")  # 0x0C min_id 0
    + bytes.fromhex("0204")  # 0x0E max_id 0x0402
    + struct.pack("<I", 256 + 17 + 3)  # 0x10 entry_count 276
    + struct.pack("<I", len(ENTRIES))  # 0x14 entries_bytes
    + bytes.fromhex("00000000")  # 0x18 revision 0
    + bytes.fromhex("00000000")  # 0x1C reserved
    + bytes(32)  # 0x20 parent: none (revision 0)
    + ENTRIES  # 0x40
)
ALIGNMENT = (
    b"SCXALIGN"  # 0x00 magic
    + bytes.fromhex("01")  # 0x08 law_version 1
    + bytes.fromhex("02")  # 0x09 bundle_lanes N = 2 (bundles of 4 bytes)
    + bytes.fromhex("0000")  # 0x0A reserved
    + bytes.fromhex("08000000")  # 0x0C chunk_bytes K = 8 (2 bundles)
    + bytes.fromhex("0200000000000000")  # 0x10 shard_bundles S = 2
    + bytes(8)  # 0x18 reserved
)
H_REG = blake3(REGISTRY_BODY).digest()
H_ALIGN = blake3(ALIGNMENT).digest()
H_API = blake3(API_SCHEMA_TEXT).digest()
H_TOK_PREIMAGE = b"SCX-TOK-V1\x00" + bytes([1, 1]) + H_REG + H_ALIGN + H_API  # version 1, SCXQ2
H_TOK = blake3(H_TOK_PREIMAGE).digest()

SOURCE = {
    "lane_mode": "SCXQ2",
    "alignment": {"bundle_lanes": 2, "chunk_bytes": 8, "shard_bundles": 2},
    "composites": [
        {"text": "th", "semantics": "th"},
        {"text": "e ", "semantics": "e_"},
        {"pattern": "0000", "semantics": "zero", "deprecated": True},
    ],
}


def golden_key():  # -> Ed25519PrivateKey
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return Ed25519PrivateKey.from_private_bytes(TEST_KEY_SEED)


def golden_public_key() -> bytes:
    from cryptography.hazmat.primitives import serialization

    return (
        golden_key()
        .public_key()
        .public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    )


def signatures(*signed: tuple[bytes, bytes]) -> bytes:
    """The signature section: magic, count, reserved, then (algorithm 1, 7 zero bytes, key, sig)."""
    records = b"".join(b"\x01" + bytes(7) + pk + sig for pk, sig in sorted(signed))
    return b"SCXPISIG" + struct.pack("<II", len(signed), 0) + records


def signed_registry() -> bytes:
    sig = golden_key().sign(H_TOK)
    return REGISTRY_BODY + ALIGNMENT + signatures((golden_public_key(), sig))


UNSIGNED_REGISTRY = REGISTRY_BODY + ALIGNMENT + signatures()

# Token vectors. C = TOK_CONFIG and the 32 bytes of H_TOK; E(n) = STREAM_END and n as u64 LE.
BS, BE, PL, LM = 0x0100, 0x0101, 0x0102, 0x0103
SS, SE, BP, CM = 0x0200, 0x0201, 0x0202, 0x0203
TH, E_, ZERO = 0x0400, 0x0401, 0x0402


def preamble() -> list[int]:
    return [0x0300, *H_TOK]


def trailer(n: int) -> list[int]:
    return [0x0301, *struct.pack("<Q", n)]


VECTORS: list[tuple[str, bytes, bool, list[int]]] = [
    # name, input, emit_debug_markers, tokens after the preamble
    ("empty", b"", False, trailer(0)),
    (
        "the cat",
        b"the cat",
        False,
        [SS, BS, TH, E_, BE, BS, 0x63, 0x61, PL, 0x74, BP, BE, SE, *trailer(7)],
    ),
    (
        "the cat, debug markers",
        b"the cat",
        True,
        [
            SS,
            CM,  # bundle 0 starts chunk 0 (K / B = 2 bundles per chunk)
            BS,
            LM,
            TH,
            LM,
            E_,
            BE,
            BS,
            LM,
            0x63,
            0x61,
            LM,
            PL,
            0x74,
            BP,
            BE,
            SE,
            *trailer(7),
        ],
    ),
    (
        "ten zero bytes: two shards, the deprecated composite unused",
        bytes(10),
        False,
        [
            SS,
            BS,
            0,
            0,
            0,
            0,
            BE,
            BS,
            0,
            0,
            0,
            0,
            BE,
            SE,  # shard 0: bundles 0, 1
            SS,
            BS,
            0,
            0,
            BP,
            BE,
            SE,  # shard 1: bundle 2, 2 bytes then 2 PAD-BYTEs
            *trailer(10),
        ],
    ),
    (
        "eight bytes: whole bundles, no padding",
        b"the the ",
        False,
        [SS, BS, TH, E_, BE, BS, TH, E_, BE, SE, *trailer(8)],
    ),
]


def vectors_json() -> str:
    doc = [
        {"name": name, "input_hex": data.hex(), "debug": debug, "tokens": preamble() + toks}
        for name, data, debug, toks in VECTORS
    ]
    return json.dumps(doc, indent=1) + "\n"


FILES = {
    "scx_registry_v1.scxr": signed_registry,
    "scx_vectors_v1.json": lambda: vectors_json().encode("ascii"),
}

if __name__ == "__main__":
    here = Path(__file__).resolve().parents[1] / "golden"
    for name, make in FILES.items():
        (here / name).write_bytes(make())
