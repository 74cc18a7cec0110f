"""Load, describe and validate AGL tokenizer manifests (AGL-TOK-MANIFEST-V1) and their shards.

Every law of the manifest: config_hash is H_TOK of its own fields and api_schema_hash this
implementation's H_API; the pi-signature (and every earlier one in key_history) verifies over
config_hash; the signing key is trusted (MATRIXCTL_SCX_TRUST; a warning when unset); the
registry snapshot has the recorded H_REG and H_ALIGN; every shard file exists inside the
manifest's folder, agrees with its entry and the alignment law, and (under `verify`) has the
recorded H_SHARD_RAW and H_SHARD_ALIGNED.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from matrixctl.errors import FormatError, MatrixError
from matrixctl.findings import Finding, finding, from_error
from matrixctl.io import Source
from matrixctl.tokenizers.scx import manifest as scx_manifest
from matrixctl.tokenizers.scx import registry as scx_registry
from matrixctl.tokenizers.scx import shards as scx_shards
from matrixctl.tokenizers.scx import signing
from matrixctl.tokenizers.scx import tokens as scx_tokens
from matrixctl.validate.engine import rule

FMT = scx_manifest.FORMAT


@dataclass
class ManifestSubject:
    src: Source
    man: scx_manifest.Manifest
    folder: str
    h_manifest: bytes
    registry: scx_registry.RegistryFile | None = None
    registry_error: MatrixError | None = None
    headers: dict[int, scx_shards.ShardHeader] = field(default_factory=dict)


def load(src: Source) -> ManifestSubject:
    data = bytes(src.buf[: src.size])
    man = scx_manifest.parse(data)
    folder = "." if src.path == "-" else os.path.dirname(os.path.abspath(src.path))
    subject = ManifestSubject(src, man, folder, man.h_manifest)
    path = scx_manifest.safe_member(folder, man.registry_path)
    try:
        if path is None:
            raise FormatError(
                scx_manifest.SCX_MAN_SHARD,
                f"registry_path {man.registry_path!r} is not a relative path inside the "
                "manifest's folder",
                field="registry_path",
            )
        with Source.open(path) as reg_src:
            subject.registry = scx_registry.parse(reg_src.buf, reg_src.size)
    except MatrixError as err:
        subject.registry_error = err
    return subject


def describe(s: ManifestSubject) -> dict[str, Any]:
    m = s.man
    return {
        "size": s.src.size,
        "h_manifest": s.h_manifest.hex(),
        "manifest": {
            "format": m.format,
            "tok_spec_version": m.tok_spec_version,
            "lane_mode": m.lane_mode,
            "created_at": m.created_at,
            "raw_bytes": m.raw_bytes,
            "registry_path": m.registry_path,
        },
        "hashes": {
            "config_hash": m.config_hash.hex(),
            "registry_hash": m.registry_hash.hex(),
            "alignment_hash": m.alignment_hash.hex(),
            "api_schema_hash": m.api_schema_hash.hex(),
        },
        "authority": {
            "pi_key_id": m.pi_key_id,
            "public_key": m.pi_signature.public_key.hex(),
            "earlier_keys": [signing.key_id(k.public_key) for k in m.key_history],
        },
        "shards": [
            {
                "shard_id": e["shard_id"],
                "path_or_uri": e["path_or_uri"],
                "bundle_count": e["bundle_count"],
                "raw_bytes": e["raw_bytes"],
                "hash_raw": e["hash_raw"],
            }
            for e in m.shards
        ],
    }


@rule(FMT, "config_hash is H_TOK, api_schema_hash is this implementation's")
def check_hashes(s: ManifestSubject) -> Iterator[Finding]:
    m = s.man
    if m.stored_hash != s.h_manifest:
        stored = m.stored_hash.hex()[:16] if m.stored_hash else "-"
        yield finding(
            scx_manifest.SCX_MAN_HASH,
            f"manifest_hash is {stored}..., H_MANIFEST of the manifest's text is "
            f"{s.h_manifest.hex()[:16]}... (the manifest was changed after it was written)",
            field="manifest_hash",
        )
    want = scx_manifest.expected_h_tok(m)
    if m.config_hash != want:
        yield finding(
            scx_manifest.SCX_MAN_HASH,
            f"config_hash is {m.config_hash.hex()[:16]}..., H_TOK of the manifest's version, "
            f"lane_mode and hashes is {want.hex()[:16]}...",
            field="config_hash",
        )
    if m.api_schema_hash != scx_tokens.h_api():
        yield finding(
            scx_manifest.SCX_MAN_HASH,
            f"api_schema_hash is {m.api_schema_hash.hex()[:16]}..., this implementation's H_API "
            f"is {scx_tokens.h_api().hex()[:16]}... (config_hash cannot match the local tokenizer)",
            field="api_schema_hash",
        )


@rule(FMT, "signature over config_hash by a trusted key")
def check_signature(s: ManifestSubject) -> Iterator[Finding]:
    m = s.man
    if not signing.valid(m.pi_signature.public_key, m.pi_signature.signature, m.config_hash):
        yield finding(
            scx_tokens.UNSIGNED_REGISTRY,
            f"pi_signature by {m.pi_key_id} does not verify over config_hash",
            field="pi_signature",
        )
    for i, sig in enumerate(m.key_history):
        if not signing.valid(sig.public_key, sig.signature, m.config_hash):
            yield finding(
                scx_tokens.UNSIGNED_REGISTRY,
                f"the earlier signature by {sig.key_id} does not verify over config_hash (a "
                "rotation keeps the same config hash)",
                field=f"key_history[{i}]",
            )
    from matrixctl.validate.scx_registry import trusted_keys

    try:
        trusted = trusted_keys()
    except FormatError as err:
        yield from_error(err)
        return
    if trusted is None:
        yield finding(
            scx_registry.SCX_TRUST_UNCHECKED,
            f"{signing.TRUST_ENV} is not set: the signature was checked, its authority was not",
            field="pi_key_id",
        )
    elif m.pi_signature.public_key not in trusted:
        yield finding(
            scx_tokens.UNSIGNED_REGISTRY,
            f"pi_key_id {m.pi_key_id} is not a trusted key",
            field="pi_key_id",
        )


@rule(FMT, "registry snapshot has registry_hash and alignment_hash")
def check_registry(s: ManifestSubject) -> Iterator[Finding]:
    m = s.man
    if s.registry is None:
        err = s.registry_error
        message = err.message if err else "cannot be read"
        yield finding(
            scx_manifest.SCX_MAN_HASH,
            f"registry snapshot {m.registry_path!r}: {message}" + (f" [{err.code}]" if err else ""),
            field="registry_path",
        )
        return
    rf = s.registry
    if rf.h_reg != m.registry_hash:
        yield finding(
            scx_manifest.SCX_MAN_HASH,
            f"the registry snapshot's H_REG is {rf.h_reg.hex()[:16]}..., registry_hash is "
            f"{m.registry_hash.hex()[:16]}...",
            field="registry_hash",
        )
    if rf.h_align != m.alignment_hash:
        yield finding(
            scx_manifest.SCX_MAN_HASH,
            f"the registry snapshot's H_ALIGN is {rf.h_align.hex()[:16]}..., alignment_hash is "
            f"{m.alignment_hash.hex()[:16]}...",
            field="alignment_hash",
        )
    if rf.registry.lane_mode_name != m.lane_mode:
        yield finding(
            scx_manifest.SCX_MAN_HASH,
            f"lane_mode is {m.lane_mode}, the registry's is {rf.registry.lane_mode_name}",
            field="lane_mode",
        )


def _shard_path(s: ManifestSubject, i: int) -> tuple[str | None, Finding | None]:
    entry = s.man.shards[i]
    path = scx_manifest.safe_member(s.folder, entry["path_or_uri"])
    if path is None:
        return None, finding(
            scx_manifest.SCX_MAN_SHARD,
            f"path_or_uri {entry['path_or_uri']!r} is not a relative path inside the manifest's "
            "folder (URIs are not fetched)",
            field=f"shards[{i}].path_or_uri",
        )
    return path, None


@rule(FMT, "shard entries agree with shard headers and the alignment law")
def check_shards(s: ManifestSubject) -> Iterator[Finding]:
    m = s.man
    rf = s.registry
    law_ok = rf is not None and rf.h_align == m.alignment_hash and rf.h_reg == m.registry_hash
    seen: set[str] = set()
    offset = 0
    total = 0
    last = len(m.shards) - 1
    for i, entry in enumerate(m.shards):
        where = f"shards[{i}]"
        if entry["shard_id"] in seen:
            yield finding(
                scx_manifest.SCX_MAN_SHARD, f"shard_id {entry['shard_id']!r} repeats", field=where
            )
        seen.add(entry["shard_id"])
        total += entry["raw_bytes"]
        if law_ok and rf is not None:
            bb = rf.bundle_bytes
            count = entry["bundle_count"]
            if count == 0 or not (count - 1) * bb < entry["raw_bytes"] <= count * bb:
                yield finding(
                    scx_tokens.MISALIGNED_SHARD,
                    f"raw_bytes {entry['raw_bytes']} does not fill {count} bundles of {bb} bytes",
                    field=f"{where}.raw_bytes",
                )
            elif i < last and (
                count != rf.alignment.shard_bundles or entry["raw_bytes"] != count * bb
            ):
                yield finding(
                    scx_tokens.MISALIGNED_SHARD,
                    f"shard {i} holds {count} bundles ({entry['raw_bytes']} raw bytes); every "
                    f"shard but the last holds shard_bundles = {rf.alignment.shard_bundles} "
                    "whole bundles",
                    field=f"{where}.bundle_count",
                )
        path, problem = _shard_path(s, i)
        if problem is not None:
            yield problem
            offset += entry["raw_bytes"]
            continue
        assert path is not None
        try:
            with open(path, "rb") as fp:
                raw = fp.read(scx_shards.HEADER_SIZE)
            header = scx_shards.ShardHeader.parse(raw)
        except OSError as exc:
            yield finding(
                scx_manifest.SCX_MAN_SHARD,
                f"shard file {entry['path_or_uri']!r} cannot be read ({exc.strerror or exc})",
                field=f"{where}.path_or_uri",
            )
            offset += entry["raw_bytes"]
            continue
        except FormatError as err:
            yield finding(
                err.code,
                f"shard file {entry['path_or_uri']!r}: {err.message}",
                field=f"{where}.path_or_uri",
            )
            offset += entry["raw_bytes"]
            continue
        s.headers[i] = header
        for problem_err in scx_shards.header_problems(header, raw):
            yield finding(
                problem_err.code,
                f"shard file {entry['path_or_uri']!r}: {problem_err.message}",
                field=where,
            )
        mismatches = [
            name
            for name, want, got in (
                ("shard_index", i, header.shard_index),
                ("bundle_count", entry["bundle_count"], header.bundle_count),
                ("raw_bytes", entry["raw_bytes"], header.raw_bytes),
                ("raw_offset", offset, header.raw_offset),
                ("config_hash", m.config_hash, header.config_hash),
                ("hash_raw", bytes.fromhex(entry["hash_raw"]), header.hash_raw),
                ("hash_aligned", bytes.fromhex(entry["hash_aligned"]), header.hash_aligned),
            )
            if want != got
        ]
        if rf is not None and (header.lane_width, header.bundle_lanes, header.pad_byte) != (
            rf.registry.lane_width,
            rf.alignment.bundle_lanes,
            rf.registry.pad_byte,
        ):
            mismatches.append("lane_width/bundle_lanes/pad_byte")
        if mismatches:
            code = (
                scx_tokens.UNSUPPORTED_VERSION
                if mismatches == ["config_hash"]
                else scx_manifest.SCX_MAN_SHARD
            )
            yield finding(
                code,
                f"shard file {entry['path_or_uri']!r} disagrees with its entry: "
                + ", ".join(mismatches),
                field=where,
            )
        offset += entry["raw_bytes"]
    if total != m.raw_bytes:
        yield finding(
            scx_tokens.MISALIGNED_SHARD,
            f"the shards hold {total} raw bytes, raw_bytes says {m.raw_bytes}",
            field="raw_bytes",
        )


@rule(FMT, "shard payloads have H_SHARD_RAW and H_SHARD_ALIGNED", scan=True)
def check_payloads(s: ManifestSubject) -> Iterator[Finding]:
    for i, header in sorted(s.headers.items()):
        entry = s.man.shards[i]
        path, _ = _shard_path(s, i)
        if path is None:
            continue
        try:
            with Source.open(path) as src:
                problems = scx_shards.payload_problems(src.buf, src.size, header)
        except MatrixError as err:
            yield finding(scx_manifest.SCX_MAN_SHARD, err.message, field=f"shards[{i}].path_or_uri")
            continue
        for bad in problems:
            at = f" (shard file offset {bad.offset})" if bad.offset is not None else ""
            yield finding(
                bad.code,
                f"shard file {entry['path_or_uri']!r}: {bad.message}{at}",
                field=f"shards[{i}]",
            )
