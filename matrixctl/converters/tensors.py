"""The one converter between tensor containers: any `TensorSource` to any `TensorSink`.

    source.tensors() -> --select -> dtype casts / densify -> sink.refuse() for every tensor
    -> sink.order() -> sink.begin(plan) -> for each tensor: sink.add(info, streams)
    -> sink.finish()    (all outputs atomic: nothing is left behind on any failure)

Lossless by default: a tensor the destination cannot hold as it is (a dtype or layout it
lacks) is refused before anything is written, naming the tensor and the reason; `--dtype`
asks for a cast, and a cast that would change a value beyond rounding (overflow to infinity,
out-of-range or fractional values into integers, a non-zero imaginary part dropped, a value
other than 0/1 into bool) is refused too, naming the element. Memory: one chunk of one tensor
at a time (zero-copy slices for raw data; mapped pages are dropped after each tensor), except
`--densify`, which builds one dense tensor.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, BinaryIO

from matrixctl import codes, tensors
from matrixctl.converters import Result
from matrixctl.errors import FormatError, MatrixError, UsageError
from matrixctl.io import STDIO, HashingWriter, atomic_output, output_set
from matrixctl.opening import open_with_options
from matrixctl.records import FrozenRecord, Record
from matrixctl.tensors import (
    DTYPES,
    Outputs,
    StoredBytes,
    TensorInfo,
    TensorSink,
    TensorSource,
    dtype_named,
    human_bytes,
)

if TYPE_CHECKING:
    import numpy as np

    from matrixctl.io import Source

G = "convert"
CONVERT_REFUSED = codes.define(
    "CONVERT_REFUSED",
    "The destination cannot hold a tensor as it is (dtype, layout, count); nothing was written. "
    "--dtype casts, --densify stores sparse tensors dense.",
    group=G,
)
CONVERT_CAST = codes.define(
    "CONVERT_CAST",
    "A --dtype cast would change a value beyond rounding (overflow to infinity, out of range, "
    "a fraction or an imaginary part dropped, a bool other than 0/1); nothing was written.",
    group=G,
)
CONVERT_EMPTY = codes.define(
    "CONVERT_EMPTY", "--select (or --exclude) left no tensor of the input.", group=G
)


drop_pages = tensors.drop_pages  # re-exported for codecs written against this module


# Options ------------------------------------------------------------------------------------


class CastRule(FrozenRecord):
    """`--dtype [PATTERN=]DTYPE`: `pattern` None casts every floating-point tensor."""

    __slots__ = ("dtype", "pattern")
    pattern: str | None
    dtype: str

    def __init__(self, pattern: str | None, dtype: str) -> None:
        self._init(pattern, dtype)


def parse_casts(values: list[str] | None) -> list[CastRule]:
    rules = []
    for text in values or []:
        pattern, sep, name = text.rpartition("=")
        target = dtype_named(name)
        if target is None:
            raise UsageError(
                f"--dtype {text!r}: unknown dtype {name!r}",
                hint=f"dtypes: {', '.join(DTYPES)}",
            )
        rules.append(CastRule(pattern if sep else None, target.name))
    return rules


def cast_target(info: TensorInfo, rules: list[CastRule]) -> str | None:
    target = None
    for r in rules:
        if r.pattern is None:
            if DTYPES[info.dtype].kind == "float":
                target = r.dtype
        elif fnmatch.fnmatchcase(info.name, r.pattern):
            target = r.dtype
    return None if target == info.dtype else target


def select(
    infos: list[TensorInfo], patterns: list[str] | None, exclude: list[str] | None = None
) -> list[TensorInfo]:
    if patterns:
        infos = [i for i in infos if any(fnmatch.fnmatchcase(i.name, p) for p in patterns)]
    if exclude:
        infos = [i for i in infos if not any(fnmatch.fnmatchcase(i.name, p) for p in exclude)]
    return infos


def parse_meta(values: list[str] | None) -> dict[str, str]:
    """`--meta KEY=VALUE` (repeatable; later ones win) -> {key: value}."""
    out: dict[str, str] = {}
    for text in values or []:
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--meta {_shown(text)}: expected KEY=VALUE")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as err:
            # Arguments that are not UTF-8 arrive with surrogate escapes; no format stores those.
            c = ord(text[err.start])
            what = f"byte 0x{c - 0xDC00:02x}" if 0xDC80 <= c <= 0xDCFF else f"U+{c:04X}"
            raise UsageError(
                f"--meta {_shown(text)}: not UTF-8 text ({what} at character {err.start}); "
                "metadata keys and values are UTF-8"
            ) from None
        out[key.strip()] = value
    return out


def _shown(text: str) -> str:
    """An argument for an error line: its bytes as Python shows them when it is not UTF-8."""
    for errors in ("strict", "surrogateescape"):
        try:
            raw = text.encode("utf-8", errors)
        except UnicodeEncodeError:
            continue
        return repr(text) if errors == "strict" else repr(raw)
    return ascii(text)  # a lone surrogate that no byte gave (from the Python API)


# Casting ------------------------------------------------------------------------------------


def _numeric(arr: np.ndarray, dtype: str) -> np.ndarray:
    """Storage bytes -> numbers (bf16/float8 through ml_dtypes)."""
    d = DTYPES[dtype]
    if d.numeric:
        return arr
    import ml_dtypes

    return arr.view(getattr(ml_dtypes, d.ml_dtypes or ""))


def _to_storage(values: np.ndarray, dtype: str) -> np.ndarray:
    import numpy as np

    d = DTYPES[dtype]
    if d.numeric:
        return values.astype(np.dtype(d.storage), copy=False)
    import ml_dtypes

    return values.astype(getattr(ml_dtypes, d.ml_dtypes or "")).view(np.dtype(d.storage))


def cast_chunk(raw: np.ndarray, src: str, dst: str, name: str, base: int) -> np.ndarray:
    """Cast one chunk (storage dtype of `src`) to storage of `dst`; refuse value changes
    beyond rounding. `base` is the index of the chunk's first element (for messages)."""
    import numpy as np

    with np.errstate(all="ignore"):  # overflow is detected below and refused by name
        return _cast_chunk(raw, src, dst, name, base)


