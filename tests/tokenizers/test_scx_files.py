"""SCX registry, signatures, shards and the AGL manifest: tampering, truncation, the laws."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from matrixctl.errors import FormatError, InputError
from matrixctl.tokenizers.scx import api, signing
from matrixctl.tokenizers.scx import manifest as scx_manifest
from matrixctl.tokenizers.scx import registry as scx_registry
from matrixctl.tokenizers.scx import shards as scx_shards
from matrixctl.tokenizers.scx import tokens as scx_tokens
from matrixctl.validate.engine import examine
from tests.helpers import scx_golden

TRUST_ENV = signing.TRUST_ENV


def codes_of(report) -> set[str]:
    return {f.code for f in report.findings}


@pytest.fixture
def trust(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "trusted.pub"
    path.write_text(signing.public_line(scx_golden.golden_public_key(), "golden test key"))
    monkeypatch.setenv(TRUST_ENV, str(path))
    return path


# Registry ----------------------------------------------------------------------------------


def test_golden_registry_verifies_clean(tmp_path: Path, trust: Path) -> None:
    path = tmp_path / "r.scxr"
    path.write_bytes(scx_golden.signed_registry())
    report, desc = examine(str(path), scan=True, describe=True)
    assert report.format == "scx-registry" and report.findings == []
    assert desc is not None and desc["hashes"]["H_TOK"] == scx_golden.H_TOK.hex()


def test_untrusted_environment_gives_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decision: `verify` takes trusted keys from MATRIXCTL_SCX_TRUST; unset, authority is not
    checked and says so with the warning SCX_TRUST_UNCHECKED (fails only under --strict)."""
    monkeypatch.delenv(TRUST_ENV, raising=False)
    path = tmp_path / "r.scxr"
    path.write_bytes(scx_golden.signed_registry())
    report = examine(str(path), scan=True)[0]
    assert codes_of(report) == {scx_registry.SCX_TRUST_UNCHECKED}
    assert report.ok() and not report.ok(strict=True)


def test_unsigned_registry_is_an_error(tmp_path: Path, trust: Path) -> None:
    path = tmp_path / "r.scxr"
    path.write_bytes(scx_golden.UNSIGNED_REGISTRY)
    assert scx_tokens.UNSIGNED_REGISTRY in codes_of(examine(str(path), scan=True)[0])
    with pytest.raises(api.ScxFailure) as info:
        api.Tokenizer.load(scx_golden.UNSIGNED_REGISTRY, [scx_golden.golden_public_key()])
    assert info.value.code == scx_tokens.UNSIGNED_REGISTRY


def test_every_byte_of_a_registry_is_covered(tmp_path: Path, trust: Path) -> None:
    """Tampering with any byte of a signed registry is caught (and never crashes)."""
    data = scx_golden.signed_registry()
    seen: set[str] = set()
    for i in range(len(data)):
        buf = bytearray(data)
        buf[i] ^= 0x01 if i % 3 else 0x80
        try:
            rf = scx_registry.parse(bytes(buf))
        except FormatError as err:
            seen.add(err.code)
            continue
        with pytest.raises(api.ScxFailure) as info:
            api.authorize(rf, [scx_golden.golden_public_key()])
        assert info.value.code == scx_tokens.UNSIGNED_REGISTRY, i
        seen.add(scx_tokens.UNSIGNED_REGISTRY)
    assert {
        scx_tokens.UNSIGNED_REGISTRY,
        scx_registry.SCX_REG_FIXED,
        scx_registry.SCX_REG_ENTRY,
        scx_tokens.UNSUPPORTED_VERSION,
    } <= seen


def test_registry_truncated_at_every_length(tmp_path: Path) -> None:
    data = scx_golden.signed_registry()
    path = tmp_path / "t.scxr"
    for n in list(range(0, 200)) + list(range(len(data) - 200, len(data))):
        path.write_bytes(data[:n])
        report = examine(str(path), scan=True)[0]
        assert not report.ok(), n


