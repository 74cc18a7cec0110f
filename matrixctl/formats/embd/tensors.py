"""EMBD in `convert`: `EmbdSource` and `EmbdSink`, and the vocabulary's mapping to and from
file metadata under GGUF's key names."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from matrixctl import crc
from matrixctl.errors import FormatError, UsageError
from matrixctl.formats.embd.layout import (
    ALIGNMENT,
    DESCRIPTOR,
    DTYPE_IDS,
    EMBD_BOUNDS,
    EMBD_DATA_CRC,
    EMBD_FILE_CRC,
    EMBD_META_MISSING,
    EMBD_MODEL,
    EMBD_SECTION,
    EMBD_SPECIAL,
    EMBD_UTF8,
    EMBD_VOCAB,
    END_MAGIC,
    FLAG_CHECKSUM_ENABLED,
    FLAG_TENSORS_ALIGNED,
    FLAG_VOCAB_EMBEDDED,
    FOOTER_SIZE,
    FORMAT,
    HEADER_SIZE,
    MAX_RANK,
    MAX_TOKENS,
    NO_TOKEN,
    SECTION_ALIGN,
    SPECIALS,
    U16_MAX,
    U32_MAX,
    VERSION_MAJOR,
    VERSION_MINOR,
    VOCAB_HEAD,
    EmbdFile,
    Footer,
    Header,
    align,
    fnv1a_32,
)
from matrixctl.formats.embd.model import (
    DEFAULT_VERSION,
    EPOCH_TEXT,
    REQUIRED_KEYS,
    check_metadata,
    created_at_now,
    decimal,
    layer_indices,
    model_problems,
)
from matrixctl.formats.embd.parse import data_span
from matrixctl.records import Record
from matrixctl.tensors import (
    FileCheck,
    Outputs,
    PartStreams,
    TensorInfo,
    TensorSink,
    TensorSource,
    copy_stream,
    crc_range,
    drop_pages,
    mapped_chunks,
    storage_array,
)

if TYPE_CHECKING:
    from matrixctl.io import Source

# Vocabularies travel through `convert` as file metadata under GGUF's key names.
TOKENS_KEY = "tokenizer.ggml.tokens"
SPECIAL_KEYS = {
    "pad": "tokenizer.ggml.padding_token_id",
    "unk": "tokenizer.ggml.unknown_token_id",
    "cls": "tokenizer.ggml.cls_token_id",
    "sep": "tokenizer.ggml.seperator_token_id",  # sic: GGUF's spelling
    "mask": "tokenizer.ggml.mask_token_id",
}
BERT_SPECIAL_TOKENS = {
    "pad": "[PAD]",
    "unk": "[UNK]",
    "cls": "[CLS]",
    "sep": "[SEP]",
    "mask": "[MASK]",
}
# GGUF architecture keys that fill the required metadata (`{arch}` = general.architecture).
GGUF_KEYS = {
    "num_layers": "{arch}.block_count",
    "hidden_size": "{arch}.embedding_length",
    "embedding_dim": "{arch}.embedding_length",
    "intermediate_size": "{arch}.feed_forward_length",
    "num_attention_heads": "{arch}.attention.head_count",
    "max_position_emb": "{arch}.context_length",
    "layer_norm_eps": "{arch}.attention.layer_norm_epsilon",
}


# Reading for convert ------------------------------------------------------------------------


def vocabulary_metadata(tokens: list[str], special: Mapping[str, int]) -> dict[str, Any]:
    """A vocabulary as file metadata (GGUF key names)."""
    out: dict[str, Any] = {TOKENS_KEY: list(tokens)}
    for name, key in SPECIAL_KEYS.items():
        value = special.get(name, NO_TOKEN)
        if value != NO_TOKEN:
            out[key] = value
    return out


class EmbdSource(TensorSource):
    """An EMBD file opened for `convert`: every structural rule must pass, and the data and
    file checksums are checked before anything is handed out (one CRC pass, pages dropped),
    or, in a conversion, as the tensors are copied (`FileCheck`)."""

    format = FORMAT

    def __init__(self, src: Source, checked: Any) -> None:
        self.src = src
        self.embd: EmbdFile = checked.embd
        f = self.embd
        self.check: FileCheck | None = None
        span = data_span(f)
        if f.header.flags & FLAG_CHECKSUM_ENABLED and f.footer is not None and span is not None:
            self.check = FileCheck(src.buf, *span, self._judge(crc_range(src.buf, 0, span[0])))
            self.check.opened()
        self._by_name = {t.name: t for t in f.tensors}

    def _judge(self, prefix: int) -> Callable[[int], None]:
        """The data checksum's test, then the file checksum's (`prefix`: the CRC-32 of the
        bytes before the tensor data)."""
        f, name = self.embd, self.src.name
        footer = f.footer
        assert footer is not None
        start, end = f.header.tensor_data_offset, f.header.footer_offset

        def judge(data: int) -> None:
            if data != footer.data_checksum:
                raise FormatError(
                    EMBD_DATA_CRC,
                    f"data_checksum is 0x{footer.data_checksum:08x}, the tensor data's "
                    f"CRC-32 is 0x{data:08x}",
                    path=name,
                    offset=f.size - FOOTER_SIZE,
                    field="data_checksum",
                )
            whole = crc.crc32_combine(prefix, data, end - start)
            if whole != footer.file_checksum:
                raise FormatError(
                    EMBD_FILE_CRC,
                    f"file_checksum is 0x{footer.file_checksum:08x}, the CRC-32 of bytes "
                    f"0..{f.size - FOOTER_SIZE - 1} is 0x{whole:08x}",
                    path=name,
                    offset=f.size - FOOTER_SIZE + 4,
                    field="file_checksum",
                )

        return judge

    def finish_checks(self) -> None:
        if self.check is not None:
            self.check.finish()

    @property
    def tokens(self) -> list[str] | None:
        return self.embd.tokens

    @property
    def special(self) -> dict[str, int] | None:
        return self.embd.special

    def tensors(self) -> list[TensorInfo]:
        return [TensorInfo(t.name, t.dtype or "u8", t.shape) for t in self.embd.readable()]

    def metadata(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.embd.metadata)
        if self.embd.tokens is not None and self.embd.special is not None:
            out.update(vocabulary_metadata(self.embd.tokens, self.embd.special))
        return out

    def stream(self, info: TensorInfo, role: str = "data") -> Iterator[Any]:
        t = self._by_name[info.name]
        if self.check is not None:
            return self.check.stored(t.offset, t.nbytes)
        return mapped_chunks(self.src.buf, t.offset, t.nbytes)

    def array(self, info: TensorInfo, role: str = "data", *, verify: bool = True) -> Any:
        """Zero-copy view of the tensor's bytes in the mapped file (the checksums checked
        first)."""
        t = self._by_name[info.name]
        if self.check is not None:
            self.check.check()
        return storage_array(memoryview(self.src.buf)[t.offset : t.end], t.dtype or "u8")

    def release(self, info: TensorInfo) -> None:
        t = self._by_name[info.name]
        drop_pages(self.src.buf, t.offset, t.nbytes)


# Writing ------------------------------------------------------------------------------------


def utf8(text: str, what: str) -> bytes:
    """`text` as UTF-8; a lone surrogate (possible in JSON text) is EMBD_UTF8, not a crash."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise FormatError(
            EMBD_UTF8, f"{what} {text[:40]!r} is not valid Unicode text (a lone surrogate)"
        ) from None


