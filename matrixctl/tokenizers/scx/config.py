"""The signed config: a registry whose signature a trusted key made, compiled for use."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from matrixctl.errors import FormatError
from matrixctl.tokenizers.scx import lanes as scx_lanes
from matrixctl.tokenizers.scx import signing
from matrixctl.tokenizers.scx import tokens as scx_tokens
from matrixctl.tokenizers.scx.issues import ScxFailure, fail
from matrixctl.tokenizers.scx.registry import RegistryFile, Signature, parse


def authorize(rf: RegistryFile, trusted: Iterable[bytes]) -> Signature:
    """The signature that authorises `rf`: valid over H_TOK and by a trusted key.

    Raises UNSIGNED_REGISTRY (with what was found) when there is none.
    """
    trusted = list(trusted)
    h = rf.h_tok
    ctx = {"h_tok": h.hex(), "signatures": str(len(rf.signatures))}
    if not trusted:
        raise fail(
            scx_tokens.UNSIGNED_REGISTRY,
            "no trusted signing keys were given, so no signature can authorise this config",
            context=ctx,
        )
    if not rf.signatures:
        raise fail(scx_tokens.UNSIGNED_REGISTRY, "the registry carries no signature", context=ctx)
    broken = []
    for sig in rf.signatures:
        if sig.public_key not in trusted:
            continue
        if signing.valid(sig.public_key, sig.signature, h):
            return sig
        broken.append(sig.key_id)
    if broken:
        raise fail(
            scx_tokens.UNSIGNED_REGISTRY,
            f"the signature by trusted key {broken[0]} does not verify over the config hash "
            "(the registry or its alignment settings were changed after signing)",
            context={**ctx, "key_id": broken[0]},
        )
    ids = ", ".join(s.key_id for s in rf.signatures)
    raise fail(
        scx_tokens.UNSIGNED_REGISTRY,
        f"signed only by keys that are not trusted ({ids})",
        context={**ctx, "key_ids": ids},
    )


class Tokenizer:
    """A registry whose signature was checked, compiled for encoding and decoding."""

    def __init__(self, rf: RegistryFile, authority: Signature | None) -> None:
        self.rf = rf
        self.authority = authority
        self.h_tok = rf.h_tok
        self.codec = scx_lanes.LaneCodec(rf)
        law = rf.alignment
        self.width = rf.registry.lane_width
        self.lanes = law.bundle_lanes
        self.bundle_bytes = law.bundle_lanes * self.width
        self.chunk_bundles = law.chunk_bytes // self.bundle_bytes
        self.shard_bundles = law.shard_bundles
        self.pad_byte = rf.registry.pad_byte

    @classmethod
    def load(cls, data: Any, trusted: Iterable[bytes]) -> Tokenizer:
        rf = parse(data)
        return cls(rf, authorize(rf, trusted))

    @classmethod
    def unchecked(cls, rf: RegistryFile) -> Tokenizer:
        """A tokenizer without an authority check (tests, benchmarks, building registries)."""
        return cls(rf, None)

    def check_config_hash(self, config_hash: bytes, **position: int) -> None:
        if config_hash != self.h_tok:
            raise fail(
                scx_tokens.UNSUPPORTED_VERSION,
                "the request's config_hash is not this tokenizer's config hash (H_TOK)",
                context={"config_hash": config_hash.hex(), "h_tok": self.h_tok.hex()},
                **position,
            )


def load_config(registry_path: str, trust_paths: list[str] | None) -> tuple[Tokenizer, bytes]:
    """Read a registry file, check its signature against the trusted keys, compile it.

    `trust_paths` are trust files (None: MATRIXCTL_SCX_TRUST). No trusted key, or no valid
    signature by one, is UNSIGNED_REGISTRY.
    """
    from matrixctl.io import Source

    paths = trust_paths if trust_paths else signing.trust_from_env()
    with Source.open(registry_path) as src:
        data = bytes(src.buf[: src.size])
    try:
        rf = parse(data)
    except FormatError as err:
        raise err.with_path(registry_path) from None
    keys = signing.load_trust(paths or [])
    try:
        authority = authorize(rf, keys)
    except ScxFailure as err:
        err.path = registry_path
        if not keys:
            err.hint = f"name trusted signing keys with --trust FILE (or {signing.TRUST_ENV})"
        raise
    return Tokenizer(rf, authority), data