def test_trailing_bytes_after_signatures(tmp_path: Path) -> None:
    with pytest.raises(FormatError) as info:
        scx_registry.parse(scx_golden.signed_registry() + b"\0")
    assert info.value.code == scx_registry.SCX_REG_TRAILING


def test_huge_counts_do_not_allocate() -> None:
    body = bytearray(scx_golden.signed_registry())
    body[0x10:0x14] = (0xFFFFFFFF).to_bytes(4, "little")
    with pytest.raises(FormatError) as info:
        scx_registry.parse(bytes(body))
    assert info.value.code == scx_registry.SCX_REG_HEADER
    sigs = bytearray(scx_golden.signed_registry())
    at = len(scx_golden.REGISTRY_BODY) + len(scx_golden.ALIGNMENT) + 8
    sigs[at : at + 4] = (10**9).to_bytes(4, "little")
    with pytest.raises(FormatError) as info:
        scx_registry.parse(bytes(sigs))
    assert info.value.code == scx_registry.SCX_SIG_SECTION


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"lane_mode": "SCXQ8"}, scx_registry.SCX_REG_SOURCE),
        ({"lane_width": 3}, scx_registry.SCX_REG_SOURCE),
        ({"composites": [{"text": "abc"}]}, scx_registry.SCX_REG_SOURCE),
        ({"composites": [{"text": "ab"}, {"text": "ab"}]}, scx_registry.SCX_REG_SOURCE),
        ({"composites": [{"text": "ab", "token_id": 2000}]}, scx_registry.SCX_REG_SOURCE),
        ({"alignment": {"chunk_bytes": 100}}, scx_registry.SCX_REG_SOURCE),
        ({"alignment": {"bundle_lanes": 0}}, scx_registry.SCX_REG_SOURCE),
        ({"surprise": 1}, scx_registry.SCX_REG_SOURCE),
        ({"revision": 1}, scx_registry.SCX_REG_SOURCE),
    ],
)
def test_bad_sources(change: dict, code: str) -> None:
    with pytest.raises(FormatError) as info:
        scx_registry.from_source({**scx_golden.SOURCE, **change})
    assert info.value.code == code


def test_chunk_must_be_a_multiple_of_the_bundle() -> None:
    """Decision: chunk_bytes K is a multiple of the bundle size N*W, so only the last bundle of
    an input is ever padded and every byte keeps its offset in the aligned substrate."""
    with pytest.raises(FormatError):
        scx_registry.check_alignment(
            scx_registry.Alignment(bundle_lanes=8, chunk_bytes=4100, shard_bundles=1), 2
        )
    scx_registry.check_alignment(
        scx_registry.Alignment(bundle_lanes=8, chunk_bytes=4096, shard_bundles=1), 2
    )
    assert (
        scx_registry.default_alignment(3).chunk_bytes == 4080
    )  # CUSTOM W=3: largest multiple <= 4096


def test_append_only_revisions() -> None:
    """Decision: a revision keeps its parent's composites byte for byte (it may only add
    IS_DEPRECATED), appends new ones, and names the parent's H_REG."""
    parent = scx_registry.from_source(scx_golden.SOURCE)
    child_src = {
        **scx_golden.SOURCE,
        "revision": 1,
        "parent": parent.h_reg.hex(),
        "composites": [
            *scx_golden.SOURCE["composites"][:1],
            {"text": "e ", "semantics": "e_", "deprecated": True},
            scx_golden.SOURCE["composites"][2],
            {"text": "in"},
        ],
    }
    child = scx_registry.from_source(child_src)
    scx_registry.check_append_only(parent, child)
    assert child.h_reg != parent.h_reg
    for bad in (
        {**child_src, "composites": child_src["composites"][:2]},
        {**child_src, "composites": [{"text": "xx"}, *child_src["composites"][1:]]},
        {**child_src, "parent": "00" * 31 + "01"},
        {**child_src, "revision": 2},
        {**child_src, "pad_byte": 1},
    ):
        with pytest.raises(FormatError) as info:
            scx_registry.check_append_only(parent, scx_registry.from_source(bad))
        assert info.value.code == scx_registry.SCX_REG_NOT_APPEND_ONLY
    undeprecate = scx_registry.from_source(
        {**scx_golden.SOURCE, "revision": 1, "parent": parent.h_reg.hex(), "composites": [
            *scx_golden.SOURCE["composites"][:2], {"pattern": "0000", "semantics": "zero"}]}
    )  # fmt: skip
    with pytest.raises(FormatError):
        scx_registry.check_append_only(parent, undeprecate)