def _cast_chunk(raw: np.ndarray, src: str, dst: str, name: str, base: int) -> np.ndarray:
    import numpy as np

    s, d = DTYPES[src], DTYPES[dst]
    x = _numeric(raw, src)
    if s.kind == "bool":
        x = x.astype(np.uint8)

    def refuse(mask: np.ndarray, why: str) -> None:
        bad = np.flatnonzero(mask)
        if bad.size:
            i = int(bad[0])
            raise FormatError(
                CONVERT_CAST,
                f"tensor {name!r}: casting {src} to {dst} {why} at element {base + i:,} "
                f"(value {x.reshape(-1)[i]!r}); {bad.size:,} such element(s) in this chunk",
                field=f"{name}[{base + i}]",
            )

    if s.kind == "complex" and d.kind != "complex":
        refuse(x.imag != 0, "would drop a non-zero imaginary part")
        x = x.real
    if d.kind == "bool":
        refuse((x != 0) & (x != 1), "needs 0 or 1")
        return (x != 0).astype(np.uint8).view(np.bool_)
    if d.kind in ("int", "uint"):
        info = np.iinfo(np.dtype(d.storage))
        if x.dtype.kind == "f" or (not DTYPES[src].numeric):
            xf = x.astype(np.float64)
            refuse(~np.isfinite(xf), "has no integer for a non-finite value")
            refuse(xf != np.floor(xf), "would drop a fraction")
            refuse((xf < info.min) | (xf > info.max), "is out of range")
            out = x.astype(np.dtype(d.storage))
            # float64 cannot hold every int64: compare back to catch edge rounding.
            refuse(out.astype(np.float64) != xf, "is out of range")
            return out
        xi = x
        if xi.dtype.kind == "u" and info.min < 0:
            refuse(xi > info.max, "is out of range")
        elif xi.dtype.kind == "i" and info.min == 0:
            refuse((xi < 0) | (xi > info.max), "is out of range")
        else:
            refuse((xi < info.min) | (xi > info.max), "is out of range")
        return xi.astype(np.dtype(d.storage))
    # float or complex destination
    out = _to_storage(x, dst)
    back = _numeric(out, dst)
    if x.dtype.kind in "fc" or not DTYPES[src].numeric:
        finite_in = np.isfinite(x.astype(np.complex128 if x.dtype.kind == "c" else np.float64))
    else:
        finite_in = np.ones(x.shape, dtype=bool)
    finite_out = np.isfinite(back.astype(np.complex128 if d.kind == "complex" else np.float64))
    refuse(finite_in & ~finite_out, "overflows to infinity (or NaN)")
    return out


