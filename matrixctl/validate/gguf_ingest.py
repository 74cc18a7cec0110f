"""Load, describe and validate the folder `ingest gguf` writes (`verify DIR`).

Structural rules: the manifest parses and has its fields; every file name stays inside the
folder (a name that leaves it is reported, never opened); every listed file exists with its
recorded size. Scan rules: the SHA-256 of every file; each file's own format checks (the map,
the embeddings container); and consistency: the map's canonical hash and vocabulary against
the manifest, the sidecar's arrays against the vocabulary, the embeddings' rows and dtype.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

from matrixctl import codes
from matrixctl.errors import FormatError
from matrixctl.findings import Finding, finding
from matrixctl.formats import gguf_ingest
from matrixctl.validate.engine import rule
from matrixctl.validate.ingest_pack import PACK_MISMATCH
from matrixctl.validate.manifest_folder import (
    PACK_ARTIFACT,
    ManifestFolder,
    admit,
    describe_files,
    hashes,
    load_folder,
    member_findings,
    presence,
    regular,
)

FMT = gguf_ingest.FORMAT
MAX_MANIFEST = 16 << 20
MAX_SIDECAR = 256 << 20
GGUF_MANIFEST = codes.define(
    "GGUF_MANIFEST",
    "gguf_manifest.json is not a JSON object with the v1 fields, or names files it does not list.",
    group=FMT,
)
GGUF_AGREEMENT_SAMPLE = codes.define(
    "GGUF_AGREEMENT_SAMPLE",
    "tokenizer.agreement was measured on another sample than the one this matrixctl bundles, so "
    "verify cannot measure it again (its form is still checked).",
    group=FMT,
    severity=codes.Severity.INFO,
)
FIELDS: dict[str, type | tuple[type, ...]] = {
    "version": int,
    "kind": str,
    "source": dict,
    "tokenizer": dict,
    "files": dict,
}


def load_dir(path: str) -> ManifestFolder:
    subject = load_folder(path, gguf_ingest.MANIFEST, MAX_MANIFEST, GGUF_MANIFEST, FIELDS)
    doc, out = subject.manifest, subject.findings
    if doc is None:
        return subject
    if doc["version"] != gguf_ingest.MANIFEST_VERSION or doc["kind"] != "gguf":
        out.append(
            finding(
                GGUF_MANIFEST,
                f"manifest version {doc['version']!r} kind {doc['kind']!r}: expected 1 and gguf",
                field="version",
            )
        )
    names: list[tuple[str, Any]] = [("tokenizer.file", doc["tokenizer"].get("file"))]
    names.append(("tokenizer.sidecar", doc["tokenizer"].get("sidecar")))
    embd = doc.get("embeddings")
    if isinstance(embd, dict):
        names.append(("embeddings.file", embd.get("file")))
    names.extend((f"files.{n}", n) for n in doc["files"])
    for where, name in names:
        if not isinstance(name, str):
            out.append(finding(GGUF_MANIFEST, f"{where} is not a file name", field=where))
            continue
        admit(subject, where, name, "folder")
        if not where.startswith("files.") and name not in doc["files"]:
            out.append(
                finding(GGUF_MANIFEST, f"{where} {name!r} has no entry in files", field=where)
            )
    return subject


def describe(s: ManifestFolder) -> dict[str, Any]:
    m = s.manifest or {}
    out: dict[str, Any] = {}
    src = m.get("source")
    if isinstance(src, dict):
        out["source"] = {k: src.get(k) for k in ("path", "bytes", "sha256")}
    tok = m.get("tokenizer")
    if isinstance(tok, dict):
        keep = ("model", "vocab_size", "token_dtype", "byte_fallback", "unk_id", "eos_id")
        out["tokenizer"] = {k: tok.get(k) for k in keep}
        marking = tok.get("space_marking")
        out["tokenizer"]["space_marking"] = (
            marking.get("scheme") if isinstance(marking, dict) else None
        )
        out["tokenizer"]["special_symbols"] = tok.get("special_symbols")
        if "type" in tok:  # manifests before the tokenizer type have neither field
            out["tokenizer"]["type"] = tok.get("type")
            agree = tok.get("agreement")
            out["tokenizer"]["agreement"] = (
                agree.get("share") if isinstance(agree, dict) else "not measured"
            )
    embd = m.get("embeddings")
    if isinstance(embd, dict):
        out["embeddings"] = {
            k: embd.get(k) for k in ("file", "format", "shape", "dtype", "source_type", "stored")
        }
    files = describe_files(m)
    if files is not None:
        out["files"] = files
    return out


@rule(FMT, "manifest fields, file names")
def check_manifest(s: ManifestFolder) -> Iterator[Finding]:
    yield from s.findings


AGREEMENT_COUNTS = ("reference_tokens", "pi_tokens", "matched")


@rule(FMT, "tokenizer type and agreement")
def check_tokenizer_type(s: ManifestFolder) -> Iterator[Finding]:
    """The optional `tokenizer.type` and `tokenizer.agreement` (docs/formats/gguf.md): the type
    follows from the manifest's model and pre; the agreement's share from its counts."""
    from matrixctl.tokenizers import reference as ref

    m = s.manifest
    if m is None:
        return
    tok = m["tokenizer"]
    if "type" in tok:
        model, pre = tok.get("model"), tok.get("pre")
        want = ref.tokenizer_type(
            model if isinstance(model, str) else None, pre if isinstance(pre, str) else None
        ).name
        if tok["type"] != want:
            yield finding(
                PACK_MISMATCH,
                f"tokenizer.type is {tok['type']!r:.80}, model {model!r:.40} and pre "
                f"{pre!r:.40} give {want!r}",
                field="tokenizer.type",
            )
    agree = tok.get("agreement")
    if agree is None:
        return
    if not isinstance(agree, dict):
        yield finding(
            GGUF_MANIFEST,
            "tokenizer.agreement is not an object or null",
            field="tokenizer.agreement",
        )
        return
    counts = [agree.get(k) for k in AGREEMENT_COUNTS]
    for key, value in zip(AGREEMENT_COUNTS, counts, strict=True):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            yield finding(
                GGUF_MANIFEST,
                f"tokenizer.agreement.{key} is {value!r:.40}, not a count",
                field=f"tokenizer.agreement.{key}",
            )
            return
    for key in ("sample", "sample_sha256", "reference"):
        if not isinstance(agree.get(key), str):
            yield finding(
                GGUF_MANIFEST,
                f"tokenizer.agreement.{key} is missing or not a string",
                field=f"tokenizer.agreement.{key}",
            )
    result = ref.Agreement(
        **{k: int(c or 0) for k, c in zip(AGREEMENT_COUNTS, counts, strict=True)}
    )
    if result.matched > min(result.reference_tokens, result.pi_tokens):
        yield finding(
            PACK_MISMATCH,
            f"tokenizer.agreement.matched {result.matched} exceeds a token count",
            field="tokenizer.agreement.matched",
        )
    elif agree.get("share") != result.rounded():
        yield finding(
            PACK_MISMATCH,
            f"tokenizer.agreement.share is {agree.get('share')!r:.40}, its counts give "
            f"{result.rounded()}",
            field="tokenizer.agreement.share",
        )


@rule(FMT, "files present with recorded sizes")
def check_present(s: ManifestFolder) -> Iterator[Finding]:
    yield from (f for f, _ in presence(s, records=True))


@rule(FMT, "sha256 of every file", scan=True)
def check_hashes(s: ManifestFolder) -> Iterator[Finding]:
    yield from hashes(s)


@rule(FMT, "each file's own checks", scan=True)
def check_files(s: ManifestFolder) -> Iterator[Finding]:
    m = s.manifest
    if m is None:
        return
    for name in (m["tokenizer"].get("file"), (m.get("embeddings") or {}).get("file")):
        path = s.file(name)
        if regular(path):
            assert path is not None
            yield from member_findings(path, str(name))


@rule(FMT, "consistency: map, tokenizer sidecar, embeddings", scan=True)
def check_consistency(s: ManifestFolder) -> Iterator[Finding]:
    from matrixctl.tokenizers import pi

    m = s.manifest
    if m is None:
        return
    tok = m["tokenizer"]
    path = s.file(tok.get("file"))
    if not regular(path):
        return
    assert path is not None
    with open(path, "rb") as fp:
        smap, _ = pi.check_map(fp.read(pi.MAX_MAP_BYTES + 1))
    if smap is None:
        return  # the map's own checks report it
    want = {
        "canonical_hash": smap.canonical_hash(),
        "vocab_size": smap.vocab_size,
        "unk_id": smap.unk_id,
        "pad_id": smap.pad_id,
        "eos_id": smap.eos_id,
        "byte_fallback": smap.byte_fallback,
        "byte_base_id": smap.byte_base_id,
        "space_marking": smap.space_marking.to_json() if smap.space_marking else None,
    }
    for key, value in want.items():
        if tok.get(key) != value:
            yield finding(
                PACK_MISMATCH,
                f"tokenizer.{key} is {tok.get(key)!r:.80}, the map gives {value!r:.80}",
                field=f"tokenizer.{key}",
            )
    yield from _sidecar(s, tok, smap.vocab_size)
    yield from _agreement(s, tok, smap)
    embd = m.get("embeddings")
    if isinstance(embd, dict):
        yield from _embeddings(s, embd, smap.vocab_size)


def _sidecar(s: ManifestFolder, tok: dict[str, Any], vocab: int) -> Iterator[Finding]:
    path = s.file(tok.get("sidecar"))
    if not regular(path):
        return
    assert path is not None
    try:
        if os.path.getsize(path) > MAX_SIDECAR:
            raise ValueError(f"larger than {MAX_SIDECAR} bytes")
        with open(path, "rb") as fp:
            doc = json.loads(fp.read().decode("utf-8"))
        if not isinstance(doc, dict) or not isinstance(doc.get("metadata"), dict):
            raise ValueError("not an object with a metadata object")
    except (OSError, ValueError, RecursionError) as exc:
        yield finding(
            PACK_ARTIFACT, f"{tok.get('sidecar')}: not a tokenizer sidecar ({exc})", field="sidecar"
        )
        return
    if doc.get("tokens") != vocab:
        yield finding(
            PACK_MISMATCH,
            f"{tok.get('sidecar')} says {doc.get('tokens')!r:.20} tokens, the map has {vocab:,}",
            field="sidecar.tokens",
        )
    for key in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        value = doc["metadata"].get(key)
        if value is not None and (not isinstance(value, list) or len(value) != vocab):
            got = len(value) if isinstance(value, list) else type(value).__name__
            yield finding(
                PACK_MISMATCH,
                f"{tok.get('sidecar')}: {key} has {got} items for {vocab:,} tokens",
                field=f"sidecar.{key}",
            )


def _agreement(s: ManifestFolder, tok: dict[str, Any], smap: Any) -> Iterator[Finding]:
    """Measure the agreement again, from the map and the sidecar's merges or scores, and
    compare it with tokenizer.agreement (when the manifest has one, on the bundled sample)."""
    from matrixctl.tokenizers import agreement
    from matrixctl.tokenizers import reference as ref

    recorded = tok.get("agreement")
    if not isinstance(recorded, dict) or not isinstance(tok.get("type"), str):
        return
    if recorded.get("sample_sha256") != agreement.sample_sha256():
        yield finding(
            GGUF_AGREEMENT_SAMPLE,
            f"tokenizer.agreement was measured on a sample with "
            f"{str(recorded.get('sample_sha256'))[:23]:.23}..., not the bundled one: not "
            "measured again",
            field="tokenizer.agreement.sample_sha256",
        )
        return
    path = s.file(tok.get("sidecar"))
    if not regular(path) or path is None or os.path.getsize(path) > MAX_SIDECAR:
        return
    try:
        with open(path, "rb") as fp:
            doc = json.loads(fp.read().decode("utf-8"))
        meta = doc["metadata"]
        special_ids = doc.get("special_ids") or {}
    except (OSError, ValueError, RecursionError, KeyError, TypeError):
        return  # the sidecar's own check reports it
    model, pre = tok.get("model"), tok.get("pre")
    kind = ref.tokenizer_type(
        model if isinstance(model, str) else None, pre if isinstance(pre, str) else None
    )
    if not kind.measurable or not isinstance(meta, dict) or not isinstance(special_ids, dict):
        return
    merges = meta.get("tokenizer.ggml.merges")
    scores = meta.get("tokenizer.ggml.scores")
    if not (isinstance(merges, list) and all(isinstance(m, str) for m in merges)):
        merges = None
    if not (isinstance(scores, list) and all(isinstance(v, (int, float)) for v in scores)):
        scores = None
    texts = [""] * smap.vocab_size
    for sid, text in smap.symbols:
        texts[sid] = text
    if smap.byte_fallback and smap.byte_base_id is not None:
        for b in range(256):
            texts[smap.byte_base_id + b] = f"<0x{b:02X}>"
    plan = agreement.VocabPlan(
        smap,
        model if isinstance(model, str) else None,
        pre if isinstance(pre, str) else None,
        smap.vocab_size,
        {k: v for k, v in special_ids.items() if isinstance(v, int)},
        texts=texts,
        keys=agreement.keys_of(texts, smap.space_marking),
    )
    again = agreement.measure_with(
        plan,
        kind,
        [m.encode("utf-8") for m in merges] if merges is not None else None,
        [float(v) for v in scores] if scores is not None else None,
    ).manifest
    if again is None:
        return
    for key, value in again.items():
        if recorded.get(key) != value:
            yield finding(
                PACK_MISMATCH,
                f"tokenizer.agreement.{key} is {recorded.get(key)!r:.60}, measured again on "
                f"the bundled sample: {value!r:.60}",
                field=f"tokenizer.agreement.{key}",
            )


def _embeddings(s: ManifestFolder, embd: dict[str, Any], vocab: int) -> Iterator[Finding]:
    from matrixctl.opening import open_tensors

    path = s.file(embd.get("file"))
    if not regular(path):
        return
    assert path is not None
    try:
        with open_tensors(path) as source:
            infos = source.tensors()
    except FormatError:
        return  # the file's own checks report it
    if len(infos) != 1:
        yield finding(
            PACK_MISMATCH,
            f"{embd.get('file')} holds {len(infos)} tensors, expected the embedding matrix alone",
            field="embeddings.file",
        )
        return
    info = infos[0]
    if list(info.shape) != embd.get("shape") or info.dtype != embd.get("dtype"):
        yield finding(
            PACK_MISMATCH,
            f"{embd.get('file')} holds {info.dtype} {list(info.shape)}, the manifest says "
            f"{embd.get('dtype')!r:.20} {embd.get('shape')!r:.40}",
            field="embeddings",
        )
    elif info.shape and info.shape[0] != vocab:
        yield finding(
            PACK_MISMATCH,
            f"{embd.get('file')} has {info.shape[0]:,} rows for a {vocab:,}-token vocabulary",
            field="embeddings.shape",
            severity=codes.Severity.WARNING,
        )
