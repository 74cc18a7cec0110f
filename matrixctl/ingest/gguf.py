"""`ingest gguf`: a GGUF model's tokenizer as a π symbol map, its token embeddings apart.

    MODEL.gguf -> DIR/
        pi_symbol_map.json     one symbol per GGUF token, id = GGUF index (matrix-ingest-v1 5.3)
        gguf_tokenizer.json    everything else the GGUF says about its tokenizer (token types,
                               scores, merges, special ids, flags, tokens that are not UTF-8)
        token_embd.<ext>       token_embd.weight (row i = token i), in the chosen container
        gguf_manifest.json     source SHA-256, options, what was written, every file's SHA-256

The folder is built in a hidden temporary sibling (`.DIR.XXXX.tmp`) and renamed into place only
when complete (the manifest last, as `ingest docs` does); an existing DIR is replaced only by a
complete new one, and only if it is such a folder or empty. The decisions (which tokens are
special, how spaces are marked, byte fallback, unk/pad/eos) are in docs/formats/gguf.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from matrixctl import codes
from matrixctl.errors import FormatError, OutputError, UsageError
from matrixctl.formats import gguf as gguf_format
from matrixctl.formats import gguf_ingest as gguf_ingest_format
from matrixctl.package import __version__
from matrixctl.tensors import TensorInfo, TensorSource, drop_pages
from matrixctl.tokenizers import pi
from matrixctl.tokenizers.agreement import VocabPlan, keys_of

if TYPE_CHECKING:
    from matrixctl.io import Source

G = "ingest"
INGEST_GGUF_VOCAB = codes.define(
    "INGEST_GGUF_VOCAB",
    "The GGUF has no usable tokenizer.ggml.tokens array, so there is no vocabulary to ingest.",
    group=G,
)

EMBD_TENSOR = "token_embd.weight"
# --embeddings choice -> (container format, extension).
EMBEDDINGS = {
    "zt": ("ztensor", ".zt"),
    "safetensors": ("safetensors", ".safetensors"),
    "stb": ("stb", ".stb"),
    "npy": ("npy", ".npy"),
}
HASH_CHUNK = 8 << 20
JOIN_BATCH = 1 << 16  # tokens cut out of the file per step
MAX_SYMBOL_KEY = pi.MAX_SYMBOL_BYTES
# GGUF token types (llama.cpp `llama_token_type`).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
MATCHED_TYPES = frozenset({NORMAL, USER_DEFINED})


@dataclass
class Options:
    embeddings: str = "zt"  # a key of EMBEDDINGS, or "none"
    dtype: str | None = None  # f32 (default) or f16; None with keep_quantized
    keep_quantized: bool = False
    progress: Any = None


# The symbol map ------------------------------------------------------------------------------


def _special_ids(gf: gguf_format.GgufFile) -> dict[str, int]:
    from matrixctl.formats.gguf_constants import SPECIALS

    out: dict[str, int] = {}
    for key, short in SPECIALS.items():
        kv = gf.kvs.get(f"tokenizer.ggml.{key}")
        if kv is not None and kv.vtype in gguf_format.INTEGER_TYPES:
            out.setdefault(short.removesuffix("_id"), int(kv.value))
    return out


def _flag(gf: gguf_format.GgufFile, key: str) -> bool | None:
    kv = gf.kvs.get(key)
    if kv is None or kv.vtype != gguf_format.BOOL:
        return None
    return bool(kv.value)


def detect_marking(
    gf: gguf_format.GgufFile, model: str | None, texts: list[str], types: list[int]
) -> pi.SpaceMarking | None:
    """How the vocabulary marks spaces, from tokenizer.ggml.model (llama.cpp's tokenizer kinds),
    else from the tokens themselves."""
    marker = pi.SPM_MARKER
    if model in ("llama", "t5", "ugm"):
        prefix = _flag(gf, "tokenizer.ggml.add_space_prefix")
        return pi.SpaceMarking("sentencepiece", marker=marker, prefix_space=prefix is not False)
    if model == "gpt2":
        return pi.SpaceMarking("byte_level")
    if model == "bert":
        return _wordpiece(texts, types, marker)
    n = max(1, len(texts))
    counts = {
        "sentencepiece": sum(1 for t in texts if t.startswith(marker)),
        "byte_level": sum(1 for t in texts if t.startswith("\u0120")),
        "wordpiece": sum(1 for t in texts if t.startswith("##")),
    }
    scheme, hits = max(counts.items(), key=lambda kv: kv[1])
    if hits * 100 < n:  # under 1% of the tokens: no marking this reader knows
        return None
    if scheme == "sentencepiece":
        prefix = _flag(gf, "tokenizer.ggml.add_space_prefix")
        return pi.SpaceMarking("sentencepiece", marker=marker, prefix_space=prefix is not False)
    if scheme == "byte_level":
        return pi.SpaceMarking("byte_level")
    return _wordpiece(texts, types, None)


def _wordpiece(texts: list[str], types: list[int], marker: str | None) -> pi.SpaceMarking:
    """WordPiece: lower-case (and strip accents) when no normal token has a letter that
    lower-casing or NFD decomposition would change, i.e. the vocabulary is uncased."""
    import unicodedata

    normal = [t for t, ty in zip(texts, types, strict=True) if ty == NORMAL]
    cased = any(c.lower() != c for t in normal for c in t)
    accents = any(unicodedata.normalize("NFD", t) != t for t in normal)
    if marker is not None:
        return pi.SpaceMarking(
            "wordpiece", marker=marker, lowercase=not cased, strip_accents=not cased and not accents
        )
    return pi.SpaceMarking(
        "wordpiece", continuation="##", lowercase=not cased, strip_accents=not cased and not accents
    )


def _byte_run(texts: list[str]) -> int | None:
    """The id of `<0x00>` when the 256 byte tokens `<0x00>`..`<0xFF>` follow each other in
    order (SentencePiece's byte fallback), else None."""
    try:
        base = texts.index("<0x00>")
    except ValueError:
        return None
    if base + 256 > len(texts):
        return None
    for b in range(256):
        if texts[base + b] != f"<0x{b:02X}>":
            return None
    return base


def build_vocab(gf: gguf_format.GgufFile, buf: Any) -> VocabPlan:
    """The π symbol map of a GGUF vocabulary: symbol i is GGUF token i, in GGUF order.

    Byte tokens forming the full run <0x00>..<0xFF> become the map's byte fallback; control,
    unknown and unused tokens, and tokens that cannot be matched (empty, not UTF-8, longer
    than 1,024 bytes, or matching the same bytes as a lower id) are listed as special symbols
    (kept with their id and text, never matched)."""
    tokens_kv = gf.kvs.get("tokenizer.ggml.tokens")
    if tokens_kv is None or not isinstance(tokens_kv.value, gguf_format.GgufArray):
        raise FormatError(
            INGEST_GGUF_VOCAB,
            "the file has no tokenizer.ggml.tokens array: there is no vocabulary to ingest",
            field="tokenizer.ggml.tokens",
        )
    arr: gguf_format.GgufArray = tokens_kv.value
    if arr.item_type != gguf_format.STRING or arr.count == 0:
        raise FormatError(
            INGEST_GGUF_VOCAB,
            f"tokenizer.ggml.tokens is an empty array or not strings ({arr.type_name})",
            field="tokenizer.ggml.tokens",
        )
    import numpy as np

    texts, not_utf8 = _decode_all(arr, buf)
    n = len(texts)
    types_kv = gf.kvs.get("tokenizer.ggml.token_type")
    specials_gguf = _special_ids(gf)
    if types_kv is not None and isinstance(types_kv.value, gguf_format.GgufArray):
        types = types_kv.value.numpy(buf).astype(np.int64)
    else:  # no types: the special ids are the control tokens
        types = np.full(n, NORMAL, dtype=np.int64)
        for v in specials_gguf.values():
            if 0 <= v < n:
                types[v] = CONTROL
    model = gf.text("tokenizer.ggml.model")
    pre = gf.text("tokenizer.ggml.pre")
    marking = detect_marking(gf, model, texts, types.tolist())
    base = _byte_run(texts)
    keys = keys_of(texts, marking)
    lens = np.fromiter(map(len, keys), dtype=np.int64, count=n)
    matched = ((types == NORMAL) | (types == USER_DEFINED)) & (lens > 0) & (lens <= MAX_SYMBOL_KEY)
    if not_utf8:
        matched[list(not_utf8)] = False
    if base is not None:
        matched[base : base + 256] = False
    ids = np.flatnonzero(matched).tolist()
    mkeys = [keys[i] for i in ids]
    lowest = dict(zip(reversed(mkeys), reversed(ids), strict=True))  # key -> its lowest id
    dups: set[int] = set()
    if len(lowest) < len(ids):
        dups = {i for k, i in zip(mkeys, ids, strict=True) if lowest[k] != i}
    listed = np.ones(n, dtype=bool)
    if base is not None:
        listed[base : base + 256] = False  # the byte-fallback ids are not symbols
    unmatched = np.flatnonzero(listed & ~matched).tolist()
    special_set = set(unmatched) | dups
    kinds = {
        CONTROL: "control",
        UNKNOWN: "unknown",
        UNUSED: "unused",
        BYTE: "byte token outside a full <0x00>..<0xFF> run",
    }
    reasons: dict[str, int] = {}
    for i in sorted(special_set):
        ty = int(types[i])
        if i in dups:
            why = "matches the same bytes as a lower id"
        elif i in not_utf8:
            why = "not UTF-8"
        elif ty not in MATCHED_TYPES:
            why = kinds.get(ty, f"token type {ty}")
        elif not keys[i]:
            why = "empty"
        else:
            why = f"longer than {MAX_SYMBOL_KEY} bytes"
        reasons[why] = reasons.get(why, 0) + 1
    if base is None:
        symbols = list(enumerate(texts))
    else:
        symbols = [
            *enumerate(texts[:base]),
            *zip(range(base + 256, n), texts[base + 256 :], strict=True),
        ]

    unk = specials_gguf.get("unk")
    pad = specials_gguf.get("pad")
    eos = specials_gguf.get("eos")
    fallback = next(
        (v for v in (unk, pad, eos, specials_gguf.get("bos")) if v is not None and 0 <= v < n),
        0,
    )
    unk_id = unk if unk is not None and 0 <= unk < n else fallback
    smap = pi.SymbolMap(
        vocab_size=n,
        unk_id=unk_id,
        pad_id=pad if pad is not None and 0 <= pad < n else unk_id,
        byte_fallback=base is not None,
        byte_base_id=base,
        normalization="none",
        symbols=tuple(symbols),
        eos_id=eos if eos is not None and 0 <= eos < n else None,
        space_marking=marking,
        specials=frozenset(special_set),
    )
    return VocabPlan(smap, model, pre, n, specials_gguf, not_utf8, reasons, texts, keys)


def _decode_all(arr: gguf_format.GgufArray, buf: Any) -> tuple[list[str], dict[int, bytes]]:
    """Every token as text, in batches (one decode of a batch's joined bytes when they are all
    UTF-8 and none holds a NUL, else token by token); tokens that are not UTF-8 are
    backslash-escaped and returned apart as raw bytes."""
    texts: list[str] = []
    not_utf8: dict[int, bytes] = {}
    for first in range(0, arr.count, JOIN_BATCH):
        stop = min(arr.count, first + JOIN_BATCH)
        joined = arr.joined(buf, first, stop)
        if joined.count(b"\x00") == stop - first - 1:
            try:
                texts.extend(joined.decode("utf-8").split("\x00"))
                continue
            except UnicodeDecodeError:
                pass
        for i, b in enumerate(arr.strings(buf, first, stop), first):
            try:
                texts.append(b.decode("utf-8"))
            except UnicodeDecodeError:
                texts.append(b.decode("utf-8", "backslashreplace"))
                not_utf8[i] = bytes(b)
    return texts, not_utf8


def tokenizer_sidecar(gf: gguf_format.GgufFile, buf: Any, plan: VocabPlan) -> dict[str, Any]:
    """Everything the GGUF says about its tokenizer that the map does not hold."""
    metadata: dict[str, Any] = {}
    for kv in gf.kvs.values():
        if not kv.name.startswith("tokenizer.") or kv.name == "tokenizer.ggml.tokens":
            continue
        # float32 values are written as the double they equal exactly (reads back the same).
        metadata[kv.name] = gguf_format.metadata_value(gf, buf, kv)
    return {
        "version": 1,
        "tokens": plan.tokens,
        "model": plan.model,
        "pre": plan.pre,
        "special_ids": plan.special_ids,
        "special_symbols": dict(sorted(plan.reasons.items())),
        "not_utf8_tokens": {str(i): b.hex() for i, b in sorted(plan.not_utf8.items())},
        "metadata": metadata,
    }


# Embeddings ---------------------------------------------------------------------------------


class EmbeddingSource(TensorSource):
    """One tensor of an opened GGUF source, with the metadata the embedding file records."""

    def __init__(
        self,
        inner: gguf_format.GgufSource,
        info: TensorInfo,
        meta: Mapping[str, Any],
        stop: threading.Event | None = None,
    ) -> None:
        self.inner = inner
        self.info = info
        self.meta = dict(meta)
        self.format = inner.format
        self.stop = stop

    def tensors(self) -> list[TensorInfo]:
        return [self.info]

    def metadata(self) -> dict[str, Any]:
        return dict(self.meta)

    def stream(self, info: TensorInfo, role: str = "data") -> Iterator[Any]:
        for piece in self.inner.stream(info, role):
            if self.stop is not None and self.stop.is_set():
                raise _Cancelled()
            # A slice of the mapped model is copied: the output is written on a helper thread
            # after the source has dropped the slice's pages, which would fault them back in
            # and keep them resident. A copy (8 MiB at a time) keeps memory flat.
            yield bytes(piece) if isinstance(piece, memoryview) else piece

    def release(self, info: TensorInfo) -> None:
        self.inner.release(info)


def sink_for(choice: str) -> tuple[str, str, Any]:
    """(format, extension, sink class) for --embeddings CHOICE."""
    from matrixctl.formats.registry import TENSOR_CONTAINERS

    fmt, ext = EMBEDDINGS[choice]
    container = next((c for c in TENSOR_CONTAINERS if c.format == fmt), None)
    sink = container.io()[1] if container is not None else None
    if sink is None:
        raise UsageError(
            f"--embeddings {choice}: this build of matrixctl has no {fmt} writer",
            hint="choose zt, safetensors or npy",
        )
    return fmt, ext, sink


# The output folder ---------------------------------------------------------------------------


class _Hasher(threading.Thread):
    """SHA-256 of a mapped input on a helper thread (hashlib releases the GIL on big
    buffers, so it overlaps with the parse and the dequantization on a second core)."""

    def __init__(self, buf: Any, size: int, path: str | None = None) -> None:
        super().__init__(name="matrixctl-sha256", daemon=True)
        self.buf = buf
        self.size = size
        self.path = path
        self.digest: str | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            h = hashlib.sha256()
            if self.path is not None:
                # read() into one reused buffer: no page faults on the mapping, flat RSS.
                block = bytearray(HASH_CHUNK)
                view = memoryview(block)
                with open(self.path, "rb", buffering=0) as fp:
                    while n := fp.readinto(block):
                        h.update(view[:n])
            else:
                view = memoryview(self.buf)
                for start in range(0, self.size, HASH_CHUNK):
                    h.update(view[start : start + HASH_CHUNK])
                    drop_pages(self.buf, start, HASH_CHUNK)  # read once: keep RSS flat
            view.release()
            self.digest = "sha256:" + h.hexdigest()
        except BaseException as exc:  # pragma: no cover - reported by result()
            self.error = exc

    def result(self) -> str:
        self.join()
        if self.error is not None:  # pragma: no cover
            raise self.error
        assert self.digest is not None
        return self.digest


def check_destination(dest: str) -> None:
    if os.path.lexists(dest):
        if os.path.isdir(dest) and not os.path.islink(dest):
            partial = os.path.isfile(os.path.join(dest, gguf_ingest_format.MANIFEST + ".partial"))
            if gguf_ingest_format.is_folder(dest) or partial or not os.listdir(dest):
                return
            raise OutputError(
                gguf_ingest_format.GGUF_OUTPUT,
                "exists and is not a folder `ingest gguf` wrote; refusing to replace it",
                path=dest,
                hint="choose another -o, or remove the folder yourself",
            )
        raise OutputError(gguf_ingest_format.GGUF_OUTPUT, "exists and is not a folder", path=dest)


@contextlib.contextmanager
def building(dest: str) -> Iterator[str]:
    """A temporary sibling folder; removed on any failure (Ctrl-C included)."""
    from matrixctl.ingest.swap import make_temp_dir

    made: list[str] = []  # the folder's name, recorded before it exists
    done = False
    try:
        tmp = make_temp_dir(dest, made)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)
        yield tmp
        done = True
    finally:
        if not done:
            for path in made:
                shutil.rmtree(path, ignore_errors=True)


def put_in_place(tmp: str, dest: str) -> None:
    """Publish the finished folder (manifest included) over `dest` in one atomic step
    (`matrixctl.ingest.swap.publish`); the old folder is removed afterwards."""
    from matrixctl.ingest.swap import publish

    try:
        publish(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _write(path: str, data: bytes) -> None:
    from matrixctl.io import durable

    with open(path, "wb") as fp:
        fp.write(data)
        fp.flush()
        if durable():
            os.fsync(fp.fileno())


def _json_bytes(doc: Any) -> bytes:
    return (json.dumps(doc, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def _json_lines(doc: dict[str, Any], indent: str = "  ") -> str:
    """A JSON object with one member per line, each value compact (big arrays stay on one
    line: json's C encoder writes them, its indenting encoder is pure Python); objects one
    level down are broken the same way."""
    lines = []
    for key, value in doc.items():
        if isinstance(value, dict) and value:
            text = _json_lines(value, indent + "  ")
        else:
            text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
        lines.append(f"{indent}{json.dumps(key, ensure_ascii=False)}: {text}")
    return "{\n" + ",\n".join(lines) + "\n" + indent[:-2] + "}"


def ingest_gguf(src: Source, dest: str, opts: Options) -> dict[str, Any]:
    """Write the folder; return the manifest."""
    from matrixctl.converters.tensors import convert_source
    from matrixctl.ingest.gguf_tokenizer import measure as measure_tokenizer
    from matrixctl.ingest.pack import created_stamp
    from matrixctl.io import sha256_file
    from matrixctl.opening import open_checked
    from matrixctl.tokenizers.agreement import report_line

    if opts.embeddings != "none" and opts.embeddings not in EMBEDDINGS:
        raise UsageError(f"--embeddings must be one of {', '.join(EMBEDDINGS)} or none")
    if opts.keep_quantized and opts.dtype is not None:
        raise UsageError(
            "--keep-quantized stores the blocks as they are; --dtype does not apply to it"
        )
    if opts.keep_quantized and opts.embeddings not in ("zt", "none"):
        raise UsageError(
            f"--keep-quantized needs --embeddings zt (zTensor quantized_group); "
            f"{opts.embeddings} holds dense tensors only"
        )
    dtype = None if opts.keep_quantized else (opts.dtype or "f32")
    if dtype not in (None, "f32", "f16"):
        raise UsageError(f"--dtype must be f32 or f16, got {dtype!r}")
    embd_sink = sink_for(opts.embeddings) if opts.embeddings != "none" else None
    from matrixctl.ingest.swap import clean_stale

    clean_stale(dest)
    check_destination(dest)

    regular = src.path != "-" and os.path.isfile(src.path)
    hasher = _Hasher(src.buf, src.size, src.path if regular else None)
    hasher.start()
    try:
        checked = open_checked(src, gguf_format.FORMAT)
        source = gguf_format.GgufSource(src, checked, {"keep_quantized": opts.keep_quantized})
    except BaseException:
        hasher.join()
        raise
    notes: list[str] = []
    stop = threading.Event()
    try:
        gf = source.gf
        tokens = gf.get("tokenizer.ggml.tokens")
        n_tokens = tokens.count if isinstance(tokens, gguf_format.GgufArray) else 0
        embd = next((t for t in gf.tensors if t.name == EMBD_TENSOR), None)
        # The slot exits before `building` removes the temporary folder on a failure: the
        # embeddings writer is stopped and joined before its folder goes.
        with building(dest) as tmp, _WorkerSlot(stop) as slot:
            known: dict[str, str] = {}  # file -> SHA-256 computed while it was written
            embeddings: dict[str, Any] | None = None
            if embd_sink is not None and embd is None:
                notes.append(
                    f"{src.name} has no {EMBD_TENSOR} (a vocabulary-only file): only the "
                    "tokenizer was ingested"
                )
            elif embd_sink is not None and embd is not None and n_tokens:
                # The embeddings (numpy, hashing, writing: they release the GIL) are written
                # on a helper thread while this one builds the symbol map (pure Python).
                args = (source, src, embd, n_tokens, tmp, embd_sink, dtype, opts, stop)
                slot.start(_Worker(lambda: _embeddings(*args, convert_source)))
            try:
                plan = build_vocab(gf, src.buf)
            except FormatError as err:
                raise err.with_path(src.name) from None
            measured = measure_tokenizer(gf, src.buf, plan)
            map_bytes = plan.smap.to_json_bytes()
            known[gguf_ingest_format.SYMBOLS] = "sha256:" + hashlib.sha256(map_bytes).hexdigest()
            _write(os.path.join(tmp, gguf_ingest_format.SYMBOLS), map_bytes)
            sidecar = tokenizer_sidecar(gf, src.buf, plan)
            _write(
                os.path.join(tmp, gguf_ingest_format.TOKENIZER),
                (_json_lines(sidecar) + "\n").encode(),
            )
            canonical_hash = plan.smap.canonical_hash()
            if slot.worker is not None:
                embeddings, embd_notes, embd_known = slot.outcome()
                notes.extend(embd_notes)
                known.update(embd_known)
            source_sha = hasher.result()
            files = {}
            for name in sorted(os.listdir(tmp)):
                path = os.path.join(tmp, name)
                digest = known.get(name) or sha256_file(path)
                files[name] = {"sha256": digest, "bytes": os.path.getsize(path)}
            smap = plan.smap
            manifest: dict[str, Any] = {
                "version": gguf_ingest_format.MANIFEST_VERSION,
                "kind": "gguf",
                "source": {"path": src.name, "bytes": src.size, "sha256": source_sha},
                "gguf": {
                    "version": gf.version,
                    "architecture": gf.text("general.architecture"),
                    "name": gf.text("general.name"),
                    "tensor_count": gf.tensor_count,
                    "kv_count": gf.kv_count,
                },
                "tokenizer": {
                    "file": gguf_ingest_format.SYMBOLS,
                    "canonical_hash": canonical_hash,
                    "sidecar": gguf_ingest_format.TOKENIZER,
                    "model": plan.model,
                    "pre": plan.pre,
                    "vocab_size": smap.vocab_size,
                    "token_dtype": "uint16" if smap.vocab_size <= 1 << 16 else "uint32",
                    "space_marking": smap.space_marking.to_json() if smap.space_marking else None,
                    "byte_fallback": smap.byte_fallback,
                    "byte_base_id": smap.byte_base_id,
                    "unk_id": smap.unk_id,
                    "pad_id": smap.pad_id,
                    "eos_id": smap.eos_id,
                    "special_ids": plan.special_ids,
                    "special_symbols": len(smap.specials),
                    "type": measured.type.name,
                    "agreement": measured.manifest,
                },
                "embeddings": embeddings,
                "files": files,
                "options": {
                    "embeddings": opts.embeddings,
                    "dtype": dtype,
                    "keep_quantized": opts.keep_quantized,
                },
                "tool": {"name": "matrixctl", "version": __version__},
                "created": created_stamp(),
            }
            _write(os.path.join(tmp, gguf_ingest_format.MANIFEST), _json_bytes(manifest))
            put_in_place(tmp, dest)
    finally:
        hasher.join()
        source.close()
    manifest["notes"] = notes
    manifest["report"] = report_line(measured)  # (line, warning?): the tokenizer's type
    return manifest


class _Cancelled(Exception):
    """The main thread failed: the embeddings writer stops (its output is discarded)."""


class _WorkerSlot:
    """Holds the embeddings writer; leaving the block before its outcome was taken (this
    thread failed, or was interrupted) stops the writer at its next chunk and waits for it."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.worker: _Worker | None = None
        self._taken = False

    def start(self, worker: _Worker) -> None:
        self.worker = worker
        worker.start()

    def outcome(self) -> Any:
        assert self.worker is not None
        self._taken = True
        return self.worker.outcome()

    def __enter__(self) -> _WorkerSlot:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.worker is not None and not self._taken:
            self.stop.set()
            self.worker.join()


class _Worker(threading.Thread):
    def __init__(self, fn: Any) -> None:
        super().__init__(name="matrixctl-embeddings", daemon=True)
        self.fn = fn
        self.value: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.value = self.fn()
        except BaseException as exc:
            self.error = exc

    def outcome(self) -> Any:
        self.join()
        if self.error is not None:
            raise self.error
        return self.value


def _embeddings(
    source: gguf_format.GgufSource,
    src: Source,
    embd: gguf_format.GgufTensor,
    n_tokens: int,
    tmp: str,
    embd_sink: tuple[str, str, Any],
    dtype: str | None,
    opts: Options,
    stop: threading.Event,
    convert_source: Any,
) -> tuple[dict[str, Any], list[str], dict[str, str]]:
    """Write token_embd.weight into `tmp`; return its manifest entry, notes and digest."""
    fmt, ext, sink_cls = embd_sink
    info = source.info(embd)
    notes: list[str] = []
    known: dict[str, str] = {}
    rows = embd.shape[0] if embd.shape else 0
    if len(embd.shape) != 2 or rows != n_tokens:
        notes.append(
            f"{EMBD_TENSOR} has shape {list(embd.shape)}, not one row per token of the "
            f"{n_tokens:,}-token vocabulary; it is written as it is"
        )
    assert embd.gtype is not None
    meta = {"source": "gguf", "tensor": EMBD_TENSOR, "ggml_type": embd.gtype.name}
    keeps = getattr(sink_cls, "keeps_metadata", False)
    wrapped = EmbeddingSource(source, info, meta if keeps else {}, stop)
    path = os.path.join(tmp, "token_embd" + ext)
    options: dict[str, Any] = {"progress": opts.progress, "sha256": True}
    if dtype is not None:
        options["dtype"] = [dtype]
    result = convert_source(wrapped, src, path, options, dst_fmt=fmt, sink_cls=sink_cls)
    notes.extend(result.notes)
    if result.summary.get("sha256"):
        known[os.path.basename(path)] = result.summary["sha256"]
    out_dtype = (result.summary.get("cast") or {}).get(EMBD_TENSOR) or info.dtype
    if info.layout == "quantized_group":
        stored = "quantized"
    elif embd.gtype.quantized:
        stored = "dequantized"
    else:
        stored = "cast" if out_dtype != info.dtype else "as stored"
    entry = {
        "file": os.path.basename(path),
        "format": fmt,
        "tensor": EMBD_TENSOR,
        "shape": list(embd.shape),
        "dtype": out_dtype,
        "layout": info.layout,
        "source_type": embd.gtype.name,
        "stored": stored,
    }
    return entry, notes, known