def _aligned(stream: Iterator[Any], itemsize: int) -> Iterator[bytes | memoryview]:
    """Re-chunk a byte stream so every piece holds whole elements."""
    rest = b""
    for piece in stream:
        mv = memoryview(piece).cast("B")
        if rest:
            buf = rest + bytes(mv)
            cut = len(buf) - len(buf) % itemsize
            rest = buf[cut:]
            if cut:
                yield buf[:cut]
            continue
        cut = len(mv) - len(mv) % itemsize
        if cut:
            yield mv[:cut]
        rest = bytes(mv[cut:])
    if rest:
        yield rest


def cast_stream(stream: Iterator[Any], src: str, dst: str, name: str) -> Iterator[np.ndarray]:
    import numpy as np

    base = 0
    storage = np.dtype(DTYPES[src].storage)
    for piece in _aligned(stream, storage.itemsize):
        raw = np.frombuffer(piece, dtype=storage)
        yield cast_chunk(raw, src, dst, name, base)
        base += raw.size


# Densify ------------------------------------------------------------------------------------


def densify(source: TensorSource, info: TensorInfo) -> np.ndarray:
    """A sparse tensor as a dense C-order array of its values' storage dtype."""
    import numpy as np

    def part(role: str) -> np.ndarray:
        comp = next(c for c in info.components if c.role == role)
        data = b"".join(bytes(p) for p in source.stream(info, role))
        return np.frombuffer(data, dtype=np.dtype(DTYPES[comp.dtype].storage))

    values = part("values")
    dense = np.zeros(info.count, dtype=values.dtype)
    flat: Any
    if info.layout == "sparse_csr":
        rows, cols = info.shape
        indptr = part("indptr").astype(np.int64)
        indices = part("indices").astype(np.int64)
        row_of = np.repeat(np.arange(rows, dtype=np.int64), np.diff(indptr))
        flat = row_of * cols + indices
    else:
        coords = part("coords").astype(np.int64).reshape(len(info.shape), values.size)
        flat = np.zeros(values.size, dtype=np.int64)
        if info.shape:
            flat = np.ravel_multi_index(tuple(coords), info.shape)
        if np.unique(flat).size != flat.size:
            raise FormatError(
                CONVERT_REFUSED,
                f"tensor {info.name!r}: sparse_coo lists a coordinate twice; densifying would "
                "have to drop or add values",
                field=info.name,
            )
    dense[flat] = values
    return dense


# The converter ------------------------------------------------------------------------------


class Planned(Record):
    """One tensor to write: `src` as the source has it, `out` as the sink receives it."""

    __slots__ = ("cast", "densify", "out", "src")

    def __init__(
        self, src: TensorInfo, out: TensorInfo, cast: str | None = None, densify: bool = False
    ) -> None:
        self.src = src
        self.out = out
        self.cast = cast
        self.densify = densify


