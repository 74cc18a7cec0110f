"""zTensor 2: the layout profiles' rules (sparse, quantized, MX, GGUF blocks): which parts an
object of each layout has and the sizes they must be (`layout_problems`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from matrixctl.findings import Problem
from matrixctl.formats.ztensor2.layout import (
    _GGUF_RE,
    COO,
    CSR,
    DENSE,
    GGUF_TYPES,
    LOGICAL,
    MX,
    QUANT,
    STORAGE,
    ZT2_PARTS,
    ZT2_PROFILE,
    ZT2_SIZE,
    Obj,
    Part,
)
from matrixctl.formats.ztensor2.manifest import _uint

# Layout rules -------------------------------------------------------------------------------


def type_size(part: Part, n: int) -> int | None:
    """The size function of the part's logical type at n elements (None: unknown type)."""
    if part.type is None:
        return n * STORAGE[part.dtype]
    known = LOGICAL.get(part.type)
    if known is None:
        return None
    return (n + 1) // 2 if known[1] == 0 else n * known[1]


def layout_known(layout: str) -> bool:
    return layout in (DENSE, CSR, COO, QUANT, MX) or gguf_type(layout) is not None


def gguf_type(layout: str) -> str | None:
    m = _GGUF_RE.fullmatch(layout)
    return m.group(1) if m and m.group(1) in GGUF_TYPES else None


def _uattr(attrs: Mapping[str, Any], key: str) -> int | None:
    v = attrs.get(key)
    return v if _uint(v) else None


def _size_problem(o: Obj, p: Part, want: int, why: str) -> Problem:
    return Problem(
        ZT2_SIZE,
        f"{o.name}/{p.role}: decoded size {p.decoded_size:,}, {why} give {want:,}",
        field=f"{p.field}/blob" if p.encoding is None else f"{p.field}/decoded_length",
    )


