"""`ingest merge`: combine shard packs into one pack.

Every input pack is verified completely first. All packs must agree on what makes their tokens
comparable (symbol map hash, atom size, dtype, vocabulary, pad and eos ids, projection grid,
extraction options). When the inputs are the N shards of one `ingest docs --shard I/N` run
(each exactly once), the sources are put back in their global input order (their `ordinal`),
so the merged pack is byte-identical to the unsharded one. Packs that are not shards are
concatenated in the order given. The output is written like `ingest docs` writes: in a
temporary sibling folder, renamed into place when complete.
"""

from __future__ import annotations

import json
import os
from typing import Any

from matrixctl import codes
from matrixctl.errors import FormatError, UsageError
from matrixctl.formats import doc_index, matrix_atom
from matrixctl.formats import ingest_pack as pack_format

INGEST_MERGE = codes.define(
    "INGEST_MERGE",
    "Packs cannot be merged: one fails verification, they disagree on map or layout, or the "
    "shards are incomplete or repeated.",
    group="ingest",
)
SAME = ("atom_size", "dtype", "vocab_size", "pad_id", "eos_id", "svgt", "options", "source")


def _manifest(path: str) -> dict[str, Any]:
    with open(os.path.join(path, pack_format.MANIFEST), "rb") as fp:
        doc: dict[str, Any] = json.loads(fp.read().decode("utf-8"))
    return doc