def _refusal_hint(info: TensorInfo, sink: TensorSink) -> str:
    if info.layout in ("sparse_csr", "sparse_coo") and "dense" in sink.layouts:
        return (
            f"pass --densify to store it dense ({human_bytes(info.nbytes)}), or convert to .zt "
            "to keep it sparse"
        )
    if info.layout != "dense":
        return "convert to .zt to keep it as it is"
    d = DTYPES[info.dtype]
    if d.kind == "float" and d.itemsize <= 2 and "f32" in sink.dtypes:
        return (
            f"--dtype f32 widens {info.dtype} exactly (or --dtype '{info.name}=f32' for it alone)"
        )
    if d.name == "complex128":
        return "no destination dtype holds complex128 exactly; convert to .zt or .npy"
    return f"pass --dtype '{info.name}=D' to cast it, or --exclude '{info.name}' to leave it out"


def plan_tensors(
    source: TensorSource,
    sink: TensorSink,
    options: dict[str, Any],
    left_out: list[tuple[str, str]] | None = None,
) -> tuple[list[Planned], int]:
    """The tensors to write and how; `left_out` collects (name, note) for each tensor the
    sink leaves out (`TensorSink.leave_out`)."""
    infos = source.tensors()
    chosen = select(infos, options.get("select"), options.get("exclude"))
    if (options.get("select") or options.get("exclude")) and not chosen:
        flags = [f"--select {p}" for p in options.get("select") or []]
        flags += [f"--exclude {p}" for p in options.get("exclude") or []]
        raise UsageError(
            f"{' '.join(flags)} left none of the {len(infos)} tensors", code=CONVERT_EMPTY
        )
    rules = parse_casts(options.get("dtype"))
    plan: list[Planned] = []
    for info in chosen:
        item = Planned(info, info)
        sparse = info.layout in ("sparse_csr", "sparse_coo")
        if sparse and options.get("densify") and info.layout not in sink.layouts:
            item.densify = "dense" in sink.layouts
            if item.densify:
                item.out = TensorInfo(info.name, info.dtype, info.shape, "dense", (), {})
        target = cast_target(item.out, rules)
        if target is not None:
            if item.out.layout == "quantized_group":
                raise FormatError(
                    CONVERT_REFUSED,
                    f"tensor {info.name!r} is quantized_group: its packed components are not cast",
                    field=info.name,
                )
            item.cast = target
            comps = tuple(
                c.replace(dtype=target) if c.role == "values" else c for c in item.out.components
            )
            item.out = item.out.replace(dtype=target, components=comps)
        skip = sink.leave_out(item.out)
        if skip is not None:
            if left_out is not None:
                note = f"left out {info.name!r} ({item.out.dtype} {list(item.out.shape)}): {skip}"
                left_out.append((info.name, note))
            continue
        why = sink.refuse(item.out)
        if why is not None:
            raise FormatError(
                CONVERT_REFUSED,
                f"tensor {info.name!r} ({item.out.layout} {item.out.dtype} "
                f"{list(item.out.shape)}): {why}; nothing was written",
                field=info.name,
                hint=_refusal_hint(item.out, sink),
            )
        plan.append(item)
    if sink.max_tensors is not None and len(plan) > sink.max_tensors:
        names = ", ".join(repr(p.src.name) for p in plan[:4])
        raise FormatError(
            CONVERT_REFUSED,
            f"{sink.format} holds {sink.max_tensors} tensor, the input has {len(plan)} ({names}"
            f"{', ...' if len(plan) > 4 else ''})",
            hint="choose one with --select NAME, or write .npz, .safetensors or .zt",
        )
    if len(plan) < sink.min_tensors:
        raise FormatError(
            CONVERT_REFUSED,
            f"{sink.format} needs at least {sink.min_tensors} tensor, the input has none",
        )
    return plan, len(infos)