def test_deprecated_composites_are_not_encoded_but_decode_leniently() -> None:
    """Decision: IS_DEPRECATED composites are never emitted by encode; decode accepts them only
    with strict_invertibility off (a warning), so old streams stay readable."""
    tok = api.Tokenizer.load(scx_golden.signed_registry(), [scx_golden.golden_public_key()])
    assert 0x0402 not in api.encode_bytes(tok, bytes(64)).tolist()


# Signing and keys --------------------------------------------------------------------------


def test_key_rotation_keeps_h_tok(tmp_path: Path) -> None:
    rf = scx_registry.from_source(scx_golden.SOURCE)
    k1, _ = signing.generate()
    k2, _ = signing.generate()
    signed = rf.with_signature(scx_registry.Signature(k1.public_key, k1.sign(rf.h_tok)))
    both = signed.with_signature(scx_registry.Signature(k2.public_key, k2.sign(rf.h_tok)))
    again = scx_registry.parse(both.to_bytes())
    assert again.h_tok == rf.h_tok and len(again.signatures) == 2
    assert api.authorize(again, [k2.public_key]).public_key == k2.public_key
    with pytest.raises(api.ScxFailure):
        api.authorize(again, [signing.generate()[0].public_key])


def test_signatures_are_deterministic_and_canonical() -> None:
    rf = scx_registry.from_source(scx_golden.SOURCE)
    key = signing.PrivateKey(scx_golden.golden_key())
    a = rf.with_signature(scx_registry.Signature(key.public_key, key.sign(rf.h_tok))).to_bytes()
    b = rf.with_signature(scx_registry.Signature(key.public_key, key.sign(rf.h_tok))).to_bytes()
    assert a == b == scx_golden.signed_registry()


def test_private_key_file_mode_and_refusals(tmp_path: Path) -> None:
    key, pem = signing.generate()
    path = tmp_path / "k"
    old = os.umask(0)
    try:
        signing.write_private(str(path), pem)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert signing.load_private(str(path)).public_key == key.public_key
    with pytest.raises(Exception):  # noqa: B017 - an OutputError
        signing.write_private(str(path), pem)
    path.chmod(0o644)
    with pytest.raises(InputError) as info:
        signing.load_private(str(path))
    assert info.value.code == signing.SCX_KEY_FILE
    assert "PRIVATE KEY" not in repr(key)


def test_trust_file_lines(tmp_path: Path) -> None:
    path = tmp_path / "t"
    path.write_text("# comment\n\n" + signing.public_line(bytes(32), "zero") + "bogus line\n")
    with pytest.raises(FormatError) as info:
        signing.load_trust([str(path)])
    assert info.value.field == "line 4"
    empty = tmp_path / "e"
    empty.write_text("# nothing\n")
    with pytest.raises(FormatError):
        signing.load_trust([str(empty)])


# Shards and manifest -----------------------------------------------------------------------


def make_pack(tmp_path: Path, data: bytes, name: str = "pack", **kw) -> tuple[Path, dict]:
    src = tmp_path / f"{name}.in"
    src.write_bytes(data)
    tok = api.Tokenizer.load(scx_golden.signed_registry(), [scx_golden.golden_public_key()])
    out = tmp_path / name
    summary = scx_shards.write_shards(str(src), str(out), tok, scx_golden.signed_registry(), **kw)
    return out, summary


