"""GGUF's file-format facts apart from its parser, as gguf-py keeps them in `constants.py`:
the magic and versions, the metadata value types, the ggml tensor type table, and the names of
the metadata keys matrixctl reads or writes.

The parser (`matrixctl.formats.gguf`, which re-exports these names), the writer
(`matrixctl.formats.gguf_write`) and the handler (`matrixctl.validate.gguf`) share them. The
ggml type table (block size, bytes per block) is kept here so that `inspect` never needs the
`gguf` package (its import alone costs ~0.25 s); a test checks it against
`gguf.constants.GGML_QUANT_SIZES`, and a type id this table lacks is looked up there.
"""

from __future__ import annotations

from dataclasses import dataclass

MAGIC = b"GGUF"
VERSIONS = (2, 3)
HEADER_SIZE = 24
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS: llama.cpp refuses more
MAX_NAME = 63  # GGML_MAX_NAME is 64 with the terminating NUL
MAX_KEY = (1 << 16) - 1  # the spec: a key is at most 2**16 - 1 bytes

# Metadata value types.
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY = range(10)
UINT64, INT64, FLOAT64 = 10, 11, 12
TYPE_NAMES = {
    UINT8: "uint8",
    INT8: "int8",
    UINT16: "uint16",
    INT16: "int16",
    UINT32: "uint32",
    INT32: "int32",
    FLOAT32: "float32",
    BOOL: "bool",
    STRING: "string",
    ARRAY: "array",
    UINT64: "uint64",
    INT64: "int64",
    FLOAT64: "float64",
}
# Fixed-size types: struct format (little-endian) and numpy dtype.
SCALARS: dict[int, tuple[str, str]] = {
    UINT8: ("<B", "|u1"),
    INT8: ("<b", "|i1"),
    UINT16: ("<H", "<u2"),
    INT16: ("<h", "<i2"),
    UINT32: ("<I", "<u4"),
    INT32: ("<i", "<i4"),
    FLOAT32: ("<f", "<f4"),
    BOOL: ("<B", "|u1"),
    UINT64: ("<Q", "<u8"),
    INT64: ("<q", "<i8"),
    FLOAT64: ("<d", "<f8"),
}
INTEGER_TYPES = frozenset({UINT8, INT8, UINT16, INT16, UINT32, INT32, UINT64, INT64})

# Metadata keys (gguf-py's `Keys`): the ones matrixctl reads or writes by name.
ALIGNMENT_KEY = "general.alignment"
ARCHITECTURE_KEY = "general.architecture"
NAME_KEY = "general.name"
QUANTIZATION_VERSION_KEY = "general.quantization_version"
TOKENIZER_MODEL = "tokenizer.ggml.model"
TOKENIZER_PRE = "tokenizer.ggml.pre"
TOKENS = "tokenizer.ggml.tokens"
SCORES = "tokenizer.ggml.scores"
TOKEN_TYPE = "tokenizer.ggml.token_type"
MERGES = "tokenizer.ggml.merges"
TOKENIZER_PREFIX = "tokenizer.ggml."  # + a key of SPECIALS
# Special token ids (tokenizer.ggml.<key>): the spec's names, llama.cpp's spelling `seperator`,
# and the short names inspect shows them under.
SPECIALS = {
    "bos_token_id": "bos_id",
    "eos_token_id": "eos_id",
    "unknown_token_id": "unk_id",
    "separator_token_id": "sep_id",
    "seperator_token_id": "sep_id",
    "padding_token_id": "pad_id",
    "cls_token_id": "cls_id",
    "mask_token_id": "mask_id",
    "eot_token_id": "eot_id",
    "eom_token_id": "eom_id",
}
# tokenizer.ggml.token_type values (llama.cpp `llama_token_type`).
TOKEN_TYPES = {1: "normal", 2: "unknown", 3: "control", 4: "user_defined", 5: "unused", 6: "byte"}


@dataclass(frozen=True)
class GgmlType:
    """One ggml tensor type: `block_size` elements are stored in `type_size` bytes."""

    id: int
    name: str
    block_size: int
    type_size: int
    dtype: str | None = None  # the matrixctl dtype of a plain (not quantized) type

    @property
    def quantized(self) -> bool:
        return self.dtype is None


# ggml's types (ggml.h `enum ggml_type`, ggml.c type traits); ids 4, 5, 31-33, 36-38 are
# retired or unassigned.
GGML_TYPES: dict[int, GgmlType] = {
    t.id: t
    for t in (
        GgmlType(0, "F32", 1, 4, "f32"),
        GgmlType(1, "F16", 1, 2, "f16"),
        GgmlType(2, "Q4_0", 32, 18),
        GgmlType(3, "Q4_1", 32, 20),
        GgmlType(6, "Q5_0", 32, 22),
        GgmlType(7, "Q5_1", 32, 24),
        GgmlType(8, "Q8_0", 32, 34),
        GgmlType(9, "Q8_1", 32, 40),
        GgmlType(10, "Q2_K", 256, 84),
        GgmlType(11, "Q3_K", 256, 110),
        GgmlType(12, "Q4_K", 256, 144),
        GgmlType(13, "Q5_K", 256, 176),
        GgmlType(14, "Q6_K", 256, 210),
        GgmlType(15, "Q8_K", 256, 292),
        GgmlType(16, "IQ2_XXS", 256, 66),
        GgmlType(17, "IQ2_XS", 256, 74),
        GgmlType(18, "IQ3_XXS", 256, 98),
        GgmlType(19, "IQ1_S", 256, 50),
        GgmlType(20, "IQ4_NL", 32, 18),
        GgmlType(21, "IQ3_S", 256, 110),
        GgmlType(22, "IQ2_S", 256, 82),
        GgmlType(23, "IQ4_XS", 256, 136),
        GgmlType(24, "I8", 1, 1, "i8"),
        GgmlType(25, "I16", 1, 2, "i16"),
        GgmlType(26, "I32", 1, 4, "i32"),
        GgmlType(27, "I64", 1, 8, "i64"),
        GgmlType(28, "F64", 1, 8, "f64"),
        GgmlType(29, "IQ1_M", 256, 56),
        GgmlType(30, "BF16", 1, 2, "bf16"),
        GgmlType(34, "TQ1_0", 256, 54),
        GgmlType(35, "TQ2_0", 256, 66),
        GgmlType(39, "MXFP4", 32, 17),
        GgmlType(40, "NVFP4", 64, 36),
        GgmlType(41, "Q1_0", 128, 18),
    )
}
GGML_BY_NAME = {t.name: t for t in GGML_TYPES.values()}


def ggml_type(type_id: int) -> GgmlType | None:
    """The ggml type with this id: our table, else the installed `gguf` package's (newer types
    appear there first), else None."""
    known = GGML_TYPES.get(type_id)
    if known is not None or not 0 <= type_id < 1 << 16:
        return known
    try:
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    except ImportError:  # pragma: no cover - gguf is a dependency
        return None
    try:
        qtype = GGMLQuantizationType(type_id)
    except ValueError:
        return None
    sizes = GGML_QUANT_SIZES.get(qtype)
    if sizes is None:
        return None
    return GgmlType(type_id, qtype.name, sizes[0], sizes[1])