def metadata_bytes(entries: list[tuple[str, str]]) -> bytes:
    body = bytearray()
    for key, value in entries:
        k, v = utf8(key, "metadata key"), utf8(value, f"metadata value of {key!r}")
        body += struct.pack("<HH", len(k), len(v)) + k + v
    return struct.pack("<II", len(entries), len(body)) + body


def vocab_bytes(offset: int, tokens: list[str], special: Mapping[str, int]) -> bytes:
    """The vocabulary section at absolute `offset`: header, the five ids, then the tokens."""
    body = bytearray()
    try:
        for raw in (t.encode("utf-8") for t in tokens):
            body += len(raw).to_bytes(2, "little")
            body += raw
    except UnicodeEncodeError:
        bad = next(i for i, t in enumerate(tokens) if not t.isascii() and _lone(t))
        raise FormatError(
            EMBD_UTF8, f"token {bad} is not valid Unicode text (a lone surrogate)"
        ) from None
    ids = struct.pack("<5I", *(special.get(n, NO_TOKEN) for n in SPECIALS))
    return struct.pack("<III", len(tokens), len(body), offset + VOCAB_HEAD) + ids + body


def _lone(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def index_bytes(plan: list[TensorInfo], offsets: list[int]) -> bytes:
    descs = []
    for info, off in zip(plan, offsets, strict=True):
        raw = info.name.encode()
        dims = list(info.shape) + [0] * (MAX_RANK - len(info.shape))
        descs.append(
            DESCRIPTOR.pack(
                fnv1a_32(raw), DTYPE_IDS[info.dtype], len(info.shape), len(raw), *dims, off
            )
        )
    return b"".join(descs) + b"".join(i.name.encode() for i in plan)


def _metadata_text(value: Any) -> str:
    return (
        value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False)
    )