def test_pack_shards_layout_and_hashes(tmp_path: Path, trust: Path) -> None:
    data = bytes(range(256)) * 2 + b"tail!"  # 517 bytes: bundles of 4, shards of 2 bundles
    out, summary = make_pack(tmp_path, data)
    assert summary["shards"] == 65 and summary["padding"] == 3
    man = scx_manifest.parse((out / "manifest.json").read_bytes())
    assert man.raw_bytes == 517 and man.config_hash == scx_golden.H_TOK
    first = (out / "shard-000000.scxs").read_bytes()
    header = scx_shards.ShardHeader.parse(first)
    assert (header.bundle_count, header.raw_bytes, header.raw_offset) == (2, 8, 0)
    assert first[scx_shards.HEADER_SIZE :] == data[:8]
    from blake3 import blake3

    assert header.hash_raw == blake3(data[:8]).digest() == header.hash_aligned
    last = (out / "shard-000064.scxs").read_bytes()
    lh = scx_shards.ShardHeader.parse(last)
    assert (lh.bundle_count, lh.raw_bytes, lh.raw_offset) == (2, 5, 512)
    assert last[scx_shards.HEADER_SIZE :] == b"tail!" + bytes(3)
    assert lh.hash_raw == blake3(b"tail!").digest()
    assert lh.hash_aligned == blake3(b"tail!" + bytes(3)).digest()
    assert lh.header_hash == blake3(last[:0x90]).digest()
    report = examine(str(out / "manifest.json"), scan=True)[0]
    assert report.findings == [], report.findings
    for shard in out.glob("*.scxs"):
        assert examine(str(shard), scan=True)[0].findings == []