def layout_problems(o: Obj) -> Iterator[Problem]:
    """A problem for every metadata rule of the object's layout that fails
    (spec 5.1 and the profiles); nothing for an unknown layout (reported elsewhere)."""
    parts = o.parts
    if o.layout == DENSE and len(parts) == 1 and "data" in parts:
        # The common case, without the helpers below: the size equation alone.
        d = parts["data"]
        want = type_size(d, o.count)
        if want is not None and d.decoded_size != want:
            yield _size_problem(o, d, want, f"shape {list(o.shape)} and {d.type or d.dtype}")
        return
    w = o.field
    roles = set(parts)

    def need(*want: str, optional: tuple[str, ...] = ()) -> Iterator[Problem]:
        missing = [r for r in want if r not in roles]
        extra = sorted(roles - set(want) - set(optional))
        if missing or extra:
            yield Problem(
                ZT2_PARTS,
                f"{o.name}: layout {o.layout} has parts {', '.join(want)}"
                + (f"; missing {', '.join(missing)}" if missing else "")
                + (f"; unexpected {', '.join(extra)}" if extra else ""),
                field=f"{w}/parts",
            )

    def size_eq(p: Part, want: int, why: str) -> Iterator[Problem]:
        if p.decoded_size != want:
            yield _size_problem(o, p, want, why)

    unknown_type = [p for p in parts.values() if p.type is not None and p.type not in LOGICAL]
    if o.layout == DENSE:
        problems = list(need("data"))
        if problems:
            yield from problems
            return
        d = parts["data"]
        want = type_size(d, o.count)
        if want is not None:
            yield from size_eq(d, want, f"shape {list(o.shape)} and {d.type or d.dtype}")
        return
    if unknown_type:
        return  # sizes cannot be computed; the object is structural only
    if o.layout == CSR:
        problems = list(need("values", "indices", "indptr"))
        if len(o.shape) != 2:
            problems.append(
                Problem(
                    ZT2_PROFILE,
                    f"{o.name}: {CSR} needs rank 2, shape is {list(o.shape)}",
                    field=f"{w}/shape",
                )
            )
        if problems:
            yield from problems
            return
        ind, ptr, val = parts["indices"], parts["indptr"], parts["values"]
        if ind.dtype not in ("u32", "u64") or ind.type is not None:
            yield Problem(
                ZT2_PROFILE,
                f"{o.name}/indices: dtype must be u32 or u64 without a logical type",
                field=f"{ind.field}/dtype",
            )
            return
        if ptr.dtype != ind.dtype or ptr.type is not None:
            yield Problem(
                ZT2_PROFILE,
                f"{o.name}/indptr: dtype must equal indices' ({ind.dtype}) without a logical type",
                field=f"{ptr.field}/dtype",
            )
            return
        width = STORAGE[ind.dtype]
        if ind.decoded_size % width:
            yield Problem(
                ZT2_SIZE,
                f"{o.name}/indices: {ind.decoded_size:,} bytes is not whole {ind.dtype} elements",
                field=f"{ind.field}/blob",
            )
            return
        nnz = ind.decoded_size // width
        yield from size_eq(ptr, (o.shape[0] + 1) * width, f"{o.shape[0]} rows + 1 of {ind.dtype}")
        yield from size_eq(val, type_size(val, nnz) or 0, f"nnz {nnz} of {val.type or val.dtype}")
        return
    if o.layout == COO:
        problems = list(need("values", "coords"))
        if not o.shape:
            problems.append(
                Problem(ZT2_PROFILE, f"{o.name}: {COO} needs rank >= 1", field=f"{w}/shape")
            )
        if problems:
            yield from problems
            return
        co, val = parts["coords"], parts["values"]
        if co.dtype not in ("u32", "u64") or co.type is not None:
            yield Problem(
                ZT2_PROFILE,
                f"{o.name}/coords: dtype must be u32 or u64 without a logical type",
                field=f"{co.field}/dtype",
            )
            return
        unit = STORAGE[co.dtype] * len(o.shape)
        if co.decoded_size % unit:
            yield Problem(
                ZT2_SIZE,
                f"{o.name}/coords: {co.decoded_size:,} bytes is not a multiple of {unit} "
                f"({len(o.shape)} dims of {co.dtype})",
                field=f"{co.field}/blob",
            )
            return
        nnz = co.decoded_size // unit
        yield from size_eq(val, type_size(val, nnz) or 0, f"nnz {nnz} of {val.type or val.dtype}")
        return
    gt = gguf_type(o.layout)
    if gt is not None:
        problems = list(need("data"))
        if problems:
            yield from problems
            return
        d = parts["data"]
        if d.dtype != "u8" or d.type is not None:
            yield Problem(
                ZT2_PROFILE,
                f"{o.name}/data: {o.layout} data is u8 without a logical type",
                field=f"{d.field}/dtype",
            )
            return
        epb, bb = _uattr(o.attributes, "elems_per_block"), _uattr(o.attributes, "block_bytes")
        if not epb or not bb:
            yield Problem(
                ZT2_PROFILE,
                f"{o.name}: elems_per_block and block_bytes (uint >= 1) are required",
                field=f"{w}/attributes",
            )
            return
        if o.count % epb or (o.shape and o.shape[-1] % epb):
            yield Problem(
                ZT2_PROFILE,
                f"{o.name}: elems_per_block {epb} does not divide the element count or the last "
                f"dimension of {list(o.shape)}",
                field=f"{w}/attributes/elems_per_block",
            )
            return
        yield from size_eq(d, o.count // epb * bb, f"{o.count // epb} blocks of {bb} bytes")
        return
    if o.layout == MX:
        yield from _mx_problems(o, need)
        return
    if o.layout == QUANT:
        yield from _quant_problems(o, need)


def _mx_problems(o: Obj, need: Any) -> Iterator[Problem]:
    w = o.field
    problems = list(need("data", "scales"))
    if problems:
        yield from problems
        return
    d, s = o.parts["data"], o.parts["scales"]
    a = o.attributes
    if s.dtype != "u8" or s.type != "f8_e8m0":
        yield Problem(
            ZT2_PROFILE, f"{o.name}/scales: must be u8 with type f8_e8m0", field=f"{s.field}/type"
        )
        return
    if a.get("scale_form") != "e8m0_exponent":
        yield Problem(
            ZT2_PROFILE,
            f"{o.name}: scale_form must be 'e8m0_exponent'",
            field=f"{w}/attributes/scale_form",
        )
        return
    if (d.dtype, d.type) not in (
        ("u8", "f4_e2m1"),
        ("u8", "f8_e4m3fn"),
        ("u8", "f8_e5m2"),
        ("i8", None),
    ):
        yield Problem(
            ZT2_PROFILE,
            f"{o.name}/data: {d.dtype}/{d.type} is not an MX element type",
            field=f"{d.field}/type",
        )
        return
    if not o.shape:
        yield Problem(ZT2_PROFILE, f"{o.name}: {MX} needs rank >= 1", field=f"{w}/shape")
        return
    axis = a.get("axis", len(o.shape) - 1)
    if not _uint(axis) or axis >= len(o.shape):
        yield Problem(
            ZT2_PROFILE,
            f"{o.name}: axis {axis!r:.20} is not below rank {len(o.shape)}",
            field=f"{w}/attributes/axis",
        )
        return
    bs = _uattr(a, "block_size")
    if bs is None or bs < 2 or o.shape[axis] % bs:
        yield Problem(
            ZT2_PROFILE,
            f"{o.name}: block_size {a.get('block_size')!r:.20} must be >= 2 and divide "
            f"shape[{axis}] = {o.shape[axis]}",
            field=f"{w}/attributes/block_size",
        )
        return
    yield from _size(o, d, type_size(d, o.count) or 0, f"{o.count} elements of {d.type or d.dtype}")
    yield from _size(o, s, o.count // bs, f"{o.count // bs} blocks")


def _size(o: Obj, p: Part, want: int, why: str) -> Iterator[Problem]:
    if p.decoded_size != want:
        yield Problem(
            ZT2_SIZE,
            f"{o.name}/{p.role}: decoded size {p.decoded_size:,}, {why} give {want:,}",
            field=f"{p.field}/blob" if p.encoding is None else f"{p.field}/decoded_length",
        )


_WORDS = {"u8": 1, "u16": 2, "u32": 4, "u64": 8}


def _quant_problems(o: Obj, need: Any) -> Iterator[Problem]:
    w = o.field
    a = o.attributes
    zp = a.get("zero_point")
    if not isinstance(zp, dict) or zp.get("form") not in ("none", "implied", "tensor"):
        yield Problem(
            ZT2_PROFILE,
            f"{o.name}: zero_point.form must be none, implied or tensor",
            field=f"{w}/attributes/zero_point",
        )
        return
    form = zp["form"]
    problems = list(need("data", "scales", "zeros") if form == "tensor" else need("data", "scales"))
    if problems:
        yield from problems
        return
    if form == "implied" and type(zp.get("value")) is not int:
        yield Problem(
            ZT2_PROFILE,
            f"{o.name}: zero_point.value (int) is required for form implied",
            field=f"{w}/attributes/zero_point/value",
        )
        return
    if form == "tensor" and zp.get("packing") not in ("same_as_data", "plain"):
        yield Problem(
            ZT2_PROFILE,
            f"{o.name}: zero_point.packing must be same_as_data or plain",
            field=f"{w}/attributes/zero_point/packing",
        )
        return
    pk = a.get("packing")
    if (
        not isinstance(pk, dict)
        or pk.get("word") not in _WORDS
        or pk.get("order") not in ("lsb_first", "msb_first")
    ):
        yield Problem(
            ZT2_PROFILE,
            f"{o.name}: packing needs word (u8/u16/u32/u64) and order (lsb_first/msb_first)",
            field=f"{w}/attributes/packing",
        )
        return
    word = pk["word"]
    wbytes = _WORDS[word]
    bits = _uattr(a, "bits")
    if bits not in (2, 3, 4, 5, 6, 8) or (8 * wbytes) % bits:
        yield Problem(
            ZT2_PROFILE,
            f"{o.name}: bits {a.get('bits')!r:.20} must be 2, 3, 4, 5, 6 or 8 and divide the "
            f"{8 * wbytes}-bit word",
            field=f"{w}/attributes/bits",
        )
        return
    per_word = 8 * wbytes // bits
    if pk.get("per_word") != per_word:
        yield Problem(
            ZT2_PROFILE,
            f"{o.name}: packing.per_word {pk.get('per_word')!r:.20} must be {per_word}",
            field=f"{w}/attributes/packing/per_word",
        )
        return
    d, s = o.parts["data"], o.parts["scales"]
    if d.type is not None or d.dtype.lstrip("i").lstrip("u") != word[1:] or d.dtype[0] not in "iu":
        yield Problem(
            ZT2_PROFILE,
            f"{o.name}/data: dtype {d.dtype} does not match packing.word {word}",
            field=f"{d.field}/dtype",
        )
        return
    sf = a.get("scale_form")
    if sf in ("f32_factors", "f16_factors"):
        ok = s.dtype in ("f64", "f32", "f16", "bf16") and s.type is None
    elif sf == "e8m0_exponent":
        ok = s.dtype == "u8" and s.type == "f8_e8m0"
    else:
        yield Problem(
            ZT2_PROFILE,
            f"{o.name}: scale_form {sf!r:.30} is not f32_factors, f16_factors or e8m0_exponent",
            field=f"{w}/attributes/scale_form",
        )
        return
    if not ok:
        yield Problem(
            ZT2_PROFILE,
            f"{o.name}/scales: {s.dtype}/{s.type} does not fit scale_form {sf}",
            field=f"{s.field}/dtype",
        )
        return
    axis, gs = _uattr(a, "axis"), _uattr(a, "group_size")
    if axis is None or axis >= len(o.shape):
        yield Problem(
            ZT2_PROFILE,
            f"{o.name}: axis {a.get('axis')!r:.20} is not below rank {len(o.shape)}",
            field=f"{w}/attributes/axis",
        )
        return
    along = o.shape[axis]
    if gs is None or (gs and along % gs):
        yield Problem(
            ZT2_PROFILE,
            f"{o.name}: group_size {a.get('group_size')!r:.20} must divide shape[{axis}] = {along}",
            field=f"{w}/attributes/group_size",
        )
        return
    groups = along if gs == 0 else along // gs
    lanes = o.count // along if along else 0
    codes_n = o.count
    if codes_n % per_word:
        yield Problem(
            ZT2_SIZE,
            f"{o.name}/data: {codes_n} codes are not whole {word} words of {per_word}",
            field=f"{d.field}/blob",
        )
        return
    yield from _size(o, d, codes_n // per_word * wbytes, f"{codes_n} codes, {per_word} per {word}")
    yield from _size(o, s, groups * lanes * STORAGE[s.dtype], f"{groups} groups x {lanes} lanes")
    if form == "tensor":
        z = o.parts["zeros"]
        if zp["packing"] == "plain":
            yield from _size(
                o, z, groups * lanes * STORAGE[z.dtype], f"{groups} groups x {lanes} lanes"
            )
        else:
            yield from _size(
                o,
                z,
                groups * lanes // per_word * wbytes,
                f"{groups * lanes} zero points packed like data",
            )