def vocabulary_from(metadata: Mapping[str, Any]) -> tuple[list[str], dict[str, int]] | None:
    """The vocabulary a source carries as metadata (a list, or its JSON text after a trip
    through safetensors or zTensor), with the special ids (looked up as BERT's [PAD], [UNK],
    ... when the keys are absent)."""
    raw = metadata.get(TOKENS_KEY)
    if raw is None:
        return None
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            raw = None
    if not isinstance(raw, list) or not all(isinstance(t, str) for t in raw):
        raise FormatError(
            EMBD_VOCAB,
            f"metadata {TOKENS_KEY} is not a list of token strings",
            field=TOKENS_KEY,
        )
    tokens: list[str] = raw
    if len(tokens) > MAX_TOKENS:
        raise FormatError(
            EMBD_VOCAB,
            f"{len(tokens):,} tokens is above the {MAX_TOKENS:,} limit",
            field=TOKENS_KEY,
        )
    for i, tok in enumerate(tokens):
        # A UTF-8 character takes at most 4 bytes: only long strings need encoding to check.
        if len(tok) > U16_MAX // 4 and len(tok.encode("utf-8", "replace")) > U16_MAX:
            raise FormatError(
                EMBD_VOCAB, f"token {i} is longer than 65,535 bytes", field=f"token[{i}]"
            )
    special: dict[str, int] = {}
    lookup: dict[str, int] | None = None
    for name, key in SPECIAL_KEYS.items():
        value = metadata.get(key)
        if value is not None:
            number = value if isinstance(value, int) else decimal(str(value))
            if number is None or not 0 <= number < len(tokens):
                raise FormatError(
                    EMBD_SPECIAL,
                    f"{key} is {value!r:.20}, not a token id of the {len(tokens):,}-token "
                    "vocabulary",
                    field=key,
                )
            special[name] = number
            continue
        if lookup is None:
            lookup = {}
            for i, tok in enumerate(tokens):
                lookup.setdefault(tok, i)
        special[name] = lookup.get(BERT_SPECIAL_TOKENS[name], NO_TOKEN)
    return tokens, special