def test_pack_is_deterministic_and_created_at_is_explicit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decision: created_at is null unless --created-at or SOURCE_DATE_EPOCH sets it."""
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    a, _ = make_pack(tmp_path, b"x" * 100, "a")
    b, _ = make_pack(tmp_path, b"x" * 100, "b")
    assert (a / "manifest.json").read_bytes() == (b / "manifest.json").read_bytes()
    assert json.loads((a / "manifest.json").read_text())["created_at"] is None
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "86400")
    assert scx_manifest.created_at_from(None) == "1970-01-02T00:00:00Z"
    assert scx_manifest.created_at_from("2024-02-29T12:00:00Z") == "2024-02-29T12:00:00Z"


def test_empty_input_gives_zero_shards(tmp_path: Path, trust: Path) -> None:
    """Decision: an empty input aligns to no bundle and no shard (a manifest with shards [])."""
    out, summary = make_pack(tmp_path, b"")
    assert summary["shards"] == 0
    assert examine(str(out / "manifest.json"), scan=True)[0].findings == []


def test_tampering_with_any_byte_of_a_shard_is_caught(tmp_path: Path, trust: Path) -> None:
    out, _ = make_pack(tmp_path, b"the theme of the thing")  # 22 bytes: shards of 8 bytes
    shard = out / "shard-000002.scxs"
    good = shard.read_bytes()
    for i in range(len(good)):
        buf = bytearray(good)
        buf[i] ^= 0x04
        shard.write_bytes(bytes(buf))
        man_report = examine(str(out / "manifest.json"), scan=True)[0]
        own = examine(str(shard), scan=True)[0]
        assert not man_report.ok(), i
        assert not own.ok(), i
    shard.write_bytes(good)
    assert examine(str(out / "manifest.json"), scan=True)[0].ok()


def test_shard_padding_must_be_pad_byte(tmp_path: Path) -> None:
    out, _ = make_pack(tmp_path, b"abcde")
    shard = out / "shard-000000.scxs"
    buf = bytearray(shard.read_bytes())
    buf[-1] = 0xFF
    shard.write_bytes(bytes(buf))
    report = examine(str(shard), scan=True)[0]
    assert scx_tokens.INVERTIBILITY_VIOLATION in codes_of(report)


def test_tampering_with_any_byte_of_the_manifest_is_caught(tmp_path: Path, trust: Path) -> None:
    out, _ = make_pack(tmp_path, b"abcdefghij" * 3)
    path = out / "manifest.json"
    good = path.read_bytes()
    seen: set[str] = set()
    for i in range(len(good)):
        buf = bytearray(good)
        buf[i] = ord("X") if buf[i] != ord("X") else ord("Y")
        path.write_bytes(bytes(buf))
        report = examine(str(path), scan=True)[0]
        assert not report.ok(), (i, chr(good[i]))
        seen |= codes_of(report)
    assert {
        scx_manifest.SCX_MAN_JSON,
        scx_manifest.SCX_MAN_HASH,
        scx_manifest.SCX_MAN_SHARD,
        scx_tokens.UNSIGNED_REGISTRY,
    } <= seen, seen


def test_manifest_must_be_canonical(tmp_path: Path, trust: Path) -> None:
    """Decision: the manifest has one canonical text (key order, 2-space indent, final newline),
    so H_MANIFEST = blake3-256 of the file is reproducible; any other spelling is refused."""
    out, _ = make_pack(tmp_path, b"abcdefgh")
    path = out / "manifest.json"
    text = path.read_text()
    path.write_text(text.replace('"raw_bytes": 8,', '"raw_bytes":  8,'))
    assert scx_manifest.SCX_MAN_CANONICAL in codes_of(examine(str(path), scan=True)[0])
    path.write_text(text.rstrip("\n"))
    assert scx_manifest.SCX_MAN_CANONICAL in codes_of(examine(str(path), scan=True)[0])


def test_manifest_law_registry_snapshot_and_trust(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, _ = make_pack(tmp_path, b"abcdefgh")
    other = tmp_path / "other.pub"
    other.write_text(signing.public_line(signing.generate()[0].public_key))
    monkeypatch.setenv(TRUST_ENV, str(other))
    assert scx_tokens.UNSIGNED_REGISTRY in codes_of(
        examine(str(out / "manifest.json"), scan=True)[0]
    )
    (out / "registry.scxr").write_bytes(
        scx_registry.from_source({**scx_golden.SOURCE, "pad_byte": 1}).to_bytes()
    )
    assert scx_manifest.SCX_MAN_HASH in codes_of(examine(str(out / "manifest.json"), scan=True)[0])


def test_manifest_paths_stay_inside_the_folder() -> None:
    assert scx_manifest.safe_member("/x", "shard-000000.scxs") == "/x/shard-000000.scxs"
    for bad in ("../etc/passwd", "/etc/passwd", "a/../../b", "s3://bucket/k", "", "a//b", "a\\b"):
        assert scx_manifest.safe_member("/x", bad) is None, bad


def test_rotation_in_the_manifest(tmp_path: Path, trust: Path) -> None:
    """Decision: rotating a manifest's key makes the new signature current and keeps the old one
    in key_history; config_hash (H_TOK) does not change and both signatures must verify."""
    out, _ = make_pack(tmp_path, b"abcdefgh")
    man = scx_manifest.parse((out / "manifest.json").read_bytes())
    k2, _ = signing.generate()
    rotated = man.rotated(scx_registry.Signature(k2.public_key, k2.sign(man.config_hash)))
    assert rotated.config_hash == man.config_hash
    assert rotated.pi_key_id == k2.key_id and rotated.key_history == [man.pi_signature]
    (out / "manifest.json").write_bytes(rotated.to_bytes())
    trust.write_text(signing.public_line(k2.public_key))
    assert examine(str(out / "manifest.json"), scan=True)[0].findings == []


def test_strict_alignment_and_existing_output(tmp_path: Path) -> None:
    with pytest.raises(FormatError) as info:
        make_pack(tmp_path, b"abc", strict_alignment=True)
    assert info.value.code == scx_tokens.MISALIGNED_SHARD
    assert not (tmp_path / "pack").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".pack")]
    make_pack(tmp_path, b"abcd")
    with pytest.raises(Exception) as info2:
        make_pack(tmp_path, b"abcd")
    assert getattr(info2.value, "code", "") == "OUT_EXISTS_DIR"
    out, _ = make_pack(tmp_path, b"efgh", force=True)
    assert (out / "shard-000000.scxs").read_bytes().endswith(b"efgh")
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "precious").write_text("x")
    with pytest.raises(Exception):  # noqa: B017
        make_pack(tmp_path, b"abcd", name="keep", force=True)
    assert (tmp_path / "keep" / "precious").exists()
