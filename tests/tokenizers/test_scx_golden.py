"""SCX-TOK-V1 golden bytes: the registry file, the hashes, the token vectors (typed by hand)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from matrixctl.tokenizers.scx import api, signing
from matrixctl.tokenizers.scx import registry as scx_registry
from matrixctl.tokenizers.scx import tokens as scx_tokens
from tests.helpers import scx_golden

GOLDEN = Path(__file__).resolve().parents[1] / "golden"


def golden_tokenizer() -> api.Tokenizer:
    return api.Tokenizer.load(scx_golden.signed_registry(), [scx_golden.golden_public_key()])


def test_golden_files_on_disk_are_the_hand_typed_bytes() -> None:
    assert (GOLDEN / "scx_registry_v1.scxr").read_bytes() == scx_golden.signed_registry()
    assert (GOLDEN / "scx_vectors_v1.json").read_text() == scx_golden.vectors_json()


def test_writer_produces_the_golden_registry() -> None:
    rf = scx_registry.from_source(scx_golden.SOURCE)
    assert rf.body == scx_golden.REGISTRY_BODY
    assert rf.alignment.to_bytes() == scx_golden.ALIGNMENT
    assert rf.to_bytes() == scx_golden.UNSIGNED_REGISTRY
    key = signing.PrivateKey(scx_golden.golden_key())
    signed = rf.with_signature(scx_registry.Signature(key.public_key, key.sign(rf.h_tok)))
    assert signed.to_bytes() == scx_golden.signed_registry()


def test_hashes_cover_the_documented_bytes() -> None:
    rf = scx_registry.parse(scx_golden.signed_registry())
    assert rf.h_reg == scx_golden.H_REG
    assert rf.h_align == scx_golden.H_ALIGN
    assert scx_tokens.API_SCHEMA_BYTES == scx_golden.API_SCHEMA_TEXT
    assert scx_tokens.h_api() == scx_golden.H_API
    assert (
        scx_tokens.h_tok_preimage(1, scx_golden.H_REG, scx_golden.H_ALIGN, scx_golden.H_API)
        == scx_golden.H_TOK_PREIMAGE
    )
    assert len(scx_golden.H_TOK_PREIMAGE) == 109
    assert rf.h_tok == scx_golden.H_TOK


def test_h_reg_excludes_alignment_and_signatures() -> None:
    """Decision: H_REG covers the body only, so signing and the alignment law never change it."""
    unsigned = scx_registry.parse(scx_golden.UNSIGNED_REGISTRY)
    signed = scx_registry.parse(scx_golden.signed_registry())
    assert unsigned.h_reg == signed.h_reg == scx_golden.H_REG
    other_law = scx_registry.RegistryFile(unsigned.registry, scx_registry.Alignment(2, 8, 3))
    assert other_law.h_reg == scx_golden.H_REG and other_law.h_tok != scx_golden.H_TOK


@pytest.mark.parametrize(
    ("name", "data", "debug", "tokens"), scx_golden.VECTORS, ids=[v[0] for v in scx_golden.VECTORS]
)
def test_token_vectors(name: str, data: bytes, debug: bool, tokens: list[int]) -> None:
    tok = golden_tokenizer()
    got = api.encode_bytes(tok, data, emit_debug_markers=debug)
    assert got.dtype == np.dtype("<u2")
    assert got.tolist() == scx_golden.preamble() + tokens
    back = api.decode(tok, api.DecodeRequest(got, tok.h_tok))
    assert back.errors == [] and back.bytes == data


def test_vectors_file_matches_the_encoder() -> None:
    tok = golden_tokenizer()
    for item in json.loads((GOLDEN / "scx_vectors_v1.json").read_text()):
        data = bytes.fromhex(item["input_hex"])
        got = api.encode_bytes(tok, data, emit_debug_markers=item["debug"])
        assert got.tolist() == item["tokens"], item["name"]


def test_fixed_token_table() -> None:
    """Decision: the fixed control tokens sit at the first ids of their reserved ranges."""
    names = {f.name: f.token_id for f in scx_tokens.FIXED}
    assert names["BYTE_0x00"] == 0 and names["BYTE_0xFF"] == 0xFF
    assert (names["BUNDLE_START"], names["BUNDLE_END"], names["PAD_LANE"], names["LANE_MARK"]) == (
        0x0100,
        0x0101,
        0x0102,
        0x0103,
    )
    assert (names["SHARD_START"], names["SHARD_END"], names["BUNDLE_PAD"], names["CHUNK_MARK"]) == (
        0x0200,
        0x0201,
        0x0202,
        0x0203,
    )
    assert (names["TOK_CONFIG"], names["STREAM_END"]) == (0x0300, 0x0301)
    assert [names[f"ERR_{c}"] for c in scx_tokens.ERROR_CODES] == list(range(0x0310, 0x0317))
    assert len(scx_tokens.FIXED) == 256 + 17


def test_bundle_markers_are_lane_control_and_bundle_pad_a_substrate_marker() -> None:
    """Decision: BUNDLE_START/END are lane control (0x01xx) as the lane packing law names them;
    BUNDLE_PAD, the alignment law's marker, is the "bundle marker" of the substrate range."""
    kinds = {f.name: f.kind for f in scx_tokens.FIXED}
    assert kinds["BUNDLE_START"] == kinds["BUNDLE_END"] == scx_tokens.Kind.LANE_CONTROL
    assert kinds["BUNDLE_PAD"] == scx_tokens.Kind.SUBSTRATE_MARKER


def test_raw_lane_is_w_byte_tokens() -> None:
    """Decision: a raw lane of W bytes is W RAW_BYTE tokens (no 16-bit id per 2-byte value)."""
    tok = golden_tokenizer()
    toks = api.encode_bytes(tok, b"qxzw").tolist()[33:]
    assert toks[:6] == [scx_golden.SS, scx_golden.BS, ord("q"), ord("x"), ord("z"), ord("w")]


def test_error_sentinels_name_the_spec_codes_in_order() -> None:
    assert scx_tokens.ERROR_CODES == (
        "UNKNOWN_TOKEN",
        "INVALID_BUNDLE_BOUNDARY",
        "MISALIGNED_SHARD",
        "UNSIGNED_REGISTRY",
        "UNSUPPORTED_VERSION",
        "INVERTIBILITY_VIOLATION",
        "INTERNAL_INVARIANT_BROKEN",
    )


def test_json_view_round_trips_to_the_same_bytes() -> None:
    """Decision: the JSON view (`inspect --json`) is a registry source giving the same bytes."""
    from matrixctl.validate.scx_registry import RegistrySubject, describe

    rf = scx_registry.parse(scx_golden.signed_registry())

    class Src:
        size = len(scx_golden.signed_registry())

    view = json.loads(json.dumps(describe(RegistrySubject(Src(), rf))))  # type: ignore[arg-type]
    assert scx_registry.from_source(view).to_bytes() == scx_golden.UNSIGNED_REGISTRY
    assert scx_registry.from_source(scx_registry.to_source(rf)).body == scx_golden.REGISTRY_BODY
