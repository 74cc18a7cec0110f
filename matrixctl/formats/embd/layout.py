"""EMBD layout: constants, the stable codes and the parsed structures (`EmbdFile`)."""

from __future__ import annotations

import struct

from matrixctl import codes, crc
from matrixctl.codes import Severity
from matrixctl.findings import Problem
from matrixctl.records import FrozenRecord, Record
from matrixctl.tensors import DTYPES, element_count

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

SPECIALS = ("pad", "unk", "cls", "sep", "mask")
NO_TOKEN = U32_MAX  # a special token the vocabulary does not have
SPECIAL_BLOCK = 4 * len(SPECIALS)  # 20
VOCAB_HEAD = 12

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


class Header(FrozenRecord):
    __slots__ = (
        "flags",
        "header_checksum",
        "metadata_offset",
        "metadata_size",
        "reserved",
        "tensor_data_offset",
        "tensor_data_size",
        "tensor_index_count",
        "tensor_index_offset",
        "total_file_size",
        "version_major",
        "version_minor",
        "vocab_offset",
        "vocab_size",
    )
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
    header_checksum: int
    reserved: int

    def __init__(
        self,
        version_major: int,
        version_minor: int,
        flags: int,
        metadata_offset: int,
        metadata_size: int,
        vocab_offset: int,
        vocab_size: int,
        tensor_index_offset: int,
        tensor_index_count: int,
        tensor_data_offset: int,
        tensor_data_size: int,
        total_file_size: int,
        header_checksum: int = 0,
        reserved: int = 0,
    ) -> None:
        self._init(
            version_major,
            version_minor,
            flags,
            metadata_offset,
            metadata_size,
            vocab_offset,
            vocab_size,
            tensor_index_offset,
            tensor_index_count,
            tensor_data_offset,
            tensor_data_size,
            total_file_size,
            header_checksum,
            reserved,
        )

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

    def to_bytes(self) -> bytes:
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


class Footer(FrozenRecord):
    __slots__ = ("data_checksum", "file_checksum", "magic", "reserved")
    data_checksum: int
    file_checksum: int
    magic: bytes
    reserved: int

    def __init__(self, data_checksum: int, file_checksum: int, magic: bytes, reserved: int) -> None:
        self._init(data_checksum, file_checksum, magic, reserved)

    @classmethod
    def parse(cls, raw: bytes) -> Footer:
        return cls(*FOOTER.unpack(raw))

    def to_bytes(self) -> bytes:
        return FOOTER.pack(self.data_checksum, self.file_checksum, self.magic, self.reserved)


class EmbdTensor(Record):
    __slots__ = (
        "data_offset",
        "data_start",
        "desc_offset",
        "dims",
        "dtype_code",
        "index",
        "name",
        "name_hash",
        "name_offset",
        "ndim",
    )

    def __init__(
        self,
        index: int,
        name: str,
        name_hash: int,
        dtype_code: int,
        ndim: int,
        dims: tuple[int, int, int, int],
        data_offset: int,
        desc_offset: int,
        name_offset: int,
        data_start: int = 0,
    ) -> None:
        self.index = index  # descriptor position
        self.name = name
        self.name_hash = name_hash
        self.dtype_code = dtype_code
        self.ndim = ndim
        self.dims = dims
        self.data_offset = data_offset  # relative to tensor_data_offset
        self.desc_offset = desc_offset  # absolute offset of the descriptor
        self.name_offset = name_offset  # absolute offset of the name
        self.data_start = data_start  # tensor_data_offset

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


class EmbdFile(Record):
    """A parsed file: `sound` holds the descriptors whose data can be read, `sections` the
    sections (name, start, end) that lie in bounds."""

    __slots__ = (
        "footer",
        "header",
        "index_end",
        "metadata",
        "metadata_ok",
        "problems",
        "sections",
        "size",
        "sound",
        "special",
        "special_offset",
        "tensors",
        "token_offsets",
        "tokens",
    )

    def __init__(
        self,
        size: int,
        header: Header,
        footer: Footer | None = None,
        metadata: list[tuple[str, str]] | None = None,
        metadata_ok: bool = False,
        tokens: list[str] | None = None,
        token_offsets: list[int] | None = None,
        special: dict[str, int] | None = None,
        special_offset: int | None = None,
        tensors: list[EmbdTensor] | None = None,
        index_end: int | None = None,
        sound: set[int] | None = None,
        sections: list[tuple[str, int, int]] | None = None,
        problems: list[Problem] | None = None,
    ) -> None:
        self.size = size
        self.header = header
        self.footer = footer
        self.metadata: list[tuple[str, str]] = [] if metadata is None else metadata
        self.metadata_ok = metadata_ok
        self.tokens = tokens
        self.token_offsets: list[int] = [] if token_offsets is None else token_offsets
        self.special = special
        self.special_offset = special_offset
        self.tensors: list[EmbdTensor] = [] if tensors is None else tensors
        self.index_end = index_end
        self.sound: set[int] = set() if sound is None else sound
        self.sections: list[tuple[str, int, int]] = [] if sections is None else sections
        self.problems: list[Problem] = [] if problems is None else problems

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
        self.problems.append(Problem(code, message, offset, field, rule))


# Rules that problems are reported under (validate/embd.py registers one rule per name).
R_HEADER = "header and footer"
R_SECTIONS = "section bounds and overlaps"
R_META = "metadata section"
R_VOCAB = "vocabulary section"
R_INDEX = "tensor index: descriptors, names, hashes"
R_DATA = "tensor data: bounds, alignment, overlaps"
