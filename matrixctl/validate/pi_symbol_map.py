"""Load, describe and validate π symbol maps (`pi_symbol_map.json`).

Every check is done once by `matrixctl.tokenizers.pi.check_map` (the tokenizer uses the same
function, so what `verify` accepts is exactly what `tokenize pi` and `ingest docs` accept); the
rule below reports its findings.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from matrixctl.findings import Finding, finding
from matrixctl.io import Source
from matrixctl.tokenizers import pi
from matrixctl.validate.engine import rule, sample, shown

FMT = pi.FORMAT
PREVIEW = 12


@dataclass
class MapSubject:
    src: Source
    map: pi.SymbolMap | None
    findings: list[Finding]


def load(src: Source) -> MapSubject:
    if src.size > pi.MAX_MAP_BYTES:
        return MapSubject(
            src,
            None,
            [finding(pi.PI_JSON, f"symbol map is {src.size} bytes, limit {pi.MAX_MAP_BYTES}")],
        )
    smap, findings = pi.check_map(bytes(src.buf[: src.size]))
    return MapSubject(src, smap, findings)


def describe(s: MapSubject) -> dict[str, Any]:
    out: dict[str, Any] = {"size": s.src.size}
    m = s.map
    if m is None:
        return out
    lengths = [len(t) for _, t in m.symbols]
    out["map"] = {
        "version": m.version,
        "vocab_size": m.vocab_size,
        "symbols": len(m.symbols),
        "normalization": m.normalization,
        "byte_fallback": m.byte_fallback,
        "byte_base_id": m.byte_base_id,
        "unk_id": m.unk_id,
        "pad_id": m.pad_id,
        "eos_id": m.eos_id,
        "unused_ids": m.vocab_size - len(_used_ids(m)),
        "longest_symbol_chars": max(lengths, default=0),
        "multi_char_symbols": sum(1 for n in lengths if n > 1),
        "canonical_hash": m.canonical_hash(),
        "space_marking": m.space_marking.scheme if m.space_marking else None,
        "special_symbols": len(m.specials),
        "dtype": "uint16" if m.vocab_size <= 1 << 16 else "uint32",
    }
    out["preview"] = sample(
        [{"id": i, "text": t} for i, t in m.symbols[: shown(PREVIEW)]], len(m.symbols)
    )
    return out


def _used_ids(m: pi.SymbolMap) -> set[int]:
    """Ids with a meaning: symbols (special ones included), byte ids, unk/pad/eos."""
    used = {i for i, _ in m.symbols} | set(m.special_ids().values())
    if m.byte_fallback and m.byte_base_id is not None:
        used.update(range(m.byte_base_id, m.byte_base_id + 256))
    return used


@rule(FMT, "fields, ids, texts, specials, byte ids, normalization")
def check(s: MapSubject) -> Iterator[Finding]:
    yield from s.findings