def infer_from_tensors(plan: list[TensorInfo]) -> dict[str, str]:
    """Required metadata a BERT encoder's tensor shapes give (all but the head count)."""
    shapes = {i.name: i.shape for i in plan}
    out: dict[str, str] = {}
    word = shapes.get("embeddings.word_embeddings.weight")
    if word is not None and len(word) == 2:
        out["vocab_size"] = str(word[0])
        out["hidden_size"] = str(word[1])
        out["embedding_dim"] = str(word[1])
    pos = shapes.get("embeddings.position_embeddings.weight")
    if pos is not None and len(pos) == 2:
        out["max_position_emb"] = str(pos[0])
    layers = layer_indices(list(shapes))
    if layers:
        out["num_layers"] = str(max(layers) + 1)
    inter = shapes.get("encoder.layer.0.intermediate.dense.weight")
    if inter is not None and len(inter) == 2:
        out["intermediate_size"] = str(inter[0])
    return out


def from_gguf(metadata: Mapping[str, Any]) -> dict[str, str]:
    """Required metadata from GGUF architecture keys, when the source is a GGUF file."""
    arch = metadata.get("general.architecture")
    out: dict[str, str] = {}
    if not isinstance(arch, str):
        return out
    if isinstance(metadata.get("general.name"), str):
        out["model_name"] = metadata["general.name"]
    for key, pattern in GGUF_KEYS.items():
        value = metadata.get(pattern.format(arch=arch))
        if value is not None and not isinstance(value, bool):
            out[key] = repr(float(value)) if key == "layer_norm_eps" else str(value)
    return out


def build_metadata(
    plan: list[TensorInfo],
    metadata: Mapping[str, Any],
    explicit: Mapping[str, str],
    token_count: int | None,
) -> tuple[list[tuple[str, str]], list[str]]:
    """The metadata entries to write (required keys first, in the spec's order, then the rest
    sorted) and notes. Precedence for each key: --meta, then the source's metadata, then GGUF
    architecture keys, then what the tensor shapes give; created_at: --meta, then
    SOURCE_DATE_EPOCH, then the source's, then 1970-01-01T00:00:00Z; model_version: --meta,
    the source's, then 0.0.0."""
    notes: list[str] = []
    meta: dict[str, str] = {}
    converted, dropped = [], []
    for raw_key, value in metadata.items():
        key = str(raw_key)
        if key == TOKENS_KEY or key in SPECIAL_KEYS.values():
            continue  # the vocabulary section holds these
        text = _metadata_text(value)
        if _lone(key) or _lone(text):
            dropped.append(key.encode("utf-8", "backslashreplace").decode()[:40])
            continue
        if not key or len(key.encode()) > U16_MAX or len(text.encode()) > U16_MAX:
            dropped.append(key[:40])
            continue
        if not isinstance(value, str):
            converted.append(key)
        meta[key] = text
    if converted:
        notes.append(f"metadata {', '.join(converted[:8])} stored as JSON text (EMBD holds text)")
    if dropped:
        notes.append(
            f"metadata {', '.join(dropped[:8])} left out: EMBD keys and values are valid "
            "UTF-8 of at most 65,535 bytes"
        )
    inferred: list[str] = []
    for found in (from_gguf(metadata), infer_from_tensors(plan)):
        for key, value in found.items():
            if key not in meta:
                meta[key] = value
                inferred.append(key)
    if "vocab_size" not in meta and token_count is not None:
        meta["vocab_size"] = str(token_count)
        inferred.append("vocab_size")
    now = created_at_now()
    if "created_at" in explicit:
        meta["created_at"] = explicit["created_at"]
    elif now is not None:
        meta["created_at"] = now
    elif "created_at" not in meta:
        meta["created_at"] = EPOCH_TEXT
        notes.append(
            f"created_at set to {EPOCH_TEXT} (no SOURCE_DATE_EPOCH, no --meta created_at=...): "
            "the same input gives the same bytes"
        )
    if "model_version" not in meta:
        meta["model_version"] = DEFAULT_VERSION
        notes.append(f"model_version set to {DEFAULT_VERSION}; set it with --meta model_version=V")
    if inferred:
        shown = ", ".join(f"{k}={meta[k]}" for k in inferred)
        notes.append(f"metadata taken from the model's GGUF keys or tensor shapes: {shown}")
    problems = check_metadata(meta)
    missing = [key for code, key, _ in problems if code == EMBD_META_MISSING]
    if missing:
        raise FormatError(
            EMBD_META_MISSING,
            f"cannot write EMBD: the input gives no {', '.join(missing)} (required metadata)",
            field=missing[0],
            hint=" ".join(f"--meta {key}=VALUE" for key in missing),
        )
    for code, key, message in problems:
        if key in explicit:
            raise UsageError(f"--meta {key}: {message}", code=code)
        raise FormatError(code, f"cannot write EMBD: {message}", field=key)
    shapes = {i.name: i.shape for i in plan}
    for where, message in model_problems(meta, token_count, shapes):
        raise FormatError(
            EMBD_MODEL,
            f"cannot write EMBD: {message}",
            field=where,
            hint="fix the metadata with --meta KEY=VALUE",
        )
    ordered = [(k, meta[k]) for k in REQUIRED_KEYS]
    ordered += [(k, meta[k]) for k in sorted(meta) if k not in REQUIRED_KEYS]
    return ordered, notes