def normalised_bools(stream: Iterator[Any], name: str, counts: dict[str, int]) -> Iterator[Any]:
    """A bool tensor's bytes with every byte other than 0x00/0x01 written as 0x01 (what numpy,
    safetensors and ztensor read such a byte as: true), counting them in `counts[name]`. The
    readers matrixctl verifies against accept such bytes (a warning, NPY_BOOL / ST_BOOL /
    ZT_BOOL), zTensor 2 refuses them (its spec's MUST): convert's output is always 0/1."""
    import numpy as np

    for piece in stream:
        raw = np.frombuffer(piece, dtype=np.uint8)
        bad = int(np.count_nonzero(raw > 1))
        if bad:
            counts[name] = counts.get(name, 0) + bad
            yield np.minimum(raw, 1)
        else:
            yield piece


def _streams(
    source: TensorSource, item: Planned, bools: dict[str, int] | None = None
) -> Callable[[str], Iterator[Any]]:
    cache: dict[str, Any] = {}

    def parts(role: str) -> Iterator[Any]:
        if item.densify:
            if "dense" not in cache:
                cache["dense"] = densify(source, item.src)
            stream: Iterator[Any] = iter([cache["dense"].view("u1")] if cache["dense"].size else [])
            src_dtype = item.src.dtype
        else:
            stream = source.stream(item.src, role)
            src_dtype = next(p.dtype for p in item.src.parts() if p.role == role)
        if item.cast is not None and role in ("data", "values"):
            return cast_stream(stream, src_dtype, item.cast, item.src.name)
        if src_dtype == "bool" and bools is not None:
            return normalised_bools(stream, item.src.name, bools)
        return stream

    return parts


def _ticking(stream: Iterator[Any], tick: Callable[[int], None]) -> Iterator[Any]:
    """The stream, telling `tick` each byte count. Stored bytes stay `StoredBytes` (they tick
    themselves), so a sink's `copy_stream` can still copy them inside the kernel."""
    if isinstance(stream, StoredBytes):
        stream.tick = tick
        return stream
    return _ticked(stream, tick)


def _ticked(stream: Iterator[Any], tick: Callable[[int], None]) -> Iterator[Any]:
    for piece in stream:
        yield piece
        tick(memoryview(piece).nbytes)


def convert(
    src: Source,
    dst_path: str,
    options: dict[str, Any],
    *,
    src_fmt: str,
    dst_fmt: str,
    source_cls: type[TensorSource],
    sink_cls: type[TensorSink],
) -> Result:
    sink_options = prepare_sink_options(options, sink_cls, dst_fmt)
    with tensors.deferred_checks():  # whole-file checks run on the copy (tensors.FileCheck)
        source = open_with_options(source_cls, src, options, src_fmt)
    try:
        return _run(source, src, dst_path, options, sink_options, src_fmt, dst_fmt, sink_cls)
    except MatrixError:
        # The checks the open left to the copy come first, as when the open ran them: a
        # damaged input is the error reported, whatever else failed (nothing was written).
        source.finish_checks()
        raise
    finally:
        source.close()


def convert_source(
    source: TensorSource,
    src: Source,
    dst_path: str,
    options: dict[str, Any],
    *,
    dst_fmt: str,
    sink_cls: type[TensorSink],
) -> Result:
    """`convert` for a source the caller has already opened (library use, e.g. `ingest gguf`
    writing one tensor of a model); the caller closes the source."""
    sink_options = prepare_sink_options(options, sink_cls, dst_fmt)
    return _run(source, src, dst_path, options, sink_options, source.format, dst_fmt, sink_cls)


def prepare_sink_options(
    options: dict[str, Any], sink_cls: type[TensorSink], dst_fmt: str
) -> dict[str, Any]:
    """The sink's options from the command's, with usage errors before anything is read."""
    sink_options = {k: v for k, v in options.items() if v is not None}
    for opt in ("compress", "digest", "per_file", "quantize"):
        if options.get(opt) is not None and opt not in getattr(sink_cls, "accepts", ()):
            owner = {"per_file": "STB", "quantize": "GGUF"}.get(opt, "zTensor")
            flag = "--" + opt.replace("_", "-")
            raise UsageError(f"{flag} applies to {owner} output only, not {dst_fmt}")
    sink_options["meta"] = parse_meta(options.get("meta"))
    if options.get("compress") is not None:
        from matrixctl.formats.ztensor import parse_compress

        sink_options["compress_level"] = parse_compress(options["compress"])
    if options.get("digest") is not None:
        digest = str(options["digest"]).lower()
        sink_options["digest"] = None if digest == "none" else digest
    parse_casts(options.get("dtype"))  # usage errors before reading anything
    return sink_options


