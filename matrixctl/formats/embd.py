"""EMBD `.weights`: model weights and vocabulary for small native runtimes (embd-weights-v1.md).

Byte layout as matrixctl reads and writes it (integers little-endian; every decision where the
spec is silent or ambiguous is in docs/formats/embd.md, each pinned by a test):

    0      64   header: magic "EMBD", version 1.0, flags, section offsets (absolute, u32) and
                sizes, tensor_index_count, tensor_data_offset (u32), tensor_data_size (u64),
                total_file_size (u64), header_checksum = CRC-32 of bytes 0..55, reserved
    64          metadata: entry_count u32, total_size u32 (bytes of the entries after these 8),
                entries {key_length u16, value_length u16, key, value} (UTF-8 text)
    8-aligned   vocabulary: token_count u32, total_size u32 (bytes of the token entries),
                special_tokens u32 (ABSOLUTE offset of five u32 ids: pad unk cls sep mask,
                0xFFFFFFFF = none), then the ids (writer: right after this 12-byte header),
                then token_count entries {length u16, UTF-8 bytes}, id = position
    8-aligned   tensor index: tensor_index_count descriptors of 32 bytes {name_hash u32
                (FNV-1a 32 of the UTF-8 name), dtype u8, ndim u8 (1-4), name_length u16,
                shape[4] u32 (0 past ndim), data_offset u64 (relative to tensor_data_offset)},
                then the names, concatenated in descriptor order
    64-aligned  tensor data: each tensor at a multiple of 64 (absolute, TENSORS_ALIGNED),
                zero padding between; tensor_data_size ends at the last tensor's last byte
    EOF - 16    footer: data_checksum (CRC-32 of the tensor data section, padding included),
                file_checksum (CRC-32 of bytes 0 .. footer-1), "DBME", reserved

`parse` reads everything structural and records each problem (with its rule) instead of
stopping; `matrixctl.validate.embd` turns them into findings. `EmbdSource` and `EmbdSink` plug
EMBD into `convert`. Vocabularies travel between containers as file metadata under the GGUF
key names (`tokenizer.ggml.tokens` and the five special-token ids).
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from matrixctl import codes, crc
from matrixctl.codes import Severity
from matrixctl.errors import FormatError, UsageError
from matrixctl.tensors import (
    DTYPES,
    Outputs,
    PartStreams,
    TensorInfo,
    TensorSink,
    TensorSource,
    drop_pages,
    element_count,
    mapped_chunks,
    storage_array,
)

if TYPE_CHECKING:
    from matrixctl.io import Source

FORMAT = "embd"
MAGIC = b"EMBD"
END_MAGIC = b"DBME"
HEADER = struct.Struct("<4sHHIIIIIIIIQQII")
FOOTER = struct.Struct("<II4sI")
DESCRIPTOR = struct.Struct("<IBBHIIIIQ")
HEADER_SIZE = HEADER.size  # 64
FOOTER_SIZE = FOOTER.size  # 16
DESCRIPTOR_SIZE = DESCRIPTOR.size  # 32
CRC_SPAN = 56  # header_checksum covers bytes 0..55
VERSION_MAJOR = 1
VERSION_MINOR = 0
ALIGNMENT = 64
SECTION_ALIGN = 8
U16_MAX = 0xFFFF
U32_MAX = 0xFFFFFFFF

FLAG_VOCAB_EMBEDDED = 1 << 0
FLAG_TENSORS_ALIGNED = 1 << 1
FLAG_CHECKSUM_ENABLED = 1 << 2
FLAG_COMPRESSED = 1 << 3
FLAG_NAMES = {
    FLAG_VOCAB_EMBEDDED: "VOCAB_EMBEDDED",
    FLAG_TENSORS_ALIGNED: "TENSORS_ALIGNED",
    FLAG_CHECKSUM_ENABLED: "CHECKSUM_ENABLED",
    FLAG_COMPRESSED: "COMPRESSED",
}
KNOWN_FLAGS = 0xF

# The spec's dtype enum, as zTensor dtype names.
DTYPE_CODES: dict[int, str] = {
    0: "f32",
    1: "f16",
    2: "bf16",
    3: "i32",
    4: "i16",
    5: "i8",
    6: "u32",
    7: "u16",
    8: "u8",
}
DTYPE_IDS = {name: code for code, name in DTYPE_CODES.items()}
MAX_RANK = 4

REQUIRED_KEYS = (
    "model_name",
    "model_version",
    "embedding_dim",
    "vocab_size",
    "num_layers",
    "num_attention_heads",
    "hidden_size",
    "intermediate_size",
    "max_position_emb",
    "created_at",
)
INTEGER_KEYS = (
    "embedding_dim",
    "vocab_size",
    "num_layers",
    "num_attention_heads",
    "hidden_size",
    "intermediate_size",
    "max_position_emb",
)
CREATED_AT = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})")
EPOCH_TEXT = "1970-01-01T00:00:00Z"
DEFAULT_VERSION = "0.0.0"

SPECIALS = ("pad", "unk", "cls", "sep", "mask")
NO_TOKEN = U32_MAX  # a special token the vocabulary does not have
SPECIAL_BLOCK = 4 * len(SPECIALS)  # 20
VOCAB_HEAD = 12
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

MAX_TENSORS = 1 << 20
MAX_TOKENS = 1 << 24
MAX_ENTRIES = 1 << 20

FNV_OFFSET = 0x811C9DC5
FNV_PRIME = 0x01000193

G = FORMAT
EMBD_TRUNCATED = codes.define(
    "EMBD_TRUNCATED", "The file is shorter than the 64-byte header and 16-byte footer.", group=G
)
EMBD_VERSION = codes.define(
    "EMBD_VERSION", "version_major is not 1: the layout is unknown and nothing is read.", group=G
)
EMBD_VERSION_NEWER = codes.define(
    "EMBD_VERSION_NEWER",
    "version_minor is above 0: read as 1.0, fields a newer minor adds are ignored.",
    group=G,
    severity=Severity.WARNING,
)
EMBD_HEADER_CRC = codes.define(
    "EMBD_HEADER_CRC", "header_checksum is not the CRC-32 of header bytes 0..55.", group=G
)
EMBD_FLAGS = codes.define(
    "EMBD_FLAGS",
    "flags has bits 4-31 set, or VOCAB_EMBEDDED disagrees with the vocabulary offset and size.",
    group=G,
)
EMBD_COMPRESSED = codes.define(
    "EMBD_COMPRESSED",
    "The COMPRESSED flag is set: the spec reserves it and defines no compression.",
    group=G,
)
EMBD_RESERVED = codes.define(
    "EMBD_RESERVED",
    "A reserved field (header byte 60, footer byte 12) is not 0.",
    group=G,
    severity=Severity.WARNING,
)
EMBD_FILE_SIZE = codes.define(
    "EMBD_FILE_SIZE", "total_file_size differs from the file's length.", group=G
)
EMBD_FOOTER = codes.define(
    "EMBD_FOOTER",
    "The footer's end magic is not DBME, or the footer is not where tensor_data_offset + "
    "tensor_data_size puts it.",
    group=G,
)
EMBD_SECTION = codes.define(
    "EMBD_SECTION",
    "A section lies outside the file body (before byte 64, past the footer or EOF) or "
    "overlaps another section.",
    group=G,
)
EMBD_META = codes.define(
    "EMBD_META",
    "The metadata section is malformed: sizes that disagree, an entry running past the section, "
    "a duplicate or empty key.",
    group=G,
)
EMBD_META_MISSING = codes.define(
    "EMBD_META_MISSING", "A required metadata key is missing.", group=G
)
EMBD_META_VALUE = codes.define(
    "EMBD_META_VALUE",
    "A metadata value has the wrong form: not a decimal integer where one is required, or "
    "created_at not an ISO 8601 date-time.",
    group=G,
)
EMBD_VOCAB = codes.define(
    "EMBD_VOCAB",
    "The vocabulary section is malformed: a token count larger than the section can hold, "
    "sizes that disagree, a token running past the section.",
    group=G,
)
EMBD_SPECIAL = codes.define(
    "EMBD_SPECIAL",
    "special_tokens points neither right after the vocabulary header nor right after the "
    "tokens, or a special-token id is not a token id.",
    group=G,
)
EMBD_VOCAB_DUPLICATE = codes.define(
    "EMBD_VOCAB_DUPLICATE",
    "A token string appears twice: a tokenizer can never produce one of the two ids.",
    group=G,
    severity=Severity.WARNING,
)
EMBD_UTF8 = codes.define(
    "EMBD_UTF8", "A key, value, token or tensor name is not valid UTF-8.", group=G
)
EMBD_INDEX = codes.define(
    "EMBD_INDEX",
    "The tensor index is malformed: a count larger than the file can hold, a dtype outside the "
    "enum, ndim outside 1-4, a non-zero unused dimension, an empty name.",
    group=G,
)
EMBD_NAME_HASH = codes.define(
    "EMBD_NAME_HASH", "A descriptor's name_hash is not the FNV-1a hash of its name.", group=G
)
EMBD_DUPLICATE_NAME = codes.define(
    "EMBD_DUPLICATE_NAME", "Two descriptors have the same tensor name.", group=G
)
EMBD_BOUNDS = codes.define(
    "EMBD_BOUNDS", "A tensor's data runs past the end of the tensor data section.", group=G
)
EMBD_ALIGN = codes.define(
    "EMBD_ALIGN",
    "TENSORS_ALIGNED is set but a tensor (or the tensor data section) does not start at a "
    "multiple of 64.",
    group=G,
)
EMBD_OVERLAP = codes.define("EMBD_OVERLAP", "Two tensors share bytes.", group=G)
EMBD_PADDING = codes.define(
    "EMBD_PADDING", "A padding byte (between sections or tensors) is not 0x00.", group=G
)
EMBD_GAP = codes.define(
    "EMBD_GAP",
    "64 or more bytes between sections or tensors belong to nothing (unreferenced data).",
    group=G,
    severity=Severity.WARNING,
)
EMBD_DATA_CRC = codes.define(
    "EMBD_DATA_CRC", "data_checksum is not the CRC-32 of the tensor data section.", group=G
)
EMBD_FILE_CRC = codes.define(
    "EMBD_FILE_CRC", "file_checksum is not the CRC-32 of every byte before the footer.", group=G
)
EMBD_NO_CHECKSUM = codes.define(
    "EMBD_NO_CHECKSUM",
    "CHECKSUM_ENABLED is clear: damage to the file cannot be detected.",
    group=G,
    severity=Severity.INFO,
)
EMBD_MODEL = codes.define(
    "EMBD_MODEL",
    "The metadata disagrees with the vocabulary or the tensors (vocab_size vs token_count or "
    "the word embedding rows, hidden_size, num_layers, heads, a BERT tensor missing or of the "
    "wrong shape).",
    group=G,
)


def fnv1a_32(data: bytes) -> int:
    """FNV-1a, 32 bits: offset basis 2166136261, prime 16777619, over the bytes given."""
    h = FNV_OFFSET
    for b in data:
        h = ((h ^ b) * FNV_PRIME) & U32_MAX
    return h


def align(n: int, to: int) -> int:
    return n + (-n) % to


# Structures ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Header:
    version_major: int
    version_minor: int
    flags: int
    metadata_offset: int
    metadata_size: int
    vocab_offset: int
    vocab_size: int
    tensor_index_offset: int
    tensor_index_count: int
    tensor_data_offset: int
    tensor_data_size: int
    total_file_size: int
    header_checksum: int = 0
    reserved: int = 0

    @classmethod
    def parse(cls, raw: bytes) -> Header:
        fields = HEADER.unpack(raw[:HEADER_SIZE])
        return cls(*fields[1:])

    def body(self) -> bytes:
        """Bytes 0..55: what header_checksum covers."""
        return HEADER.pack(MAGIC, *self._fields()[:-2], 0, 0)[:CRC_SPAN]

    def _fields(self) -> tuple[int, ...]:
        return (
            self.version_major,
            self.version_minor,
            self.flags,
            self.metadata_offset,
            self.metadata_size,
            self.vocab_offset,
            self.vocab_size,
            self.tensor_index_offset,
            self.tensor_index_count,
            self.tensor_data_offset,
            self.tensor_data_size,
            self.total_file_size,
            self.header_checksum,
            self.reserved,
        )

    def pack(self) -> bytes:
        """The 64 header bytes with header_checksum computed over bytes 0..55."""
        body = self.body()
        return body + struct.pack("<II", crc.crc32(body), self.reserved)

    @property
    def footer_offset(self) -> int:
        return self.tensor_data_offset + self.tensor_data_size

    def flag_names(self) -> list[str]:
        names = [name for bit, name in FLAG_NAMES.items() if self.flags & bit]
        unknown = self.flags & ~KNOWN_FLAGS
        if unknown:
            names.append(f"unknown 0x{unknown:08x}")
        return names


@dataclass(frozen=True)
class Footer:
    data_checksum: int
    file_checksum: int
    magic: bytes
    reserved: int

    @classmethod
    def parse(cls, raw: bytes) -> Footer:
        return cls(*FOOTER.unpack(raw))

    def pack(self) -> bytes:
        return FOOTER.pack(self.data_checksum, self.file_checksum, self.magic, self.reserved)


@dataclass(frozen=True)
class Problem:
    rule: str  # which validation rule reports it
    code: str
    message: str
    offset: int | None = None
    field: str | None = None


@dataclass
class EmbdTensor:
    index: int  # descriptor position
    name: str
    name_hash: int
    dtype_code: int
    ndim: int
    dims: tuple[int, int, int, int]
    data_offset: int  # relative to tensor_data_offset
    desc_offset: int  # absolute offset of the descriptor
    name_offset: int  # absolute offset of the name
    data_start: int = 0  # tensor_data_offset

    @property
    def dtype(self) -> str | None:
        return DTYPE_CODES.get(self.dtype_code)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.dims[: self.ndim])

    @property
    def nbytes(self) -> int:
        d = self.dtype
        return element_count(self.shape) * DTYPES[d].itemsize if d else 0

    @property
    def offset(self) -> int:
        """Absolute offset of the data."""
        return self.data_start + self.data_offset

    @property
    def end(self) -> int:
        return self.offset + self.nbytes

    @property
    def field(self) -> str:
        return f"tensor[{self.index}]"


@dataclass
class EmbdFile:
    size: int
    header: Header
    footer: Footer | None = None
    metadata: list[tuple[str, str]] = field(default_factory=list)
    metadata_ok: bool = False
    tokens: list[str] | None = None
    token_offsets: list[int] = field(default_factory=list)
    special: dict[str, int] | None = None
    special_offset: int | None = None
    tensors: list[EmbdTensor] = field(default_factory=list)
    index_end: int | None = None
    sound: set[int] = field(default_factory=set)  # descriptors whose data can be read
    sections: list[tuple[str, int, int]] = field(default_factory=list)  # in bounds
    problems: list[Problem] = field(default_factory=list)

    @property
    def meta(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for key, value in self.metadata:
            out.setdefault(key, value)
        return out

    def readable(self) -> list[EmbdTensor]:
        """Tensors whose bytes can be read as declared, in data order."""
        return sorted(
            (t for t in self.tensors if t.index in self.sound), key=lambda t: (t.offset, t.index)
        )

    def add(self, rule: str, code: str, message: str, offset: int | None, field: str) -> None:
        self.problems.append(Problem(rule, code, message, offset, field))


# Rules that problems are reported under (validate/embd.py registers one rule per name).
R_HEADER = "header and footer"
R_SECTIONS = "section bounds and overlaps"
R_META = "metadata section"
R_VOCAB = "vocabulary section"
R_INDEX = "tensor index: descriptors, names, hashes"
R_DATA = "tensor data: bounds, alignment, overlaps"


def parse(buf: Any, size: int) -> EmbdFile:
    """Every structure of the file, bounds-checked; problems are recorded, not raised, except
    when nothing at all can be read (shorter than a header, another major version)."""
    if size < HEADER_SIZE:
        raise FormatError(
            EMBD_TRUNCATED,
            f"file is {size} bytes, the header alone needs {HEADER_SIZE}",
            offset=size,
            field="header",
        )
    head = bytes(buf[:HEADER_SIZE])
    h = Header.parse(head)
    if h.version_major != VERSION_MAJOR:
        raise FormatError(
            EMBD_VERSION,
            f"version {h.version_major}.{h.version_minor}: this reader knows EMBD 1.x only",
            offset=4,
            field="version_major",
        )
    f = EmbdFile(size, h)
    _check_header(f, buf, head)
    body_end = _check_footer(f, buf)
    _check_sections(f, body_end)
    _parse_metadata(f, buf, body_end)
    _parse_vocab(f, buf, body_end)
    _parse_index(f, buf, body_end)
    _check_section_overlaps(f)
    _check_data(f, body_end)
    return f


def _check_header(f: EmbdFile, buf: Any, head: bytes) -> None:
    h = f.header
    if h.version_minor > VERSION_MINOR:
        f.add(
            R_HEADER,
            EMBD_VERSION_NEWER,
            f"version 1.{h.version_minor} is newer than 1.0: read as 1.0",
            6,
            "version_minor",
        )
    if h.flags & FLAG_CHECKSUM_ENABLED:
        want = crc.crc32(head[:CRC_SPAN])
        if want != h.header_checksum:
            f.add(
                R_HEADER,
                EMBD_HEADER_CRC,
                f"header_checksum is 0x{h.header_checksum:08x}, the CRC-32 of bytes 0..55 is "
                f"0x{want:08x}",
                56,
                "header_checksum",
            )
    if h.flags & ~KNOWN_FLAGS:
        f.add(
            R_HEADER,
            EMBD_FLAGS,
            f"flags 0x{h.flags:08x} set bits 4-31, which the spec reserves (must be 0)",
            8,
            "flags",
        )
    if h.flags & FLAG_COMPRESSED:
        f.add(
            R_HEADER,
            EMBD_COMPRESSED,
            "COMPRESSED is set, but the spec defines no compression: the data cannot be read",
            8,
            "flags",
        )
    if h.reserved:
        f.add(R_HEADER, EMBD_RESERVED, f"reserved is 0x{h.reserved:08x}", 60, "reserved")
    if h.total_file_size != f.size:
        f.add(
            R_HEADER,
            EMBD_FILE_SIZE,
            f"total_file_size is {h.total_file_size:,}, the file has {f.size:,} bytes"
            + (" (truncated?)" if f.size < h.total_file_size else ""),
            48,
            "total_file_size",
        )


def _check_footer(f: EmbdFile, buf: Any) -> int:
    """Read the footer at EOF - 16; return where the file's body ends (the footer's offset)."""
    h = f.header
    if f.size < HEADER_SIZE + FOOTER_SIZE:
        f.add(
            R_HEADER,
            EMBD_TRUNCATED,
            f"file is {f.size} bytes: no room for the 16-byte footer after the header",
            f.size,
            "footer",
        )
        return f.size
    at = f.size - FOOTER_SIZE
    f.footer = Footer.parse(bytes(buf[at : f.size]))
    if f.footer.magic != END_MAGIC:
        f.add(
            R_HEADER,
            EMBD_FOOTER,
            f"the last 16 bytes end with {f.footer.magic!r}, not b'DBME': truncated or not "
            "finished",
            at + 8,
            "magic_end",
        )
    if f.footer.reserved:
        f.add(
            R_HEADER,
            EMBD_RESERVED,
            f"footer reserved is 0x{f.footer.reserved:08x}",
            at + 12,
            "footer.reserved",
        )
    if h.footer_offset != at:
        f.add(
            R_HEADER,
            EMBD_FOOTER,
            f"tensor_data_offset + tensor_data_size = {h.footer_offset:,}, but the footer is at "
            f"{at:,} (EOF - 16)",
            40,
            "tensor_data_size",
        )
    return at


def _in_body(f: EmbdFile, name: str, start: int, length: int, body_end: int, where: str) -> bool:
    end = start + length
    if start < HEADER_SIZE or end > body_end:
        f.add(
            R_SECTIONS,
            EMBD_SECTION,
            f"{name} section [{start:,}, {end:,}) lies outside the file body [{HEADER_SIZE}, "
            f"{body_end:,})" + (" (past EOF)" if end > f.size else ""),
            _field_offset(where),
            where,
        )
        return False
    return True


def _field_offset(name: str) -> int:
    return {
        "metadata_offset": 12,
        "vocab_offset": 20,
        "tensor_index_offset": 28,
        "tensor_data_offset": 36,
    }.get(name, 0)


def _check_sections(f: EmbdFile, body_end: int) -> None:
    h = f.header
    if _in_body(f, "metadata", h.metadata_offset, h.metadata_size, body_end, "metadata_offset"):
        f.sections.append(("metadata", h.metadata_offset, h.metadata_offset + h.metadata_size))
    vocab_flag = bool(h.flags & FLAG_VOCAB_EMBEDDED)
    if not vocab_flag and (h.vocab_offset or h.vocab_size):
        f.add(
            R_HEADER,
            EMBD_FLAGS,
            f"VOCAB_EMBEDDED is clear but vocab_offset/vocab_size are {h.vocab_offset}/"
            f"{h.vocab_size} (both must be 0 without a vocabulary)",
            8,
            "flags",
        )
    elif vocab_flag and _in_body(
        f, "vocabulary", h.vocab_offset, h.vocab_size, body_end, "vocab_offset"
    ):
        f.sections.append(("vocabulary", h.vocab_offset, h.vocab_offset + h.vocab_size))
    if _in_body(
        f, "tensor data", h.tensor_data_offset, h.tensor_data_size, body_end, "tensor_data_offset"
    ):
        f.sections.append(
            ("tensor data", h.tensor_data_offset, h.tensor_data_offset + h.tensor_data_size)
        )
    if h.flags & FLAG_TENSORS_ALIGNED and h.tensor_data_offset % ALIGNMENT:
        f.add(
            R_DATA,
            EMBD_ALIGN,
            f"tensor_data_offset {h.tensor_data_offset:,} is not a multiple of {ALIGNMENT}",
            36,
            "tensor_data_offset",
        )


def _section(f: EmbdFile, name: str) -> tuple[int, int] | None:
    for n, start, end in f.sections:
        if n == name:
            return start, end
    return None


def _text(f: EmbdFile, rule: str, raw: bytes, offset: int, where: str, what: str) -> str | None:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        f.add(rule, EMBD_UTF8, f"{what} is not UTF-8 ({exc.reason})", offset + exc.start, where)
        return None


def _parse_metadata(f: EmbdFile, buf: Any, body_end: int) -> None:
    sec = _section(f, "metadata")
    if sec is None:
        return
    start, end = sec
    if end - start < 8:
        f.add(
            R_META,
            EMBD_META,
            f"metadata_size {end - start} is smaller than the 8-byte metadata header",
            16,
            "metadata_size",
        )
        return
    raw = bytes(buf[start:end])
    count, total = struct.unpack_from("<II", raw, 0)
    if 8 + total != len(raw):
        f.add(
            R_META,
            EMBD_META,
            f"total_size {total:,} + 8 differs from metadata_size {len(raw):,}",
            start + 4,
            "metadata.total_size",
        )
    room = len(raw) - 8
    if count > MAX_ENTRIES or count * 4 > room:
        f.add(
            R_META,
            EMBD_META,
            f"entry_count {count:,} needs at least {count * 4:,} bytes, the section has "
            f"{room:,} after its header",
            start,
            "metadata.entry_count",
        )
        return
    pos = 8
    seen: set[str] = set()
    ok = True
    for i in range(count):
        where = f"metadata[{i}]"
        if pos + 4 > len(raw):
            f.add(R_META, EMBD_META, f"entry {i} runs past the section", start + pos, where)
            return
        klen, vlen = struct.unpack_from("<HH", raw, pos)
        if pos + 4 + klen + vlen > len(raw):
            f.add(
                R_META,
                EMBD_META,
                f"entry {i} ({klen}-byte key, {vlen}-byte value) runs past the section",
                start + pos,
                where,
            )
            return
        key = _text(f, R_META, raw[pos + 4 : pos + 4 + klen], start + pos + 4, where, "key")
        value = _text(
            f,
            R_META,
            raw[pos + 4 + klen : pos + 4 + klen + vlen],
            start + pos + 4 + klen,
            where,
            f"value of {key!r}",
        )
        if key is None or value is None:
            ok = False
        elif not key:
            f.add(R_META, EMBD_META, f"entry {i} has an empty key", start + pos, where)
            ok = False
        elif key in seen:
            f.add(R_META, EMBD_META, f"key {key!r} appears twice", start + pos, where)
            ok = False
        else:
            seen.add(key)
            f.metadata.append((key, value))
        pos += 4 + klen + vlen
    if pos != len(raw) and 8 + total == len(raw):
        f.add(
            R_META,
            EMBD_META,
            f"the {count} entries take {pos - 8:,} bytes, total_size says {total:,}",
            start + 4,
            "metadata.total_size",
        )
        ok = False
    f.metadata_ok = ok


def _parse_vocab(f: EmbdFile, buf: Any, body_end: int) -> None:
    sec = _section(f, "vocabulary")
    if sec is None:
        return
    start, end = sec
    if end - start < VOCAB_HEAD + SPECIAL_BLOCK:
        f.add(
            R_VOCAB,
            EMBD_VOCAB,
            f"vocab_size {end - start} is smaller than the 12-byte vocabulary header plus the "
            "20 bytes of special-token ids",
            24,
            "vocab_size",
        )
        return
    raw = bytes(buf[start:end])
    count, total, special = struct.unpack_from("<III", raw, 0)
    if VOCAB_HEAD + SPECIAL_BLOCK + total != len(raw):
        f.add(
            R_VOCAB,
            EMBD_VOCAB,
            f"total_size {total:,} + 32 (header and special ids) differs from vocab_size "
            f"{len(raw):,}",
            start + 4,
            "vocab.total_size",
        )
        total = min(total, len(raw) - VOCAB_HEAD - SPECIAL_BLOCK)
    before, after = start + VOCAB_HEAD, start + VOCAB_HEAD + total
    if special == before:
        tokens_at = VOCAB_HEAD + SPECIAL_BLOCK
    elif special == after:
        tokens_at = VOCAB_HEAD
    else:
        hint = ""
        if special in (VOCAB_HEAD, VOCAB_HEAD + total):
            hint = (
                "; it looks relative to the vocabulary section, but offsets are absolute "
                f"(spec assumption 4): {start + special:,} was expected"
            )
        f.add(
            R_VOCAB,
            EMBD_SPECIAL,
            f"special_tokens is {special:,}; the ids must start right after the vocabulary "
            f"header ({before:,}) or right after the tokens ({after:,}){hint}",
            start + 8,
            "vocab.special_tokens",
        )
        return
    f.special_offset = special
    ids = struct.unpack_from("<5I", raw, special - start)
    if count > MAX_TOKENS or count * 2 > total:
        f.add(
            R_VOCAB,
            EMBD_VOCAB,
            f"token_count {count:,} needs at least {count * 2:,} bytes, the token data has "
            f"{total:,}",
            start,
            "vocab.token_count",
        )
        return
    # First the entry positions (a tight loop: each length gives the next position), then
    # the texts in one comprehension; a decoding error sends us to the slow path that names
    # the token.
    starts: list[int] = []
    pos = tokens_at
    stop = tokens_at + total
    for i in range(count):
        if pos + 2 > stop:
            f.add(
                R_VOCAB,
                EMBD_VOCAB,
                f"token {i} runs past the token data",
                start + pos,
                f"token[{i}]",
            )
            return
        end = pos + 2 + (raw[pos] | raw[pos + 1] << 8)
        if end > stop:
            f.add(
                R_VOCAB,
                EMBD_VOCAB,
                f"token {i} ({end - pos - 2} bytes) runs past the token data",
                start + pos,
                f"token[{i}]",
            )
            return
        starts.append(pos)
        pos = end
    ends = [*starts[1:], pos] if starts else []
    bad_utf8 = False
    try:
        tokens = [raw[a + 2 : b].decode("utf-8") for a, b in zip(starts, ends, strict=True)]
    except UnicodeDecodeError:
        bad_utf8 = True
        tokens = []
        for i, (a, b) in enumerate(zip(starts, ends, strict=True)):
            try:
                tokens.append(raw[a + 2 : b].decode("utf-8"))
            except UnicodeDecodeError as exc:
                if len(tokens) == i and not any(p.code == EMBD_UTF8 for p in f.problems):
                    f.add(
                        R_VOCAB,
                        EMBD_UTF8,
                        f"token {i} is not UTF-8 ({exc.reason})",
                        start + a + 2 + exc.start,
                        f"token[{i}]",
                    )
                tokens.append(raw[a + 2 : b].decode("utf-8", "replace"))
    offsets = [start + a for a in starts]
    if pos != stop:
        f.add(
            R_VOCAB,
            EMBD_VOCAB,
            f"the {count:,} tokens take {pos - tokens_at:,} bytes, total_size says {total:,}",
            start + 4,
            "vocab.total_size",
        )
    f.tokens = tokens
    f.token_offsets = offsets
    f.special = dict(zip(SPECIALS, ids, strict=True))
    for i, (name, value) in enumerate(f.special.items()):
        if value != NO_TOKEN and value >= count:
            f.add(
                R_VOCAB,
                EMBD_SPECIAL,
                f"{name}_id is {value:,}, not a token id (the vocabulary has {count:,})",
                special + 4 * i,
                f"{name}_id",
            )
    if bad_utf8 or len(set(tokens)) == len(tokens):
        return
    seen: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        first = seen.setdefault(tok, i)
        if first != i:
            f.add(
                R_VOCAB,
                EMBD_VOCAB_DUPLICATE,
                f"token {i} {tok!r} repeats token {first}",
                offsets[i],
                f"token[{i}]",
            )
            break


def _parse_index(f: EmbdFile, buf: Any, body_end: int) -> None:
    h = f.header
    start, count = h.tensor_index_offset, h.tensor_index_count
    if count > MAX_TENSORS or not _in_body(
        f, "tensor index", start, count * DESCRIPTOR_SIZE, body_end, "tensor_index_offset"
    ):
        if count > MAX_TENSORS:
            f.add(
                R_SECTIONS,
                EMBD_INDEX,
                f"tensor_index_count {count:,} is above the {MAX_TENSORS:,} limit",
                32,
                "tensor_index_count",
            )
        return
    raw = bytes(buf[start : start + count * DESCRIPTOR_SIZE])
    descs = [DESCRIPTOR.unpack_from(raw, i * DESCRIPTOR_SIZE) for i in range(count)]
    names_at = start + count * DESCRIPTOR_SIZE
    names_len = sum(d[3] for d in descs)
    if names_at + names_len > body_end:
        f.add(
            R_SECTIONS,
            EMBD_SECTION,
            f"the {count} tensor names ({names_len:,} bytes from {names_at:,}) run past the "
            f"file body (ends at {body_end:,})",
            start,
            "tensor_index_offset",
        )
        return
    f.index_end = names_at + names_len
    f.sections.append(("tensor index", start, f.index_end))
    names = bytes(buf[names_at : names_at + names_len])
    pos = 0
    seen: dict[str, int] = {}
    for i, (name_hash, dtype, ndim, nlen, d0, d1, d2, d3, data_offset) in enumerate(descs):
        at = start + i * DESCRIPTOR_SIZE
        where = f"tensor[{i}]"
        raw_name = names[pos : pos + nlen]
        name_offset = names_at + pos
        pos += nlen
        name = _text(f, R_INDEX, raw_name, name_offset, f"{where}.name", f"tensor {i}'s name")
        ok = name is not None
        label = repr(name) if name is not None else f"tensor {i}"
        if nlen == 0:
            f.add(
                R_INDEX, EMBD_INDEX, f"tensor {i} has an empty name", at + 6, f"{where}.name_length"
            )
            ok = False
        if dtype not in DTYPE_CODES:
            f.add(
                R_INDEX,
                EMBD_INDEX,
                f"{label}: dtype {dtype} is not in the spec's enum (0-8)",
                at + 4,
                f"{where}.dtype",
            )
            ok = False
        dims = (d0, d1, d2, d3)
        if not 1 <= ndim <= MAX_RANK:
            f.add(
                R_INDEX,
                EMBD_INDEX,
                f"{label}: ndim {ndim} is outside 1-4",
                at + 5,
                f"{where}.ndim",
            )
            ok = False
        elif any(dims[ndim:]):
            f.add(
                R_INDEX,
                EMBD_INDEX,
                f"{label}: ndim is {ndim} but shape is {list(dims)} (dimensions past ndim must "
                "be 0)",
                at + 8 + 4 * ndim,
                f"{where}.shape",
            )
            ok = False
        if name is not None:
            want = fnv1a_32(raw_name)
            if want != name_hash:
                f.add(
                    R_INDEX,
                    EMBD_NAME_HASH,
                    f"{label}: name_hash is 0x{name_hash:08x}, FNV-1a of the name is 0x{want:08x}",
                    at,
                    f"{where}.name_hash",
                )
            first = seen.setdefault(name, i)
            if first != i:
                f.add(
                    R_INDEX,
                    EMBD_DUPLICATE_NAME,
                    f"{label} is the name of tensors {first} and {i}",
                    name_offset,
                    f"{where}.name",
                )
                ok = False
        t = EmbdTensor(
            i,
            name if name is not None else raw_name.decode("utf-8", "replace"),
            name_hash,
            dtype,
            min(ndim, MAX_RANK),
            dims,
            data_offset,
            at,
            name_offset,
            h.tensor_data_offset,
        )
        f.tensors.append(t)
        if ok:
            f.sound.add(i)


def _check_section_overlaps(f: EmbdFile) -> None:
    spans = sorted([("header", 0, HEADER_SIZE), *f.sections], key=lambda s: (s[1], s[2]))
    owner, reach = spans[0][0], spans[0][2]
    for name, start, end in spans[1:]:
        if start < reach and end > start:
            f.add(
                R_SECTIONS,
                EMBD_SECTION,
                f"the {name} section [{start:,}, {end:,}) overlaps the {owner} section (ends "
                f"at {reach:,})",
                start,
                name.replace(" ", "_"),
            )
        if end > reach:
            owner, reach = name, end


def _check_data(f: EmbdFile, body_end: int) -> None:
    h = f.header
    size = h.tensor_data_size
    aligned = bool(h.flags & FLAG_TENSORS_ALIGNED)
    data_ok = _section(f, "tensor data") is not None
    for t in f.tensors:
        if t.index not in f.sound:
            continue
        if t.data_offset + t.nbytes > size:
            f.add(
                R_DATA,
                EMBD_BOUNDS,
                f"{t.name!r}: data [{t.data_offset:,}, {t.data_offset + t.nbytes:,}) runs past "
                f"tensor_data_size {size:,}",
                t.desc_offset + 24,
                f"{t.field}.data_offset",
            )
            f.sound.discard(t.index)
            continue
        if not data_ok or t.end > body_end:
            f.sound.discard(t.index)
            continue
        if aligned and t.offset % ALIGNMENT:
            f.add(
                R_DATA,
                EMBD_ALIGN,
                f"{t.name!r} starts at {t.offset:,}, not a multiple of {ALIGNMENT} "
                "(TENSORS_ALIGNED is set)",
                t.desc_offset + 24,
                f"{t.field}.data_offset",
            )
    prev: EmbdTensor | None = None
    for t in f.readable():
        if t.nbytes == 0:
            continue
        if prev is not None and t.offset < prev.end:
            f.add(
                R_DATA,
                EMBD_OVERLAP,
                f"{t.name!r} [{t.offset:,}, {t.end:,}) overlaps {prev.name!r} (ends at "
                f"{prev.end:,})",
                t.desc_offset + 24,
                f"{t.field}.data_offset",
            )
        if prev is None or t.end > prev.end:
            prev = t


def gaps(f: EmbdFile) -> list[tuple[int, int]]:
    """Byte ranges of the file body that belong to no section and no tensor: padding."""
    used = [(0, HEADER_SIZE)]
    for name, start, end in f.sections:
        if name != "tensor data":
            used.append((start, end))
    data = _section(f, "tensor data")
    if data is not None:
        used.extend((t.offset, t.end) for t in f.readable())
    body_end = f.header.footer_offset if data is not None else f.size
    used.sort()
    out = []
    pos = 0
    for start, end in used:
        if start > pos:
            out.append((pos, start))
        pos = max(pos, end)
    if pos < body_end:
        out.append((pos, body_end))
    return out


def checksums(buf: Any, f: EmbdFile) -> tuple[int, int] | None:
    """(data CRC, file CRC) computed in one pass over the file, mapped pages dropped as they
    go; None when the sections needed are out of bounds."""
    h = f.header
    end = h.footer_offset
    if _section(f, "tensor data") is None or end != f.size - FOOTER_SIZE:
        return None
    prefix = crc_range(buf, 0, h.tensor_data_offset)
    data = crc_range(buf, h.tensor_data_offset, end)
    return data, crc.crc32_combine(prefix, data, end - h.tensor_data_offset)


def crc_range(buf: Any, start: int, end: int, chunk: int = 8 << 20) -> int:
    value = 0
    with memoryview(buf) as view:
        for pos in range(start, end, chunk):
            stop = min(pos + chunk, end)
            value = crc.crc32(view[pos:stop], value)
            drop_pages(buf, pos, stop - pos)
    return value


# Model metadata -----------------------------------------------------------------------------


def created_at_now() -> str | None:
    """created_at from SOURCE_DATE_EPOCH, or None when it is not set."""
    from matrixctl.epoch import source_date_text

    return source_date_text()


def _int(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() else None


def check_metadata(meta: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """(code, key, message) for every missing required key and malformed value."""
    out = []
    for key in REQUIRED_KEYS:
        if key not in meta:
            out.append((EMBD_META_MISSING, key, f"required key {key!r} is missing"))
    for key in INTEGER_KEYS:
        if key in meta and _int(meta[key]) is None:
            out.append((EMBD_META_VALUE, key, f"{key} is {meta[key]!r:.40}, not a decimal integer"))
    if "created_at" in meta and not CREATED_AT.fullmatch(meta["created_at"]):
        out.append(
            (
                EMBD_META_VALUE,
                "created_at",
                f"created_at {meta['created_at']!r:.40} is not an ISO 8601 date-time "
                "(YYYY-MM-DDTHH:MM:SSZ)",
            )
        )
    return out


def layer_indices(names: list[str]) -> set[int]:
    out = set()
    for name in names:
        m = re.match(r"encoder\.layer\.(\d+)\.", name)
        if m:
            out.add(int(m.group(1)))
    return out


def bert_shapes(meta: Mapping[str, str]) -> dict[str, tuple[int, ...]] | None:
    """The tensors (name -> shape) the spec lists for a BERT encoder with this metadata, or
    None when a number needed is missing."""
    vals = {k: _int(meta.get(k, "")) for k in INTEGER_KEYS}
    v, hid, inter, pos, layers = (
        vals["vocab_size"],
        vals["hidden_size"],
        vals["intermediate_size"],
        vals["max_position_emb"],
        vals["num_layers"],
    )
    if v is None or hid is None or inter is None or pos is None or layers is None:
        return None
    shapes: dict[str, tuple[int, ...]] = {
        "embeddings.word_embeddings.weight": (v, hid),
        "embeddings.position_embeddings.weight": (pos, hid),
        "embeddings.LayerNorm.weight": (hid,),
        "embeddings.LayerNorm.bias": (hid,),
    }
    for n in range(layers):
        p = f"encoder.layer.{n}"
        for part in ("query", "key", "value"):
            shapes[f"{p}.attention.self.{part}.weight"] = (hid, hid)
            shapes[f"{p}.attention.self.{part}.bias"] = (hid,)
        shapes[f"{p}.attention.output.dense.weight"] = (hid, hid)
        shapes[f"{p}.attention.output.dense.bias"] = (hid,)
        shapes[f"{p}.attention.output.LayerNorm.weight"] = (hid,)
        shapes[f"{p}.attention.output.LayerNorm.bias"] = (hid,)
        shapes[f"{p}.intermediate.dense.weight"] = (inter, hid)
        shapes[f"{p}.intermediate.dense.bias"] = (inter,)
        shapes[f"{p}.output.dense.weight"] = (hid, inter)
        shapes[f"{p}.output.dense.bias"] = (hid,)
        shapes[f"{p}.output.LayerNorm.weight"] = (hid,)
        shapes[f"{p}.output.LayerNorm.bias"] = (hid,)
    return shapes


def model_problems(
    meta: Mapping[str, str], token_count: int | None, shapes: Mapping[str, tuple[int, ...]]
) -> list[tuple[str, str]]:
    """(field, message) for every disagreement between the metadata, the vocabulary and the
    tensors. The BERT checks run when the file has `embeddings.word_embeddings.weight`."""
    out: list[tuple[str, str]] = []
    vals = {k: _int(meta.get(k, "")) for k in INTEGER_KEYS}
    vocab = vals["vocab_size"]
    if vocab is not None and token_count is not None and token_count > vocab:
        out.append(
            (
                "vocab_size",
                f"the vocabulary has {token_count:,} tokens but vocab_size is {vocab:,}: ids "
                "past vocab_size have no embedding",
            )
        )
    heads, hid = vals["num_attention_heads"], vals["hidden_size"]
    if heads is not None and hid is not None and (heads == 0 or hid % heads):
        out.append(
            (
                "num_attention_heads",
                f"hidden_size {hid} is not a multiple of num_attention_heads {heads}",
            )
        )
    if "embeddings.word_embeddings.weight" not in shapes:
        return out
    want = bert_shapes(meta)
    if want is None:
        return out
    for name, shape in want.items():
        got = shapes.get(name)
        if got is None:
            out.append((name, f"BERT tensor {name!r} is missing"))
        elif tuple(got) != shape:
            out.append((name, f"{name!r} has shape {list(got)}, the metadata gives {list(shape)}"))
    tt = shapes.get("embeddings.token_type_embeddings.weight")
    if hid is not None and tt is not None and (len(tt) != 2 or tt[1] != hid):
        out.append(
            (
                "embeddings.token_type_embeddings.weight",
                f"'embeddings.token_type_embeddings.weight' has shape {list(tt)}, expected "
                f"[types, {hid}]",
            )
        )
    layers = vals["num_layers"] or 0
    extra = sorted(n for n in layer_indices(list(shapes)) if n >= layers)
    if extra:
        out.append(
            (
                "num_layers",
                f"num_layers is {layers} but the file has encoder.layer.{extra[0]}: a runtime "
                "would skip it",
            )
        )
    if hid is not None:
        pooler = {"pooler.dense.weight": (hid, hid), "pooler.dense.bias": (hid,)}
        for name, shape in pooler.items():
            got = shapes.get(name)
            if got is not None and tuple(got) != shape:
                out.append((name, f"{name!r} has shape {list(got)}, expected {list(shape)}"))
    return out


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
    file checksums are checked before anything is handed out (one CRC pass, pages dropped)."""

    format = FORMAT

    def __init__(self, src: Source, checked: Any) -> None:
        self.src = src
        self.embd: EmbdFile = checked.embd
        f = self.embd
        if f.header.flags & FLAG_CHECKSUM_ENABLED and f.footer is not None:
            sums = checksums(src.buf, f)
            if sums is not None:
                data, whole = sums
                if data != f.footer.data_checksum:
                    raise FormatError(
                        EMBD_DATA_CRC,
                        f"data_checksum is 0x{f.footer.data_checksum:08x}, the tensor data's "
                        f"CRC-32 is 0x{data:08x}",
                        path=src.name,
                        offset=f.size - FOOTER_SIZE,
                        field="data_checksum",
                    )
                if whole != f.footer.file_checksum:
                    raise FormatError(
                        EMBD_FILE_CRC,
                        f"file_checksum is 0x{f.footer.file_checksum:08x}, the CRC-32 of bytes "
                        f"0..{f.size - FOOTER_SIZE - 1} is 0x{whole:08x}",
                        path=src.name,
                        offset=f.size - FOOTER_SIZE + 4,
                        field="file_checksum",
                    )
        self._by_name = {t.name: t for t in f.tensors}

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
        return mapped_chunks(self.src.buf, t.offset, t.nbytes)

    def array(self, info: TensorInfo, role: str = "data", *, verify: bool = True) -> Any:
        """Zero-copy view of the tensor's bytes in the mapped file (checksums were checked
        when the source was opened)."""
        t = self._by_name[info.name]
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
            number = value if isinstance(value, int) else _int(str(value))
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