class Layout(Record):
    __slots__ = ("data_offset", "data_size", "index", "metadata", "offsets", "vocab")

    def __init__(
        self,
        metadata: tuple[int, bytes],
        vocab: tuple[int, bytes] | None,
        index: tuple[int, bytes],
        data_offset: int,
        offsets: list[int],
        data_size: int,
    ) -> None:
        self.metadata = metadata
        self.vocab = vocab
        self.index = index
        self.data_offset = data_offset
        self.offsets = offsets  # relative
        self.data_size = data_size

    @property
    def total(self) -> int:
        return self.data_offset + self.data_size + FOOTER_SIZE


def plan_layout(
    plan: list[TensorInfo],
    entries: list[tuple[str, str]],
    vocab: tuple[list[str], dict[str, int]] | None,
) -> Layout:
    """Sections in the spec's order, each starting at a multiple of 8 (so u32/u64 fields can be
    read in place), tensor data at a multiple of 64, each tensor 64-aligned within it."""
    meta = metadata_bytes(entries)
    pos = align(HEADER_SIZE + len(meta), SECTION_ALIGN)
    vsec = None
    if vocab is not None:
        raw = vocab_bytes(pos, vocab[0], vocab[1])
        vsec = (pos, raw)
        pos = align(pos + len(raw), SECTION_ALIGN)
    offsets = []
    rel = 0
    for info in plan:
        rel = align(rel, ALIGNMENT)
        offsets.append(rel)
        rel += info.nbytes
    index = index_bytes(plan, offsets)
    index_at = pos
    data_at = align(index_at + len(index), ALIGNMENT)
    return Layout((HEADER_SIZE, meta), vsec, (index_at, index), data_at, offsets, rel)