def _run(
    source: TensorSource,
    src: Source,
    dst_path: str,
    options: dict[str, Any],
    sink_options: dict[str, Any],
    src_fmt: str,
    dst_fmt: str,
    sink_cls: type[TensorSink],
) -> Result:
    sink = sink_cls(sink_options)
    left_out: list[tuple[str, str]] = []
    try:
        plan, total = plan_tensors(source, sink, options, left_out)
    except FormatError as err:
        raise err.with_path(src.name) from None
    ordered_out = sink.order([p.out for p in plan])
    by_name = {p.out.name: p for p in plan}
    plan = [by_name[i.name] for i in ordered_out]
    metadata = {**source.metadata(), **sink_options["meta"]}
    result = Result()
    result.notes.extend(note for _, note in left_out)
    if metadata and not sink.keeps_metadata:
        result.notes.append(
            f"{dst_fmt} has no place for file metadata: dropped {', '.join(sorted(metadata))}"
        )
    dropped_attrs = [p.src.name for p in plan if p.src.attributes and p.out.layout == "dense"]
    if dropped_attrs and not sink.keeps_metadata:
        result.notes.append(
            f"tensor attributes of {', '.join(dropped_attrs[:5])} have no place in {dst_fmt}"
        )
    bar = options.get("progress")
    logical = sum(p.out.stored_nbytes for p in plan)
    if bar is not None:
        bar.total(logical)
    tick: Callable[[int], None] = bar.advance if bar is not None else (lambda n: None)
    hashing = None
    bools: dict[str, int] = {}  # bool tensor -> bytes other than 0/1 written as 0x01
    with contextlib.ExitStack() as stack:
        if getattr(sink, "writes_set", False) and dst_path != STDIO:
            stack.enter_context(output_set(dst_path))  # the files appear together (STB)
        main = stack.enter_context(atomic_output(dst_path, what=f"a {dst_fmt} file"))
        if options.get("sha256") and dst_path != STDIO:
            # Library callers that record the output's SHA-256 (`ingest gguf`): written and
            # hashed on a helper thread, overlapping the decoding of the next chunk.
            hashing = HashingWriter(main)
            stack.callback(hashing.close)
            main = hashing  # type: ignore[assignment]

        def open_extra(path: str) -> BinaryIO:
            if dst_path == STDIO:
                raise UsageError(f"{dst_fmt} output needs a sidecar file: name an output file")
            return stack.enter_context(atomic_output(path, what=f"a {dst_fmt} sidecar"))

        sink.begin(Outputs(main, dst_path, open_extra), [p.out for p in plan], metadata)
        for item in plan:
            streams = _streams(source, item, bools)
            try:
                sink.add(item.out, lambda role, s=streams: _ticking(s(role), tick))  # type: ignore[misc]
            except FormatError as err:
                raise err.with_path(src.name) from None
            source.release(item.src)
        summary = sink.finish()
        source.finish_checks()  # checks left to the copy, before the outputs are committed
        if hashing is not None:
            hashing.close()
            if hashing.digest is not None:
                summary = {**summary, "sha256": hashing.digest}
    result.notes.extend(sink.notes())
    lossy = lossy_changes(source, plan, left_out)
    if lossy:
        result.notes.insert(0, "lossy conversion: " + "; ".join(lossy))
    if bools:
        named = ", ".join(f"{n!r} ({c:,})" for n, c in sorted(bools.items())[:4])
        result.notes.append(
            f"bool bytes other than 0x00/0x01 written as 0x01 (true, as readers take them): "
            f"{named}{', ...' if len(bools) > 4 else ''}"
        )
    stale = getattr(sink, "stale_members", None)
    for path in stale() if stale is not None and dst_path != STDIO else ():
        # After the commit: the previous set's members the new set has not (STB).
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            result.notes.append(f"{path}, a file of the previous set, was left: {exc.strerror}")
    result.summary = {
        "tensors": len(plan),
        "of": total,
        "logical_bytes": logical,
        "cast": {p.out.name: p.cast for p in plan if p.cast},
        "densified": [p.out.name for p in plan if p.densify],
        "left_out": [name for name, _ in left_out],
        "normalised_bools": dict(sorted(bools.items())),
        "lossy": lossy,
        **summary,
    }
    return result