def merge_packs(packs: list[str], out_dir: str) -> dict[str, Any]:
    import numpy as np

    from matrixctl.ingest.pack import PackBuilder, PackPlan
    from matrixctl.io import Source
    from matrixctl.validate.engine import examine

    if not packs:
        raise UsageError("name at least one pack to merge")
    real_out = os.path.realpath(out_dir)
    manifests = []
    for path in packs:
        if os.path.realpath(path) == real_out:
            raise UsageError(f"the output {out_dir} is also an input; write elsewhere")
        if not os.path.isdir(path):
            from matrixctl.errors import InputError

            raise InputError(codes.IO_NOT_FOUND, "no such pack folder", path=path)
        report, _ = examine(path, scan=True)
        if report.format != pack_format.FORMAT or not report.ok():
            first = next((f for f in report.findings if f.severity is codes.Severity.ERROR), None)
            why = f"[{first.code}] {first.message}" if first else "not an ingest pack"
            raise FormatError(INGEST_MERGE, f"fails verification: {why}", path=path)
        manifests.append(_manifest(path))
    base = manifests[0]
    made_by = tokenizer_identity(base)
    for path, m in zip(packs, manifests, strict=True):
        if tokenizer_identity(m) != made_by:
            raise FormatError(INGEST_MERGE, "was made with another tokenizer", path=path)
        for key in SAME:
            if m.get(key) != base.get(key):
                raise FormatError(
                    INGEST_MERGE,
                    f"{key} is {m.get(key)!r}, the first pack has {base.get(key)!r}",
                    path=path,
                    field=key,
                )
    shards = [m.get("shard") for m in manifests]
    entries: list[tuple[Any, int, int]] = []  # (sort key, pack number, source number)
    if all(isinstance(s, dict) for s in shards):
        count = shards[0]["count"]  # type: ignore[index]
        seen = sorted(s["index"] for s in shards)  # type: ignore[index]
        if any(s["count"] != count for s in shards) or seen != list(range(count)):  # type: ignore[index]
            raise FormatError(
                INGEST_MERGE,
                f"shards {seen} of {count} given; need each of 0..{count - 1} exactly once",
                path=", ".join(packs),
            )
        for p, m in enumerate(manifests):
            entries.extend((src["ordinal"], p, n) for n, src in enumerate(m["sources"]))
    elif any(isinstance(s, dict) for s in shards):
        raise UsageError("cannot mix shard packs and whole packs in one merge")
    else:
        for p, m in enumerate(manifests):
            entries.extend(((p, n), p, n) for n in range(len(m["sources"])))
    entries.sort(key=lambda e: e[0])
    with open(os.path.join(packs[0], base["tokenizer"]), "rb") as fp:
        tokenizer_raw = fp.read()
    grid = None
    if isinstance(base.get("svgt"), dict):
        r, c = base["svgt"]["grid"].split("x")
        grid = (int(r), int(c))
    plan = PackPlan(
        atom_size=base["atom_size"],
        dtype=base["dtype"],
        vocab_size=base["vocab_size"],
        pad_id=base["pad_id"],
        eos_id=base["eos_id"],
        grid=grid,
        tokenizer_raw=tokenizer_raw,
        tokenizer_meta={k: base[k] for k in ("symbol_map", "model_tokenizer") if k in base},
        tokenizer_file=base["tokenizer"],
        manifest_head={"source": base["source"]},
    )
    opened = []
    try:
        for path, m in zip(packs, manifests, strict=True):
            atoms = Source.open(os.path.join(path, m["atom_file"]))
            index = Source.open(os.path.join(path, m["doc_index"]))
            ah = matrix_atom.AtomHeader.parse(atoms.head(matrix_atom.HEADER_SIZE))
            ih = doc_index.IndexHeader.parse(index.head(doc_index.HEADER_SIZE))
            recs = doc_index.records_view(index.buf, ih)
            src_col = recs["source"].astype(np.int64)
            opened.append((atoms, index, matrix_atom.token_view(atoms.buf, ah), recs, src_col))
        with PackBuilder(out_dir, plan) as pb:
            for ordinal_key, p, n in entries:
                _atoms, _index, tokens, recs, src_col = opened[p]
                src = dict(manifests[p]["sources"][n])
                if not isinstance(ordinal_key, int):
                    src["ordinal"] = len(pb.sources)
                new_index = len(pb.sources)
                pb.sources.append(src)
                lo = int(np.searchsorted(src_col, n, side="left"))
                hi = int(np.searchsorted(src_col, n, side="right"))
                if hi > lo:
                    start = int(recs["token_offset"][lo])
                    end = int(recs["token_offset"][hi - 1]) + int(recs["token_length"][hi - 1])
                    for i in range(start, end, 1 << 22):
                        pb.add_tokens(tokens[i : min(end, i + (1 << 22))])
                    for length, item in zip(
                        recs["token_length"][lo:hi].tolist(),
                        recs["item"][lo:hi].tolist(),
                        strict=True,
                    ):
                        pb.add_record(length, new_index, item)
            walk_skips = [s for s in base.get("skipped", []) if s.get("ordinal") is None]
            done_skips = [
                s for m in manifests for s in m.get("skipped", []) if s.get("ordinal") is not None
            ]
            done_skips.sort(key=lambda s: s["ordinal"])
            manifest = pb.finish(
                {
                    "sources": pb.sources,
                    "skipped": walk_skips + done_skips,
                    "shard": None,
                    "options": base.get("options"),
                }
            )
    finally:
        for atoms, index, tokens, recs, src_col in opened:
            del tokens, recs, src_col
            atoms.close()
            index.close()
    return {
        "packs": len(packs),
        "pack": out_dir,
        "documents": manifest["documents"],
        "tokens": manifest["tokens"],
        "atoms": manifest["atom_count"],
        "hash": manifest["hash"],
    }


def tokenizer_identity(manifest: dict[str, Any]) -> Any:
    """What must be the same for two packs to merge: the symbol map's canonical hash, or the
    model tokenizer's source (kind and SHA-256), family and pre-tokenizer."""
    model = manifest.get("model_tokenizer")
    if isinstance(model, dict):
        return ("model", *(model.get(k) for k in ("kind", "sha256", "family", "pre_tokenizer")))
    return ("pi", (manifest.get("symbol_map") or {}).get("canonical_hash"))
