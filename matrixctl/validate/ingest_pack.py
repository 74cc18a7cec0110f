"""Load, describe and validate ingest pack folders (`verify PACKDIR`).

Structural rules (inspect and verify): the manifest parses and has its fields; every artifact
name stays inside the pack (a name that leaves the folder is an error and is never opened);
every artifact exists with the size the manifest records. Scan rules (verify only): the SHA-256
of every artifact; each artifact's own checks (MATRIX-ATOM, symbol map, document index,
SVG-Tensor); and consistency across files: vocabulary size and map hash, atom size and dtype,
token counts, flags, padding, the projection against the atoms, the document index against the
payload (every document ends with eos_id) and the manifest's sources.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from matrixctl import codes
from matrixctl.findings import Finding, finding
from matrixctl.formats import doc_index, ingest_pack, matrix_atom, svgt
from matrixctl.validate.engine import rule
from matrixctl.validate.manifest_folder import (
    ManifestFolder,
    admit,
    describe_files,
    hashes,
    load_folder,
    member_findings,
    presence,
    regular,
)

FMT = ingest_pack.FORMAT
_CODE = re.compile(r"[A-Z][A-Z0-9_]*")
MAX_MANIFEST = 256 << 20
G = FMT
PACK_MANIFEST = codes.define(
    "PACK_MANIFEST", "ingest_manifest.json is not a JSON object with the v1 fields.", group=G
)
PACK_VERSION = codes.define("PACK_VERSION", "Unsupported ingest manifest version.", group=G)
PACK_MISMATCH = codes.define(
    "PACK_MISMATCH",
    "Artifacts disagree with each other or with the manifest (vocab, map, sizes, counts, flags).",
    group=G,
)
PACK_INDEX = codes.define(
    "PACK_INDEX",
    "The document index disagrees with the payload or the manifest (a document that does not "
    "end with eos_id, a source out of range, a wrong count).",
    group=G,
)
PACK_PADDING = codes.define(
    "PACK_PADDING", "The padding after the last document is not pad_id.", group=G
)
PACK_TOKENIZER = codes.define(
    "PACK_TOKENIZER",
    "The record of the model tokenizer that made the pack (model_tokenizer.json) is malformed "
    "or disagrees with the manifest or the atoms.",
    group=G,
)
MODEL_KINDS = ("gguf", "gguf-ingest", "tokenizer.json")
MODEL_FAMILIES = ("bpe", "gemma4", "spm", "wpm", "ugm")
_SHA256 = re.compile(r"sha256:[0-9a-f]{64}")

FIELDS: dict[str, type | tuple[type, ...]] = {
    "version": int,
    "tokenizer": str,
    "atom_file": str,
    "atom_size": int,
    "dtype": str,
    "hash": str,
    "vocab_size": int,
    "pad_id": int,
    "tokens": int,
    "padding": int,
    "token_count": int,
    "atom_count": int,
    "documents": int,
    "files": dict,
    "sources": list,
}


def load_dir(path: str) -> ManifestFolder:
    subject = load_folder(path, ingest_pack.MANIFEST, MAX_MANIFEST, PACK_MANIFEST, FIELDS)
    doc, out = subject.manifest, subject.findings
    if doc is None:
        return subject
    if doc["version"] != ingest_pack.MANIFEST_VERSION:
        out.append(finding(PACK_VERSION, f"manifest version {doc['version']}", field="version"))
    names: list[tuple[str, str]] = [
        ("atom_file", doc["atom_file"]),
        ("tokenizer", doc["tokenizer"]),
    ]
    if isinstance(doc.get("doc_index"), str):
        names.append(("doc_index", doc["doc_index"]))
    sv = doc.get("svgt")
    if isinstance(sv, dict) and isinstance(sv.get("file"), str):
        names.append(("svgt.file", sv["file"]))
    names.extend((f"files.{n}", n) for n in doc["files"])
    for where, name in names:
        if isinstance(name, str):
            admit(subject, where, name, "pack")
    return subject


def describe(s: ManifestFolder) -> dict[str, Any]:
    m = s.manifest or {}
    out: dict[str, Any] = {
        "pack": {
            k: m.get(k)
            for k in (
                "source",
                "atom_size",
                "dtype",
                "vocab_size",
                "documents",
                "tokens",
                "padding",
                "atom_count",
                "eos_id",
                "pad_id",
                "hash",
            )
        }
    }
    if isinstance(m.get("symbol_map"), dict):
        out["pack"]["map_hash"] = m["symbol_map"].get("canonical_hash")
    model = m.get("model_tokenizer")
    if isinstance(model, dict):
        out["pack"]["tokenizer"] = {
            k: model.get(k) for k in ("family", "pre_tokenizer", "kind", "path", "sha256")
        }
    files = describe_files(m)
    if files is not None:
        out["files"] = files
    sources = m.get("sources")
    if isinstance(sources, list):
        kinds: dict[str, int] = {}
        for src in sources:
            if isinstance(src, dict):
                k = str(src.get("kind"))
                kinds[k] = kinds.get(k, 0) + 1
        out["sources"] = {"files": len(sources), **kinds, "skipped": len(m.get("skipped") or [])}
    return out


@rule(FMT, "manifest fields, artifact names", header=True)
def check_manifest(s: ManifestFolder) -> Iterator[Finding]:
    yield from s.findings


@rule(FMT, "artifacts present and whole", cause=True)
def check_present(s: ManifestFolder) -> Iterator[Finding]:
    """Root causes: a missing or cut artifact (what follows from it is counted, not listed)."""
    yield from (f for f, root in presence(s, records=False) if root)


@rule(FMT, "artifacts have their recorded sizes")
def check_sizes(s: ManifestFolder) -> Iterator[Finding]:
    yield from (f for f, root in presence(s, records=False) if not root)
    m = s.manifest
    if m is None:
        return
    for key in ("atom_file", "tokenizer"):
        if m[key] not in m["files"]:
            yield finding(PACK_MANIFEST, f"{key} {m[key]!r} has no entry in files", field=key)


@rule(FMT, "skipped files: listed once, not also sources, error codes only under --on-error skip")
def check_skipped(s: ManifestFolder) -> Iterator[Finding]:
    m = s.manifest
    if m is None or m.get("skipped") is None:
        return
    skipped = m["skipped"]
    if not isinstance(skipped, list):
        yield finding(PACK_MANIFEST, "skipped is not a list", field="skipped")
        return
    options = m.get("options")
    on_error = options.get("on_error", "fail") if isinstance(options, dict) else "fail"
    if on_error not in ("fail", "skip"):
        yield finding(PACK_MANIFEST, f"options.on_error is {on_error!r}", field="options.on_error")
        return
    ordinals = [
        src.get("ordinal")
        for src in m["sources"]
        if isinstance(src, dict) and isinstance(src.get("ordinal"), int)
    ]
    for n, entry in enumerate(skipped):
        where = f"skipped[{n}]"
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("path"), str)
            or not isinstance(entry.get("reason"), str)
        ):
            yield finding(
                PACK_MANIFEST, f"{where} is not an object with path and reason", field=where
            )
            return
        code = entry.get("code")
        if code is not None and (not isinstance(code, str) or not _CODE.fullmatch(code)):
            yield finding(PACK_MANIFEST, f"{where}.code {code!r} is not a code", field=where)
        elif code is not None and on_error != "skip":
            yield finding(
                PACK_MANIFEST,
                f"{where} was left out for an error ({code}) but options.on_error is {on_error!r}",
                field=f"{where}.code",
            )
        if isinstance(entry.get("ordinal"), int):
            ordinals.append(entry["ordinal"])
    if len(set(ordinals)) != len(ordinals):
        yield finding(
            PACK_MANIFEST,
            "an input ordinal appears twice among sources and skipped files",
            field="skipped",
        )


@rule(FMT, "sha256 of every artifact", scan=True)
def check_hashes(s: ManifestFolder) -> Iterator[Finding]:
    m = s.manifest
    if m is None:
        return
    yield from hashes(s)
    atoms = m["files"].get(m["atom_file"])
    if isinstance(atoms, dict) and m["hash"] != atoms.get("sha256"):
        yield finding(
            PACK_MISMATCH, "manifest hash differs from the atom file's sha256", field="hash"
        )


@rule(FMT, "each artifact's own checks", scan=True)
def check_artifacts(s: ManifestFolder) -> Iterator[Finding]:
    m = s.manifest
    if m is None:
        return
    model = isinstance(m.get("model_tokenizer"), dict)
    for name, _, path in s.members():
        if model and name == m["tokenizer"]:
            continue  # a model tokenizer's record: checked with the manifest (check_consistency)
        if regular(path):
            yield from member_findings(path, name)


@rule(FMT, "consistency: map, atoms, index, projection, sources", scan=True)
def check_consistency(s: ManifestFolder) -> Iterator[Finding]:

    from matrixctl.io import Source
    from matrixctl.tokenizers import pi

    m = s.manifest
    if m is None:
        return
    apath = s.file(m["atom_file"])
    if not regular(apath):
        return
    assert apath is not None
    with Source.open(apath) as src:
        if src.size < matrix_atom.HEADER_SIZE:
            return
        h = matrix_atom.AtomHeader.parse(src.head(matrix_atom.HEADER_SIZE))
        if h.itemsize is None or src.size != matrix_atom.HEADER_SIZE + h.token_count * h.itemsize:
            return
        if h.data_offset != matrix_atom.HEADER_SIZE:  # ATOM_DATA_OFFSET, the atom file's own
            return
        for key, want in (
            ("atom_size", h.atom_size),
            ("dtype", h.dtype_name),
            ("vocab_size", h.vocab_size),
            ("token_count", h.token_count),
            ("atom_count", h.atom_count),
        ):
            if m[key] != want:
                yield finding(
                    PACK_MISMATCH,
                    f"manifest {key} is {m[key]!r}, the atom header says {want!r}",
                    field=key,
                )
        if m["tokens"] + m["padding"] != h.token_count:
            yield finding(
                PACK_MISMATCH,
                f"tokens {m['tokens']} + padding {m['padding']} != token_count {h.token_count}",
                field="tokens",
            )
        if not 0 <= m["padding"] < max(1, h.atom_size):
            yield finding(
                PACK_MISMATCH, f"padding {m['padding']} is not below atom_size", field="padding"
            )
        tokens = matrix_atom.token_view(src.buf, h)
        pad = tokens[max(0, m["tokens"]) :]
        if pad.size and int((pad != m["pad_id"]).sum()):
            yield finding(
                PACK_PADDING,
                f"the {pad.size} padding tokens are not all pad_id {m['pad_id']}",
                field="padding",
            )
        # The tokenizer: a model tokenizer's record, or the symbol map.
        mpath = s.file(m["tokenizer"])
        if "model_tokenizer" in m:
            yield from _check_model_tokenizer(mpath, m, h)
        elif regular(mpath):
            assert mpath is not None
            with open(mpath, "rb") as fp:
                smap, _ = pi.check_map(fp.read(pi.MAX_MAP_BYTES + 1))
            if smap is not None:
                if smap.vocab_size != h.vocab_size:
                    yield finding(
                        PACK_MISMATCH,
                        f"the map's vocab_size {smap.vocab_size} differs "
                        f"from the atoms' {h.vocab_size}",
                        field="vocab_size",
                    )
                want = (m.get("symbol_map") or {}).get("canonical_hash")
                if smap.canonical_hash() != want:
                    yield finding(
                        PACK_MISMATCH,
                        f"the map's canonical hash is "
                        f"{smap.canonical_hash()}, the manifest says {want}",
                        field="symbol_map.canonical_hash",
                    )
                if smap.pad_id != m["pad_id"]:
                    yield finding(
                        PACK_MISMATCH,
                        f"pad_id {m['pad_id']} is not the map's {smap.pad_id}",
                        field="pad_id",
                    )
        # Flags and companions.
        sv = m.get("svgt")
        has_svgt = isinstance(sv, dict)
        has_index = isinstance(m.get("doc_index"), str)
        if bool(h.flags & matrix_atom.FLAG_SVG_TENSOR) != has_svgt:
            yield finding(
                PACK_MISMATCH,
                f"atom flags bit0 (svg_tensor) is "
                f"{int(bool(h.flags & matrix_atom.FLAG_SVG_TENSOR))} but the pack "
                f"{'has' if has_svgt else 'has no'} projection",
                field="flags",
            )
        if bool(h.flags & matrix_atom.FLAG_INDEX) != has_index:
            yield finding(
                PACK_MISMATCH,
                f"atom flags bit1 (index) is "
                f"{int(bool(h.flags & matrix_atom.FLAG_INDEX))} but the pack "
                f"{'has' if has_index else 'has no'} document index",
                field="flags",
            )
        if has_svgt:
            yield from _check_projection(s.file(sv.get("file")), h, tokens)  # type: ignore[union-attr]
        if has_index:
            yield from _check_index(s.file(m["doc_index"]), m, tokens)
        del tokens, pad
    yield from _check_sources(m)


def _check_model_tokenizer(
    path: str | None, m: dict[str, Any], h: matrix_atom.AtomHeader
) -> Iterator[Finding]:
    """A model tokenizer pack: the record in the manifest is whole and well-typed, the record
    file holds the same, and the vocabulary, pad and end-of-document ids fit the atoms."""
    import json

    record = m["model_tokenizer"]
    where = "model_tokenizer"
    if not isinstance(record, dict):
        yield finding(PACK_TOKENIZER, f"{where} is not an object", field=where)
        return
    problems = []
    if record.get("kind") not in MODEL_KINDS:
        problems.append(("kind", f"is {record.get('kind')!r}, not one of {', '.join(MODEL_KINDS)}"))
    if record.get("family") not in MODEL_FAMILIES:
        problems.append(("family", f"is {record.get('family')!r}, not a known family"))
    if not (isinstance(record.get("sha256"), str) and _SHA256.fullmatch(record["sha256"])):
        problems.append(("sha256", "is not sha256:<64 hex digits>"))
    for key in ("path", "follows"):
        if not isinstance(record.get(key), str):
            problems.append((key, "is not a string"))
    if record.get("pre_tokenizer") is not None and not isinstance(record["pre_tokenizer"], str):
        problems.append(("pre_tokenizer", "is not a string or null"))
    size = record.get("vocab_size")
    if not isinstance(size, int) or isinstance(size, bool) or size != h.vocab_size:
        problems.append(("vocab_size", f"is {size!r}, the atom header says {h.vocab_size}"))
    for key in ("bos_id", "eos_id", "unk_id", "pad_id"):
        v = record.get(key)
        if v is not None and (
            not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < h.vocab_size
        ):
            problems.append((key, f"is {v!r}, not an id of the vocabulary"))
    for key, why in problems:
        yield finding(PACK_TOKENIZER, f"{where}.{key} {why}", field=f"{where}.{key}")
    if regular(path):
        assert path is not None
        try:
            with open(path, "rb") as fp:
                held = json.loads(fp.read(1 << 20))
        except (OSError, ValueError) as exc:
            yield finding(PACK_TOKENIZER, f"{m['tokenizer']} is not JSON: {exc}", field="tokenizer")
            return
        if held != record:
            yield finding(
                PACK_TOKENIZER,
                f"{m['tokenizer']} differs from the manifest's model_tokenizer",
                field="tokenizer",
            )
    for key in ("pad_id", "eos_id"):
        v = m.get(key)
        if v is not None and not 0 <= v < h.vocab_size:
            yield finding(
                PACK_MISMATCH, f"{key} {v} is outside the vocabulary [0, {h.vocab_size})", field=key
            )


def _check_projection(
    path: str | None, h: matrix_atom.AtomHeader, tokens: Any
) -> Iterator[Finding]:
    import numpy as np

    from matrixctl.io import Source

    if not regular(path):
        return
    assert path is not None
    with Source.open(path) as src:
        if src.size < svgt.HEADER_SIZE:
            return
        g = svgt.SvgtHeader.parse(src.head(svgt.HEADER_SIZE))
        if g.atom_size != h.atom_size or g.atom_count != h.atom_count:
            yield finding(
                svgt.SVGT_MISMATCH,
                f"atoms.svgt holds {g.atom_count} atoms of "
                f"{g.rows}x{g.cols}; the atoms are {h.atom_count} of {h.atom_size}",
                field="svgt",
            )
            return
        if src.size != svgt.HEADER_SIZE + g.payload_bytes:
            return
        proj = np.frombuffer(
            src.buf, dtype="<u2", count=g.atom_count * g.atom_size, offset=svgt.HEADER_SIZE
        )
        step = 1 << 22
        for i in range(0, proj.size, step):
            a, b = tokens[i : i + step], proj[i : i + step]
            diff = np.flatnonzero(a.astype(np.int64) != b.astype(np.int64))
            if diff.size:
                n = i + int(diff[0])
                yield finding(
                    svgt.SVGT_MISMATCH,
                    f"projection token {n} is {int(proj[n])}, the atoms hold {int(tokens[n])}",
                    offset=svgt.HEADER_SIZE + 2 * n,
                    field=f"atoms.svgt:token[{n}]",
                )
                return
        del proj


def _check_index(path: str | None, m: dict[str, Any], tokens: Any) -> Iterator[Finding]:
    import numpy as np

    from matrixctl.io import Source

    if not regular(path):
        return
    assert path is not None
    with Source.open(path) as src:
        if src.size < doc_index.HEADER_SIZE:
            return
        h = doc_index.IndexHeader.parse(src.head(doc_index.HEADER_SIZE))
        if src.size != doc_index.HEADER_SIZE + h.doc_count * doc_index.RECORD_SIZE:
            return
        if h.doc_count != m["documents"]:
            yield finding(
                PACK_INDEX,
                f"the index has {h.doc_count} documents, the manifest {m['documents']}",
                field="documents",
            )
        if h.token_count != m["tokens"]:
            yield finding(
                PACK_INDEX,
                f"the index covers {h.token_count} tokens, the manifest says {m['tokens']}",
                field="tokens",
            )
            return
        eos = m.get("eos_id")
        want_eos = doc_index.NO_EOS if eos is None else eos
        if h.eos_id != want_eos:
            yield finding(
                PACK_INDEX,
                f"index eos_id {h.eos_id} differs from the manifest's {eos}",
                field="eos_id",
            )
        recs = doc_index.records_view(src.buf, h)
        nsources = len(m["sources"])
        step = 1 << 20
        for i in range(0, h.doc_count, step):
            part = recs[i : i + step]
            bad = np.flatnonzero(part["source"] >= nsources)
            if bad.size:
                n = i + int(bad[0])
                yield finding(
                    PACK_INDEX,
                    f"record {n} names source {int(part['source'][bad[0]])}"
                    f"; the manifest lists {nsources}",
                    field=f"record[{n}].source",
                )
                return
            offs, lens = part["token_offset"], part["token_length"]
            # Each at most the payload before they are added as int64 (a u64 near 2^64 wrapped
            # negative and indexed the tokens from the end: IndexError, exit 70).
            if offs.size and (int(offs.max()) > tokens.size or int(lens.max()) > tokens.size):
                yield finding(PACK_INDEX, "a record lies outside the payload", field="records")
                return
            ends = offs.astype(np.int64) + lens.astype(np.int64)
            if ends.size and (int(ends.max()) > tokens.size or int(lens.min()) < 1):
                yield finding(PACK_INDEX, "a record lies outside the payload", field="records")
                return
            if eos is not None:
                last = tokens[ends - 1]
                wrong = np.flatnonzero(last != eos)
                if wrong.size:
                    n = i + int(wrong[0])
                    yield finding(
                        PACK_INDEX,
                        f"document {n} does not end with eos_id {eos} "
                        f"(its last token is {int(last[wrong[0]])})",
                        field=f"record[{n}]",
                    )
                    return
        # Per-source counts from the index against the manifest.
        counts = np.zeros(nsources, dtype=np.int64)
        toks = np.zeros(nsources, dtype=np.int64)
        for i in range(0, h.doc_count, step):
            part = recs[i : i + step]
            np.add.at(counts, part["source"].astype(np.int64), 1)
            np.add.at(toks, part["source"].astype(np.int64), part["token_length"].astype(np.int64))
        for n, srcrec in enumerate(m["sources"]):
            if not isinstance(srcrec, dict):
                continue
            if srcrec.get("documents") != int(counts[n]) or srcrec.get("tokens") != int(toks[n]):
                yield finding(
                    PACK_INDEX,
                    f"source {n} ({srcrec.get('path')}) lists "
                    f"{srcrec.get('documents')} documents / {srcrec.get('tokens')} "
                    f"tokens; the index holds {int(counts[n])} / {int(toks[n])}",
                    field=f"sources[{n}]",
                )
                return
        del recs


def _check_sources(m: dict[str, Any]) -> Iterator[Finding]:
    docs = tokens = 0
    for n, srcrec in enumerate(m["sources"]):
        if not isinstance(srcrec, dict) or not isinstance(srcrec.get("path"), str):
            yield finding(
                PACK_MANIFEST, f"sources[{n}] is not an object with a path", field=f"sources[{n}]"
            )
            return
        comp, size = srcrec.get("compression"), srcrec.get("decompressed_bytes")
        if comp not in (None, "gzip", "zstd", "xz", "bz2") or (
            (comp is None) != (size is None) or (size is not None and not isinstance(size, int))
        ):
            yield finding(
                PACK_MANIFEST,
                f"sources[{n}] has compression {comp!r} with decompressed_bytes {size!r}",
                field=f"sources[{n}].compression",
            )
        d, t = srcrec.get("documents"), srcrec.get("tokens")
        if not isinstance(d, int) or not isinstance(t, int):
            yield finding(
                PACK_MANIFEST, f"sources[{n}] lacks documents/tokens counts", field=f"sources[{n}]"
            )
            return
        docs += d
        tokens += t
    if docs != m["documents"] or tokens != m["tokens"]:
        yield finding(
            PACK_MISMATCH,
            f"the sources add up to {docs} documents and {tokens} "
            f"tokens; the manifest says {m['documents']} and {m['tokens']}",
            field="sources",
        )