@dataclass
class Layout:
    metadata: tuple[int, bytes]
    vocab: tuple[int, bytes] | None
    index: tuple[int, bytes]
    data_offset: int
    offsets: list[int]  # relative
    data_size: int

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
        prefix = bytearray(header.pack())
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
        got = 0
        for piece in parts("data"):
            # CRC first: it faults a mapped source's pages in from user space, in batches,
            # which makes the write after it ~1.5x faster than faulting inside write().
            self.data_crc = crc.crc32(piece, self.data_crc)
            self.fp.write(piece)
            got += memoryview(piece).nbytes
        if got != info.nbytes:
            raise FormatError(
                EMBD_BOUNDS,
                f"{info.name}: {got:,} bytes arrived, shape and dtype give {info.nbytes:,}",
                field=info.name,
            )
        self.rel += got
        self.next += 1

    def finish(self) -> dict[str, Any]:
        size = self.layout.data_size
        file_crc = crc.crc32_combine(self.prefix_crc, self.data_crc, size)
        self.fp.write(Footer(self.data_crc, file_crc, END_MAGIC, 0).pack())
        return {"bytes": self.layout.total, "data_checksum": f"0x{self.data_crc:08x}"}

    def notes(self) -> list[str]:
        return list(self._notes)


TENSOR_IO = {FORMAT: (EmbdSource, EmbdSink)}