class EmbdSink(TensorSink):
    """`convert` into EMBD: dense tensors of the spec's nine dtypes, rank 1-4. Tensors of
    other dtypes are left out with a note (never cast unless --dtype asks); the vocabulary
    comes from the source's metadata; required metadata as `build_metadata` explains."""

    format = FORMAT
    dtypes = frozenset(DTYPE_IDS)
    keeps_metadata = True

    def refuse(self, info: TensorInfo) -> str | None:
        why = super().refuse(info)
        if why is not None:
            return why
        if not 1 <= len(info.shape) <= MAX_RANK:
            return f"EMBD holds ranks 1 to 4, this tensor has rank {len(info.shape)}"
        if any(d > U32_MAX for d in info.shape):
            return "a dimension is above 4,294,967,295 (EMBD stores u32 dimensions)"
        if _lone(info.name):
            return "its name is not valid Unicode text (a lone surrogate)"
        raw = info.name.encode("utf-8")
        if not raw or len(raw) > U16_MAX:
            return "EMBD names are 1 to 65,535 UTF-8 bytes"
        return None

    def leave_out(self, info: TensorInfo) -> str | None:
        if info.layout == "dense" and info.dtype not in self.dtypes:
            return (
                f"EMBD has no {info.dtype} dtype; never cast silently (--dtype "
                f"'{info.name}=i32' would keep it)"
            )
        return None

    def begin(self, out: Outputs, plan: list[TensorInfo], metadata: Mapping[str, Any]) -> None:
        self._notes: list[str] = []
        vocab = vocabulary_from(metadata)
        entries, notes = build_metadata(
            plan, metadata, self.options.get("meta") or {}, len(vocab[0]) if vocab else None
        )
        self._notes.extend(notes)
        if vocab is None:
            self._notes.append(
                "the input has no vocabulary: written without one (VOCAB_EMBEDDED clear)"
            )
        else:
            missing = [n for n, v in vocab[1].items() if v == NO_TOKEN]
            if missing:
                self._notes.append(
                    f"special tokens {', '.join(missing)} are not in the vocabulary: stored as "
                    "0xFFFFFFFF (none)"
                )
        layout = plan_layout(plan, entries, vocab)
        if layout.data_offset > U32_MAX:
            raise FormatError(
                EMBD_SECTION,
                "metadata, vocabulary and tensor index exceed 4 GiB: EMBD offsets are u32",
            )
        flags = FLAG_TENSORS_ALIGNED | FLAG_CHECKSUM_ENABLED
        if vocab is not None:
            flags |= FLAG_VOCAB_EMBEDDED
        vocab_at, vocab_raw = layout.vocab if layout.vocab else (0, b"")
        header = Header(
            VERSION_MAJOR,
            VERSION_MINOR,
            flags,
            HEADER_SIZE,
            len(layout.metadata[1]),
            vocab_at,
            len(vocab_raw),
            layout.index[0],
            len(plan),
            layout.data_offset,
            layout.data_size,
            layout.total,
        )
        prefix = bytearray(header.to_bytes())
        sections = [layout.metadata, layout.index]
        if layout.vocab is not None:
            sections.insert(1, layout.vocab)
        for at, raw in sections:
            prefix += bytes(at - len(prefix)) + raw
        prefix += bytes(layout.data_offset - len(prefix))
        self.fp = out.main
        self.fp.write(prefix)
        self.prefix_crc = crc.crc32(prefix)
        self.data_crc = 0
        self.layout = layout
        self.rel = 0
        self.next = 0
        self.plan = plan

    def add(self, info: TensorInfo, parts: PartStreams) -> None:
        at = self.layout.offsets[self.next]
        if at > self.rel:
            pad = bytes(at - self.rel)
            self.fp.write(pad)
            self.data_crc = crc.crc32(pad, self.data_crc)
            self.rel = at

        def checksum(data: Any) -> None:
            # CRC first: it faults a mapped source's pages in from user space, in batches,
            # which makes the write after it ~1.5x faster than faulting inside write().
            self.data_crc = crc.crc32(data, self.data_crc)

        got = copy_stream(
            self.fp, parts("data"), info.nbytes, where=info.name, code=EMBD_BOUNDS, update=checksum
        )
        self.rel += got
        self.next += 1

    def finish(self) -> dict[str, Any]:
        size = self.layout.data_size
        file_crc = crc.crc32_combine(self.prefix_crc, self.data_crc, size)
        self.fp.write(Footer(self.data_crc, file_crc, END_MAGIC, 0).to_bytes())
        return {"bytes": self.layout.total, "data_checksum": f"0x{self.data_crc:08x}"}

    def notes(self) -> list[str]:
        return list(self._notes)


TENSOR_IO = {FORMAT: (EmbdSource, EmbdSink)}