def _widens(src: str, dst: str) -> bool:
    """Whether every value of `src` is exactly a value of `dst` (a cast that loses nothing)."""
    s, d = DTYPES[src], DTYPES[dst]
    if s.kind == "bool":
        return True
    if s.kind == d.kind:
        return d.itemsize > s.itemsize and not (src == "f16" and dst == "bf16")
    if s.kind in ("int", "uint") and d.kind in ("float", "complex"):
        magnitude = s.itemsize * 8 - (s.kind == "int")
        return magnitude <= _MANTISSA.get(dst, 0)
    return s.kind == "uint" and d.kind == "int" and d.itemsize > s.itemsize


# Significand bits (with the implicit one) of the float dtypes: the widest integer each holds.
_MANTISSA = {"f16": 11, "bf16": 8, "f32": 24, "f64": 53, "complex64": 24, "complex128": 53}


def lossy_changes(
    source: TensorSource, plan: list[Planned], left_out: list[tuple[str, str]]
) -> list[str]:
    """What a conversion changes beyond the bytes' layout, one phrase each: tensors
    dequantized (a GGUF's blocks become f32), casts that can round (f32 -> f16; widening casts
    are exact and not listed), tensors the destination left out. Empty when lossless."""
    out: list[str] = []
    dequantized_of = getattr(source, "dequantized", None)
    if dequantized_of is not None:
        dq = dequantized_of([p.src.name for p in plan])
        if dq:
            kinds = sorted({kind for _, kind, _ in dq})
            stored = sum(n for _, _, n in dq)
            wide = sum(p.out.nbytes for p in plan if p.src.name in {n for n, _, _ in dq})
            out.append(
                f"dequantized {len(dq)} {'/'.join(kinds)} tensor{'s' * (len(dq) != 1)} to f32 "
                f"({human_bytes(stored)} of blocks become {human_bytes(wide)}; "
                "--keep-quantized into .zt keeps the blocks)"
            )
    narrowed = [p for p in plan if p.cast and not _widens(p.src.dtype, p.cast)]
    if narrowed:
        pairs = sorted({f"{p.src.dtype} -> {p.cast}" for p in narrowed if p.cast})
        out.append(
            f"cast {len(narrowed)} tensor{'s' * (len(narrowed) != 1)} to a narrower dtype "
            f"({', '.join(pairs)}): values are rounded"
        )
    if left_out:
        names = ", ".join(repr(n) for n, _ in left_out[:4])
        out.append(
            f"left out {len(left_out)} tensor{'s' * (len(left_out) != 1)} the destination "
            f"cannot hold ({names}{', ...' if len(left_out) > 4 else ''})"
        )
    return out


def open_source(path: str) -> contextlib.AbstractContextManager[TensorSource]:
    """Any tensor container, sniffed from its bytes, opened for reading (library use):

    with open_source("model.zt") as src:
        for info in src.tensors():
            arr = src.array(info)  # zero-copy for raw data

    The same as `matrixctl.opening.open_tensors(path)`, the one sniff-and-open.
    """
    from matrixctl.opening import open_tensors

    return open_tensors(path)
