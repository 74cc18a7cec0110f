"""Load, describe and validate SCX tokenizer registries (SCX-TOK-REG-V1).

Trusted pi keys come from MATRIXCTL_SCX_TRUST (trust files, os.pathsep-separated): `verify`
has no key options, and trust is never implied. Without it the signatures are still checked
against their own keys, and the warning SCX_TRUST_UNCHECKED says authority was not.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from matrixctl.errors import FormatError
from matrixctl.findings import Finding, finding, from_error
from matrixctl.io import Source
from matrixctl.tokenizers.scx import registry as scx_registry
from matrixctl.tokenizers.scx import signing
from matrixctl.tokenizers.scx import tokens as scx_tokens
from matrixctl.validate.engine import rule

FMT = scx_registry.FORMAT


class RegistrySubject:
    def __init__(self, src: Source, rf: scx_registry.RegistryFile) -> None:
        self.src = src
        self.rf = rf
        self.h_tok = rf.h_tok
        self.valid = {
            s.public_key: signing.valid(s.public_key, s.signature, self.h_tok)
            for s in rf.signatures
        }


def load(src: Source) -> RegistrySubject:
    return RegistrySubject(src, scx_registry.parse(src.buf, src.size))


def sig_offset(rf: scx_registry.RegistryFile, index: int) -> int:
    return (
        len(rf.body)
        + scx_registry.ALIGN_SIZE
        + scx_registry.SIG_HEAD.size
        + index * scx_registry.SIG_RECORD_SIZE
    )


def trusted_keys() -> list[bytes] | None:
    paths = signing.trust_from_env()
    return None if paths is None else signing.load_trust(paths)


def describe(s: RegistrySubject) -> dict[str, Any]:
    rf = s.rf
    reg = rf.registry
    source = scx_registry.to_source(rf)
    composites = source.pop("composites")
    try:
        trusted = trusted_keys()
    except FormatError:
        trusted = None
    sigs = []
    for sig in rf.signatures:
        row = sig.to_json()
        row["valid"] = s.valid[sig.public_key]
        row["trusted"] = None if trusted is None else sig.public_key in trusted
        sigs.append(row)
    return {
        "size": s.src.size,
        "registry": source,
        "hashes": {
            "H_REG": rf.h_reg.hex(),
            "H_ALIGN": rf.h_align.hex(),
            "H_API": scx_tokens.h_api().hex(),
            "H_TOK": s.h_tok.hex(),
        },
        "counts": {
            "entries": len(scx_tokens.FIXED) + len(reg.composites),
            "composites": len(reg.composites),
            "deprecated": sum(1 for c in reg.composites if c.deprecated),
            "max_id": f"0x{reg.max_id:04X}",
            "bundle_bytes": rf.bundle_bytes,
        },
        "signatures": sigs,
        "control_tokens": [
            {
                "token_id": f"0x{f.token_id:04X}",
                "name": f.name,
                "kind": scx_tokens.Kind(f.kind).name,
            }
            for f in scx_tokens.FIXED
            if f.kind != scx_tokens.Kind.RAW_BYTE
        ],
        "composites": composites,
    }


@rule(FMT, "signatures verify over the config hash (H_TOK)")
def check_signatures(s: RegistrySubject) -> Iterator[Finding]:
    if not s.rf.signatures:
        yield finding(
            scx_tokens.UNSIGNED_REGISTRY,
            "the registry carries no signature; runtimes must reject it",
            offset=len(s.rf.body) + scx_registry.ALIGN_SIZE + 8,
            field="signatures.count",
        )
        return
    for i, sig in enumerate(s.rf.signatures):
        if not s.valid[sig.public_key]:
            yield finding(
                scx_registry.SCX_SIG_INVALID,
                f"the signature by {sig.key_id} does not verify over the config hash "
                f"{s.h_tok.hex()[:16]}... "
                "(the registry, its alignment settings or the signature changed after signing)",
                offset=sig_offset(s.rf, i) + 40,
                field=f"signatures[{i}]",
            )


@rule(FMT, "signed by a trusted signing key")
def check_trust(s: RegistrySubject) -> Iterator[Finding]:
    if not s.rf.signatures:
        return
    try:
        trusted = trusted_keys()
    except FormatError as err:
        yield from_error(err)
        return
    if trusted is None:
        yield finding(
            scx_registry.SCX_TRUST_UNCHECKED,
            f"{signing.TRUST_ENV} is not set: the signatures were checked, their authority was not",
            field="signatures",
        )
        return
    from matrixctl.tokenizers.scx.api import ScxFailure, authorize

    try:
        authorize(s.rf, trusted)
    except ScxFailure as err:
        yield finding(err.code, err.message, field="signatures")
