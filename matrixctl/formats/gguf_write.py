"""GGUF as a `convert` destination: a streaming, deterministic GGUF v3 writer of our own.

Layout written (docs/formats/gguf.md, "Writing"): magic `GGUF`, version 3, tensor and metadata
counts, the metadata pairs in the order they arrive (typed as below), one tensor info per
tensor (dims innermost first, the ggml type, the offset in the data section), zero padding to
the alignment (`general.alignment`, 32 when absent), then each tensor's bytes at a multiple of
the alignment with zero padding between. The header is written by `begin` (every size is known
from the plan), the data streams in `add`.

Tensor types: F32, F16, BF16, F64, I8-I64 as they are; `--quantize q8_0` stores floating
tensors of rank >= 2 whose rows are whole 32-element blocks as Q8_0, quantized here (ggml's
reference rounding: d = max|x| / 127 as f16, q = round-half-away(x / d)); raw ggml blocks
(GGUF `--keep-quantized`, zTensor 2 `gguf.<type>/1`) are written verbatim under their type.

Metadata types: `--meta KEY:TYPE=VALUE` states one (u8 i8 u16 i16 u32 i32 u64 i64 f32 f64 bool
str); otherwise bool -> BOOL, int -> UINT32 (INT32 when negative, 64-bit beyond 32), float ->
FLOAT32 when exact else FLOAT64, text -> STRING, lists of those -> ARRAY of the widest item
type (`tokenizer.ggml.token_type` -> INT32 as llama.cpp writes it); maps and mixed lists are
stored as their JSON text with a note.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterator, Mapping
from typing import Any

from matrixctl import codes
from matrixctl.errors import FormatError, UsageError
from matrixctl.formats.gguf import GgufSource
from matrixctl.formats.gguf_constants import (
    ALIGNMENT_KEY,
    ARCHITECTURE_KEY,
    DEFAULT_ALIGNMENT,
    MAGIC,
    QUANTIZATION_VERSION_KEY,
    TOKEN_TYPE,
)
from matrixctl.tensors import (
    DTYPES,
    Outputs,
    PartStreams,
    TensorInfo,
    TensorSink,
    copy_stream,
)

FORMAT = "gguf"
VERSION = 3
QK8_0 = 32
Q8_0_BYTES = 34
Q8_0_ID = 8
# matrixctl dtype -> ggml type id (plain types only)
GGML_PLAIN = {"f32": 0, "f16": 1, "bf16": 30, "f64": 28, "i8": 24, "i16": 25, "i32": 26, "i64": 27}
FLOATS = frozenset({"f32", "f16", "bf16", "f64"})
QUANTIZE = ("q8_0",)

# GGUF metadata value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
TYPE_NAMES = {
    "u8": U8, "i8": I8, "u16": U16, "i16": I16, "u32": U32, "i32": I32, "f32": F32,
    "bool": BOOL, "str": STRING, "u64": U64, "i64": I64, "f64": F64,
}  # fmt: skip
_PACK = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
         U64: "<Q", I64: "<q", F64: "<d", BOOL: "<?"}  # fmt: skip
INT32_ARRAYS = frozenset({TOKEN_TYPE})

GGUF_WRITE = codes.define(
    "GGUF_WRITE",
    "A value cannot be written to GGUF: a typed --meta value that does not parse or fit its "
    "type, a general.alignment that is not a uint32 power of two, or bytes streamed that "
    "disagree with the tensor's shape.",
    group="gguf",
)

GGUF_QUANTIZE = codes.define(
    "GGUF_QUANTIZE",
    "--quantize q8_0 refused a tensor whose values Q8_0 cannot hold: NaN or infinity (the "
    "whole 32-value block would become NaN) or magnitudes above about 8.3e6 (the block's "
    "float16 scale would be infinite); nothing was written.",
    group="gguf",
)


def _string(text: str | bytes) -> bytes:
    raw = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    return struct.pack("<Q", len(raw)) + raw


def _exact_f32(x: float) -> bool:
    if math.isnan(x) or math.isinf(x):
        return True
    try:
        return bool(struct.unpack("<f", struct.pack("<f", x))[0] == x)
    except OverflowError:
        return False


def _int_type(values: list[int]) -> int:
    lo, hi = min(values, default=0), max(values, default=0)
    if lo >= 0:
        return U32 if hi < 1 << 32 else U64
    return I32 if lo >= -(1 << 31) and hi < 1 << 31 else I64


def infer(key: str, value: Any) -> tuple[int, Any, int | None] | None:
    """(value type, value, item type for arrays) for a metadata value; None when it has no
    GGUF form (a map, a mixed or nested list, null): the caller stores JSON text."""
    if isinstance(value, bool):
        return BOOL, value, None
    if isinstance(value, int):
        return _int_type([value]), value, None
    if isinstance(value, float):
        return (F32 if _exact_f32(value) else F64), value, None
    if isinstance(value, str | bytes):
        return STRING, value, None
    if isinstance(value, list | tuple):
        items = list(value)
        if all(isinstance(i, str | bytes) for i in items) and items:
            return ARRAY, items, STRING
        if all(isinstance(i, bool) for i in items) and items:
            return ARRAY, items, BOOL
        if all(isinstance(i, int) and not isinstance(i, bool) for i in items):
            kind = I32 if key in INT32_ARRAYS else _int_type(items)
            if kind == I32 and items and (min(items) < -(1 << 31) or max(items) >= 1 << 31):
                kind = _int_type(items)
            return ARRAY, items, kind
        if all(isinstance(i, int | float) and not isinstance(i, bool) for i in items):
            floats = [float(i) for i in items]
            return ARRAY, floats, (F32 if all(_exact_f32(x) for x in floats) else F64)
    return None


def typed(key: str, kind: str, text: str) -> tuple[int, Any, None]:
    """`--meta KEY:TYPE=VALUE`."""
    vtype = TYPE_NAMES.get(kind)
    if vtype is None:
        raise UsageError(
            f"--meta {key}:{kind}: unknown GGUF type {kind!r} (one of {', '.join(TYPE_NAMES)})"
        )
    try:
        if vtype == STRING:
            return STRING, text, None
        if vtype == BOOL:
            if text.lower() not in ("true", "false", "1", "0"):
                raise ValueError(text)
            return BOOL, text.lower() in ("true", "1"), None
        value: Any = float(text) if vtype in (F32, F64) else int(text, 0)
        struct.pack(_PACK[vtype], value)
    except (ValueError, struct.error, OverflowError):
        raise UsageError(f"--meta {key}:{kind}={text!r}: not a valid {kind}") from None
    return vtype, value, None


def _alignment(vtype: int, value: Any, from_option: bool) -> int:
    """The value of `general.alignment` to write: a uint32 power of two, as the spec (and this
    project's `verify`) requires. A decimal text (an untyped `--meta`, or metadata that went
    through a format that keeps text only) is read as that number."""
    where = "--meta general.alignment" if from_option else "the input's general.alignment"
    if vtype == STRING and isinstance(value, str) and value.strip().isdecimal():
        vtype, value = U32, int(value.strip())
    kind = next((k for k, t in TYPE_NAMES.items() if t == vtype), "?")
    if vtype != U32 or isinstance(value, bool) or not isinstance(value, int):
        why = f"{where} is {value!r} ({kind}): GGUF requires a uint32 power of two"
    elif not 0 < value < 1 << 32 or value & (value - 1):
        why = f"{where} is {value}: GGUF requires a uint32 power of two (1, 2, 4, ... 2^31)"
    else:
        return int(value)
    hint = "--meta general.alignment:u32=64 (or leave it out: 32, GGUF's default)"
    if from_option:
        raise UsageError(why, code=GGUF_WRITE, hint=hint)
    raise FormatError(GGUF_WRITE, why, field=ALIGNMENT_KEY, hint=hint)


ZERO_CHUNK = 1 << 20


def _zeros(fp: Any, count: int) -> None:
    """`count` zero bytes, at most 1 MiB in memory (an alignment may be up to 2^31)."""
    chunk = bytes(min(count, ZERO_CHUNK))
    while count > 0:
        n = min(count, ZERO_CHUNK)
        fp.write(chunk if n == len(chunk) else chunk[:n])
        count -= n


def encode_value(vtype: int, value: Any, item: int | None) -> bytes:
    if vtype == STRING:
        return _string(value)
    if vtype == ARRAY:
        assert item is not None
        head = struct.pack("<IQ", item, len(value))
        if item == STRING:
            return head + b"".join(_string(v) for v in value)
        import numpy as np

        fmt = {U8: "<u1", I8: "<i1", U16: "<u2", I16: "<i2", U32: "<u4", I32: "<i4",
               F32: "<f4", U64: "<u8", I64: "<i8", F64: "<f8", BOOL: "|u1"}[item]  # fmt: skip
        return head + np.asarray(value, dtype=np.dtype(fmt)).tobytes()
    return struct.pack(_PACK[vtype], value)


# The largest block scale float16 holds is 65504, so a block whose largest magnitude is above
# about 65504 * 127 = 8.3e6 has no Q8_0 form: its scale would be stored as infinity.
Q8_0_MAX = 65504.0 * 127


def q8_0_refusal(values: Any) -> tuple[int, str] | None:
    """(index, why) of the first value of a 1-D f32 array that Q8_0 cannot hold, or None:
    NaN or infinity (its whole block would dequantize to NaN), or a block whose scale
    overflows float16 (the block would dequantize to infinity)."""
    import numpy as np

    x = np.asarray(values, dtype=np.float32).reshape(-1, QK8_0)
    finite = np.isfinite(x)
    if not finite.all():
        i = int(np.flatnonzero(~finite.reshape(-1))[0])
        return i, "is not finite"
    with np.errstate(over="ignore"):
        d16 = (np.abs(x).max(axis=1) / np.float32(127)).astype(np.float16)
    big = np.flatnonzero(~np.isfinite(d16))
    if big.size:
        row = int(big[0])
        i = row * QK8_0 + int(np.argmax(np.abs(x[row])))
        return i, f"is beyond Q8_0's range (|x| up to about {Q8_0_MAX:.3g})"
    return None


def q8_0(values: Any) -> bytes:
    """Q8_0 blocks of a 1-D f32 array whose length is a multiple of 32 (ggml's reference
    quantizer: d = amax / 127 stored as f16; q = roundf(x * (1 / d)), halves away from 0).
    The values must pass `q8_0_refusal` (finite, scales within float16)."""
    import numpy as np

    x = np.asarray(values, dtype=np.float32).reshape(-1, QK8_0)
    amax = np.abs(x).max(axis=1)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore", over="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    # A scale so small that its inverse overflows float32 is 0 as float16: every value of its
    # block dequantizes to 0, so its quants are 0 (ggml's reference casts infinity there).
    inv[~np.isfinite(inv)] = 0
    scaled = (x * inv[:, None]).astype(np.float64)
    q = (np.sign(scaled) * np.floor(np.abs(scaled) + 0.5)).astype(np.int8)
    out = np.empty((x.shape[0], Q8_0_BYTES), dtype=np.uint8)
    out[:, :2] = d.astype("<f2").view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q.view(np.uint8)
    return out.tobytes()


def _to_f32(piece: Any, dtype: str) -> Any:
    import numpy as np

    raw = np.frombuffer(memoryview(piece).cast("B"), dtype=np.dtype(DTYPES[dtype].storage))
    if dtype == "bf16":
        return (raw.astype(np.uint32) << 16).view(np.float32)
    # An f64 beyond f32 becomes inf, refused by q8_0_refusal; a signalling NaN warns "invalid".
    with np.errstate(over="ignore", invalid="ignore"):
        return raw.astype(np.float32)


class GgufSink(TensorSink):
    """`convert ... out.gguf`: see the module docstring."""

    format = FORMAT
    dtypes = frozenset(GGML_PLAIN) | {"u8"}
    layouts = frozenset({"dense", "quantized_group"})
    keeps_metadata = True
    accepts = ("quantize",)

    def refuse(self, info: TensorInfo) -> str | None:
        if info.layout == "quantized_group":
            return None if self._ggml(info) else "only raw ggml blocks have a GGUF type"
        if info.dtype not in GGML_PLAIN:
            return f"GGUF has no tensor type for {info.dtype}"
        if not 1 <= len(info.shape) <= 4:
            return f"GGUF tensors have 1 to 4 dimensions, this one has {len(info.shape)}"
        return None

    @staticmethod
    def _ggml(info: TensorInfo) -> Any:
        a = info.attributes
        if a.get("quantization") != "ggml" or not 1 <= len(info.shape) <= 4:
            return None
        from matrixctl.formats.gguf import GGML_BY_NAME

        g = GGML_BY_NAME.get(str(a.get("ggml_type")))
        if g is None or (a.get("block_size"), a.get("type_size")) != (g.block_size, g.type_size):
            return None
        return g if info.shape[-1] % g.block_size == 0 else None

    def _plan(self, info: TensorInfo) -> tuple[int, int, bool]:
        """(ggml type id, stored bytes, quantize here)."""
        if info.layout == "quantized_group":
            g = self._ggml(info)
            return g.id, info.count // g.block_size * g.type_size, False
        quant = self.options.get("quantize")
        if (
            quant == "q8_0"
            and info.dtype in FLOATS
            and len(info.shape) >= 2
            and info.shape[-1] % QK8_0 == 0
        ):
            return Q8_0_ID, info.count // QK8_0 * Q8_0_BYTES, True
        return GGML_PLAIN[info.dtype], info.nbytes, False

    def begin(self, out: Outputs, plan: list[TensorInfo], metadata: Mapping[str, Any]) -> None:
        quant = self.options.get("quantize")
        if quant is not None and quant not in QUANTIZE:
            raise UsageError(f"--quantize must be one of {', '.join(QUANTIZE)}, got {quant!r}")
        self._notes: list[str] = []
        self.fp = out.main
        pairs: list[tuple[str, int, Any, int | None]] = []
        as_json: list[str] = []
        seen: set[str] = set()
        for raw_key, value in metadata.items():
            key, sep, kind = str(raw_key).partition(":")
            if sep and isinstance(value, str) and raw_key in self.options.get("meta", {}):
                pairs.append((key, *typed(key, kind, value)))
            else:
                got = infer(key, value)
                if got is None:
                    if value is None:
                        self._notes.append(f"metadata {key} is null: left out")
                        continue
                    got = (STRING, json.dumps(value, sort_keys=True, ensure_ascii=False), None)
                    as_json.append(key)
                pairs.append((key, *got))
            seen.add(key)
        # a later pair of the same key (a --meta over the source's) wins, in its first place
        last = {k: (t, v, i) for k, t, v, i in pairs}
        ordered: list[tuple[str, int, Any, int | None]] = []
        for k, _, _, _ in pairs:
            if k in last:
                ordered.append((k, *last.pop(k)))
        quantized = [self._plan(i)[2] for i in plan]
        if any(quantized) and QUANTIZATION_VERSION_KEY not in seen:
            ordered.append((QUANTIZATION_VERSION_KEY, U32, 2, None))
        if as_json:
            self._notes.append(
                f"metadata {', '.join(as_json[:5])} has no GGUF type: stored as JSON text"
            )
        if ARCHITECTURE_KEY not in seen:
            self._notes.append(
                "no general.architecture: llama.cpp needs one to load the model "
                "(--meta general.architecture=NAME)"
            )
        align = DEFAULT_ALIGNMENT
        for i, (key, vtype, value, _item) in enumerate(ordered):
            if key == ALIGNMENT_KEY:
                by_option = any(
                    str(k).partition(":")[0] == key for k in self.options.get("meta", {})
                )
                align = _alignment(vtype, value, by_option)
                ordered[i] = (key, U32, align, None)
        self.alignment = align
        header = bytearray(MAGIC + struct.pack("<IQQ", VERSION, len(plan), len(ordered)))
        for key, vtype, value, item in ordered:
            header += _string(key) + struct.pack("<I", vtype) + encode_value(vtype, value, item)
        self.layout: dict[str, tuple[int, int, bool]] = {}
        offset = 0
        for info in plan:
            gid, nbytes, quant_here = self._plan(info)
            dims = tuple(reversed(info.shape))
            header += _string(info.name) + struct.pack("<I", len(dims))
            header += struct.pack(f"<{len(dims)}Q", *dims)
            header += struct.pack("<IQ", gid, offset)
            self.layout[info.name] = (offset, nbytes, quant_here)
            offset += -(-nbytes // align) * align
        self.fp.write(header)
        _zeros(self.fp, -len(header) % align)
        self.data_start = len(header)
        self.pos = 0
        self.count = 0
        self.quantized = sum(quantized)

    def add(self, info: TensorInfo, parts: PartStreams) -> None:
        offset, nbytes, quant_here = self.layout[info.name]
        if self.pos != offset:  # pragma: no cover - begin laid the tensors out in this order
            raise FormatError(GGUF_WRITE, f"{info.name}: out of order", field=info.name)
        role = "packed_weight" if info.layout == "quantized_group" else "data"
        got = 0
        if quant_here:
            got = self._write_q8_0(info, parts(role))
        else:
            got = copy_stream(self.fp, parts(role), nbytes, where=info.name, code=GGUF_WRITE)
        if got != nbytes:
            raise FormatError(
                GGUF_WRITE,
                f"{info.name}: {got:,} bytes written, the tensor needs {nbytes:,}",
                field=info.name,
            )
        pad = -nbytes % self.alignment
        _zeros(self.fp, pad)
        self.pos = offset + nbytes + pad
        self.count += 1

    def _write_q8_0(self, info: TensorInfo, stream: Iterator[Any]) -> int:
        import numpy as np

        rest = np.empty(0, dtype=np.float32)
        written = 0
        base = 0  # index of values[0] in the tensor
        for piece in stream:
            values = _to_f32(piece, info.dtype)
            if rest.size:
                values = np.concatenate([rest, values])
            whole = values.size - values.size % QK8_0
            if whole:
                bad = q8_0_refusal(values[:whole])
                if bad is not None:
                    i, why = bad
                    seen = " as float32" if info.dtype == "f64" else ""
                    raise FormatError(
                        GGUF_QUANTIZE,
                        f"tensor {info.name!r}: --quantize q8_0: the value at element "
                        f"{base + i:,} ({float(values[i])!r}{seen}) {why}; nothing was written",
                        field=f"{info.name}[{base + i}]",
                        hint=f"convert without --quantize, or leave it out: --exclude "
                        f"'{info.name}'",
                    )
                block = q8_0(values[:whole])
                base += whole
                self.fp.write(block)
                written += len(block)
            rest = values[whole:].copy()
        if rest.size:
            raise FormatError(
                GGUF_WRITE, f"{info.name}: {rest.size} values left over", field=info.name
            )
        return written

    def finish(self) -> dict[str, Any]:
        return {
            "bytes": self.data_start + self.pos,
            "alignment": self.alignment,
            "quantized": self.quantized,
        }

    def notes(self) -> list[str]:
        return list(self._notes)


TENSOR_IO = {FORMAT: (GgufSource, GgufSink)}
