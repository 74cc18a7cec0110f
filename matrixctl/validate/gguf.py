"""Load, describe and validate GGUF files (rules for `inspect` and `verify`).

Structural rules read the header, the metadata and the tensor table only (string arrays are
walked once by the parser; numeric arrays are not read): what the parser collected, tensor data
alignment, bounds, overlaps and layout, and the tokenizer metadata. The scan rules read bytes:
padding, strings that are not UTF-8, bool arrays and token types.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from matrixctl.findings import Finding, finding, findings_of
from matrixctl.formats import gguf
from matrixctl.formats.gguf_constants import (
    ARCHITECTURE_KEY,
    NAME_KEY,
    SCORES,
    SPECIALS,
    TOKEN_TYPE,
    TOKEN_TYPES,
    TOKENIZER_MODEL,
    TOKENIZER_PRE,
    TOKENIZER_PREFIX,
    TOKENS,
)
from matrixctl.io import Source
from matrixctl.tensors import human_bytes, tensor_row
from matrixctl.validate.engine import first_nonzero, rule, shown

FMT = gguf.FORMAT
PREVIEW = 6  # array items shown by inspect
STRING_PREVIEW = 160  # characters of a string value shown by inspect
SCAN_CHUNK = 8 << 20

SPECIAL_KEYS = tuple(SPECIALS)


class GgufSubject:
    def __init__(self, src: Source, gf: gguf.GgufFile) -> None:
        self.src = src
        self.gf = gf
        self.buf = src.buf

    def readable(self) -> list[gguf.GgufTensor]:
        """Tensors whose bytes can be located and sized: known type, valid shape, aligned
        offset, inside the file (the data rules report the others)."""
        gf = self.gf
        if not gf.alignment_ok:
            return []
        return [
            t
            for t in gf.tensors
            if t.nbytes is not None
            and t.rel_offset % gf.alignment == 0
            and t.offset + t.nbytes <= gf.size
        ]


def load(src: Source) -> GgufSubject:
    return GgufSubject(src, gguf.parse(src.buf, src.size))


def _value_text(s: GgufSubject, kv: gguf.GgufKV) -> Any:
    value = kv.value
    full = shown(PREVIEW) is None
    if isinstance(value, bytes):
        return gguf.show_bytes(value, None if full else STRING_PREVIEW)
    if isinstance(value, gguf.GgufArray):
        # The first PREVIEW real items; the row's `count` and `shown` say how many there are.
        head = value.head(s.buf, value.count if full else PREVIEW)
        if value.item_type == gguf.FLOAT32:
            head = [gguf.short_f32(v) for v in head]
        return [
            gguf.show_bytes(v, None if full else 40) if isinstance(v, bytes) else v for v in head
        ]
    if kv.vtype == gguf.BOOL:
        return bool(value) if value in (0, 1) else f"0x{value:02x} (invalid bool)"
    if kv.vtype == gguf.FLOAT32:
        return gguf.short_f32(value)
    return value


def describe(s: GgufSubject) -> dict[str, Any]:
    gf = s.gf
    out: dict[str, Any] = {
        "size": gf.size,
        "version": gf.version,
        "byte_order": "little-endian",
        "tensor_count": gf.tensor_count,
        "kv_count": gf.kv_count,
        "alignment": gf.alignment,
        "data_offset": gf.data_offset,
    }
    arch = gf.text(ARCHITECTURE_KEY)
    if arch is not None:
        out["architecture"] = gguf.neutral(arch, 80)
    name = gf.text(NAME_KEY)
    if name is not None:
        out["name"] = gguf.neutral(name, 80)
    tok = tokenizer_summary(s)
    if tok:
        out["tokenizer"] = tok
    rows = []
    for kv in gf.kvs.values():
        value = _value_text(s, kv)
        is_array = isinstance(kv.value, gguf.GgufArray)
        rows.append(
            {
                "key": gguf.neutral(kv.name, 120),
                "type": kv.type_name,
                "count": kv.value.count if isinstance(kv.value, gguf.GgufArray) else None,
                "shown": len(value) if is_array else None,
                "value": value,
            }
        )
    out["metadata"] = rows
    if gf.tensors:
        total = sum(t.nbytes or 0 for t in gf.tensors)
        out["tensor_bytes"] = human_bytes(total)
        types: dict[str, int] = {}
        for t in gf.tensors:
            types[t.type_name] = types.get(t.type_name, 0) + 1
        out["types"] = dict(sorted(types.items(), key=lambda kv: (-kv[1], kv[0])))
        out["tensors"] = [
            tensor_row(
                gguf.neutral(t.name, 120),
                (t.gtype.dtype or t.gtype.name) if t.gtype else None,
                t.shape,
                t.offset,
                t.nbytes,
                {"ggml_type": t.type_name},
            )
            for t in gf.tensors
        ]
    return out


def tokenizer_summary(s: GgufSubject) -> dict[str, Any]:
    gf = s.gf
    tokens = gf.get(TOKENS)
    out: dict[str, Any] = {}
    model = gf.text(TOKENIZER_MODEL)
    if model is not None:
        out["model"] = gguf.neutral(model, 40)
    pre = gf.text(TOKENIZER_PRE)
    if pre is not None:
        out["pre"] = gguf.neutral(pre, 40)
    if isinstance(tokens, gguf.GgufArray):
        out["tokens"] = tokens.count
        out["token_dtype"] = "uint16" if tokens.count <= 1 << 16 else "uint32"
    for key, short in SPECIALS.items():
        kv = gf.kvs.get(TOKENIZER_PREFIX + key)
        if kv is not None and kv.vtype in gguf.INTEGER_TYPES:
            out[short] = kv.value
            if (
                isinstance(tokens, gguf.GgufArray)
                and tokens.item_type == gguf.STRING
                and 0 <= kv.value < tokens.count
            ):
                text = tokens.string(s.buf, kv.value).decode("utf-8", "backslashreplace")
                out[short.removesuffix("_id") + "_token"] = gguf.neutral(text, 40)
    for key in ("add_bos_token", "add_eos_token", "add_space_prefix"):
        kv = gf.kvs.get(TOKENIZER_PREFIX + key)
        if kv is not None and kv.vtype == gguf.BOOL:
            out[key.removesuffix("_token")] = bool(kv.value)
    types = gf.get(TOKEN_TYPE)
    if isinstance(types, gguf.GgufArray) and types.item_type in gguf.INTEGER_TYPES:
        values = types.values(s.buf)  # no numpy: inspect of a GGUF starts fast
        for code, label in ((3, "control"), (4, "user_defined"), (6, "byte")):
            out[f"{label}_tokens"] = values.count(code)
    if model is not None:
        from matrixctl.tokenizers.model.load import family_of

        family, why = family_of(model, pre)
        out["family"] = family
        out["exact"] = why is None
        if why is not None:
            out["not_exact"] = gguf.neutral(why, 160)
    return out


# Structural rules ---------------------------------------------------------------------------


@rule(FMT, "header, metadata and tensor table")
def check_table(s: GgufSubject) -> Iterator[Finding]:
    yield from findings_of(s.gf.problems)


@rule(FMT, "file size", cause=True)
def check_size(s: GgufSubject) -> Iterator[Finding]:
    """A cut file: the tensors lie back to back in table order (so their sizes can be trusted:
    a single hostile offset is the data rule's GGUF_TENSOR_BOUNDS) and the file ends first."""
    gf = s.gf
    if not gf.alignment_ok or not gf.tensors:
        return
    pos = 0
    for t in gf.tensors:
        if t.nbytes is None or t.rel_offset != pos:
            return
        pos += -(-t.nbytes // gf.alignment) * gf.alignment
    last = gf.tensors[-1]
    assert last.nbytes is not None
    expected = gf.data_offset + last.rel_offset + last.nbytes
    if gf.size < expected:
        yield finding(
            gguf.GGUF_TRUNCATED,
            f"file is {gf.size:,} bytes; its {len(gf.tensors)} tensor(s) need {expected:,} "
            f"(cut at byte {gf.size:,})",
            offset=gf.size,
            field="data",
        )


@rule(FMT, "tensor data: alignment, bounds, overlaps, layout")
def check_data(s: GgufSubject) -> Iterator[Finding]:
    gf = s.gf
    if not gf.alignment_ok:
        return  # reported by the table rule: the data section cannot be located
    if gf.tensors and gf.data_offset > gf.size:
        yield finding(
            gguf.GGUF_TENSOR_BOUNDS,
            f"the data section would start at {gf.data_offset:,}, past the end of the "
            f"{gf.size:,}-byte file, but the file lists {len(gf.tensors)} tensor(s)",
            offset=gf.size,
            field="data",
        )
        return
    sized = [t for t in gf.tensors if t.nbytes is not None]
    for t in sized:
        assert t.nbytes is not None
        if t.rel_offset % gf.alignment:
            yield finding(
                gguf.GGUF_TENSOR_ALIGN,
                f"tensor {t.name!r:.60} starts at data offset {t.rel_offset:,}, not a multiple "
                f"of the alignment {gf.alignment}",
                offset=t.info_offset,
                field=f"{t.field}.offset",
            )
        if t.offset + t.nbytes > gf.size:
            yield finding(
                gguf.GGUF_TENSOR_BOUNDS,
                f"tensor {t.name!r:.60} ({t.type_name}, {t.nbytes:,} bytes) runs to "
                f"{t.offset + t.nbytes:,}, past the end of the {gf.size:,}-byte file",
                offset=t.info_offset,
                field=f"{t.field}.offset",
            )
    ok = [t for t in s.readable() if t.nbytes]
    prev: gguf.GgufTensor | None = None
    for t in sorted(ok, key=lambda t: (t.offset, t.end)):
        if prev is not None and t.offset < prev.end:
            yield finding(
                gguf.GGUF_TENSOR_OVERLAP,
                f"tensor {t.name!r:.60} (bytes {t.offset:,}..{t.end:,}) overlaps "
                f"{prev.name!r:.60} (bytes {prev.offset:,}..{prev.end:,})",
                offset=t.info_offset,
                field=f"{t.field}.offset",
            )
        if prev is None or t.end > prev.end:
            prev = t
    if len(sized) != len(gf.tensors):
        return  # the layout cannot be judged with a tensor of unknown size
    expected = 0
    for t in gf.tensors:
        assert t.nbytes is not None
        if t.rel_offset != expected:
            yield finding(
                gguf.GGUF_LAYOUT,
                f"tensor {t.name!r:.60} is at data offset {t.rel_offset:,}; stored back to back "
                f"in table order it would be at {expected:,} (llama.cpp refuses such a file)",
                offset=t.info_offset,
                field=f"{t.field}.offset",
            )
            break
        expected += -(-t.nbytes // gf.alignment) * gf.alignment
    else:
        end = gf.data_offset + expected
        if gf.tensors and gf.size > end:
            yield finding(
                gguf.GGUF_TRAILING,
                f"{gf.size - end:,} bytes after the last tensor's padding (from {end:,}) belong "
                "to no tensor",
                offset=end,
                field="data",
            )


@rule(FMT, "tokenizer metadata")
def check_tokenizer(s: GgufSubject) -> Iterator[Finding]:
    gf = s.gf
    tokens_kv = gf.kvs.get(TOKENS)
    if tokens_kv is None:
        return
    tokens = tokens_kv.value
    if not isinstance(tokens, gguf.GgufArray) or tokens.item_type != gguf.STRING:
        yield finding(
            gguf.GGUF_TOKENIZER,
            f"{TOKENS} is a {tokens_kv.type_name}, not an array of strings",
            offset=tokens_kv.offset,
            field=TOKENS,
        )
        return
    n = tokens.count
    for key, want in ((SCORES, gguf.FLOAT32), (TOKEN_TYPE, gguf.INT32)):
        kv = gf.kvs.get(key)
        if kv is None:
            continue
        value = kv.value
        if not isinstance(value, gguf.GgufArray) or value.item_type != want:
            yield finding(
                gguf.GGUF_TOKENIZER,
                f"{key} is a {kv.type_name}, not an array of {gguf.TYPE_NAMES[want]}",
                offset=kv.offset,
                field=key,
            )
        elif value.count != n:
            yield finding(
                gguf.GGUF_TOKENIZER,
                f"{key} has {value.count:,} items for {n:,} tokens",
                offset=kv.offset,
                field=key,
            )
    for key in SPECIAL_KEYS:
        kv = gf.kvs.get(TOKENIZER_PREFIX + key)
        if kv is None:
            continue
        if kv.vtype not in gguf.INTEGER_TYPES:
            yield finding(
                gguf.GGUF_TOKENIZER,
                f"{kv.name} is a {kv.type_name}, not an integer token id",
                offset=kv.offset,
                field=kv.name,
            )
        elif not 0 <= kv.value < n:
            yield finding(
                gguf.GGUF_TOKENIZER,
                f"{kv.name} is {kv.value:,}, outside the {n:,} tokens",
                offset=kv.value_offset,
                field=kv.name,
            )
    embd = next((t for t in gf.tensors if t.name == "token_embd.weight"), None)
    if embd is not None and len(embd.dims) == 2 and embd.dims[1] != n:
        yield finding(
            gguf.GGUF_VOCAB_EMBD,
            f"token_embd.weight has {embd.dims[1]:,} rows for {n:,} tokens",
            offset=embd.info_offset,
            field=embd.field,
        )


# Scan rules ---------------------------------------------------------------------------------


@rule(FMT, "padding bytes are zero", scan=True)
def check_padding(s: GgufSubject) -> Iterator[Finding]:
    gf = s.gf
    if not gf.alignment_ok:
        return
    spans = []
    if gf.tensors:
        spans.append((gf.info_end, min(gf.data_offset, gf.size)))
    ends = sorted((t.offset, t.end) for t in s.readable())
    for (_, end), (nxt, _) in itertools.pairwise(ends):
        if nxt > end:
            spans.append((end, nxt))
    if ends:
        last = ends[-1][1]
        spans.append(
            (
                last,
                min(
                    gf.size,
                    -(-(last - gf.data_offset) // gf.alignment) * gf.alignment + gf.data_offset,
                ),
            )
        )
    for start, stop in spans:
        first = first_nonzero(s.buf, start, stop, SCAN_CHUNK)
        if first is not None:
            yield finding(
                gguf.GGUF_PADDING,
                f"padding byte at {first:,} is 0x{s.buf[first]:02x} (padding {start:,}..{stop:,})",
                offset=first,
                field="padding",
            )


@rule(FMT, "strings are UTF-8", scan=True)
def check_utf8(s: GgufSubject) -> Iterator[Finding]:
    for kv in s.gf.kvs.values():
        value = kv.value
        if isinstance(value, bytes):
            try:
                value.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield finding(
                    gguf.GGUF_UTF8,
                    f"{gguf.neutral(kv.name, 80)}: the string is not UTF-8 at byte {exc.start} "
                    "(kept as raw bytes)",
                    offset=kv.value_offset + 8 + exc.start,
                    field=kv.name,
                )
        elif isinstance(value, gguf.GgufArray) and value.item_type == gguf.STRING:
            bad = 0
            first: tuple[int, int] | None = None
            for i, raw in enumerate(value.strings(s.buf)):
                if not raw.isascii():
                    try:
                        bytes(raw).decode("utf-8")
                    except UnicodeDecodeError:
                        bad += 1
                        if first is None:
                            assert value.starts is not None
                            first = (i, value.starts[i])
            if first is not None:
                yield finding(
                    gguf.GGUF_UTF8,
                    f"{gguf.neutral(kv.name, 80)}: {bad:,} of {value.count:,} strings are not "
                    f"UTF-8, first item {first[0]:,} (kept as raw bytes)",
                    offset=first[1],
                    field=f"{kv.name}[{first[0]}]",
                )


@rule(FMT, "bool arrays and token types hold valid values", scan=True)
def check_values(s: GgufSubject) -> Iterator[Finding]:
    import numpy as np

    for kv in s.gf.kvs.values():
        value = kv.value
        if not isinstance(value, gguf.GgufArray):
            continue
        if value.item_type == gguf.BOOL and value.count:
            bad = np.flatnonzero(value.numpy(s.buf) > 1)
            if bad.size:
                i = int(bad[0])
                yield finding(
                    gguf.GGUF_BOOL,
                    f"{gguf.neutral(kv.name, 80)}: item {i:,} is not 0 or 1 ({bad.size:,} such)",
                    offset=value.offset + i,
                    field=f"{kv.name}[{i}]",
                )
        if kv.name == TOKEN_TYPE and value.item_type == gguf.INT32 and value.count:
            types = value.numpy(s.buf)
            bad = np.flatnonzero((types < 1) | (types > 6))
            if bad.size:
                i = int(bad[0])
                yield finding(
                    gguf.GGUF_TOKENIZER,
                    f"{TOKEN_TYPE}[{i}] is {int(types[i])}, not a token type (1-6: "
                    f"{', '.join(TOKEN_TYPES.values())}); {bad.size:,} such",
                    offset=value.offset + 4 * i,
                    field=f"{TOKEN_TYPE}[{i}]",
                )
