"""The public Python API of matrixctl (docs/api.md), re-exported from `matrixctl`.

    import matrixctl
    with matrixctl.open("model.zt") as f:          # any tensor container, sniffed
        w = f["encoder.weight"]                     # shaped numpy array, zero-copy when raw
    matrixctl.save("out.safetensors", {"w": w})     # format from the suffix
    report = matrixctl.verify("model.zt")           # the CLI's findings and codes
    pack = matrixctl.open_pack("pack/")             # a dataset over an ingest pack

Errors are the CLI's typed `MatrixError` family with the CLI's stable codes. This module is
imported only when one of its names is first used (`matrixctl.__getattr__`), and it imports
numpy and the codecs inside the functions that need them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from matrixctl import codes
from matrixctl.dataset import PackDataset
from matrixctl.errors import FormatError, InputError, OutputError, UsageError
from matrixctl.findings import FileReport

if TYPE_CHECKING:
    import numpy as np

    from matrixctl.tensors import TensorInfo, TensorSource

Report = FileReport  # what `verify` returns: findings, checks, ok(), exit_code(), to_json()

__all__ = [
    "PackDataset",
    "Report",
    "TensorFile",
    "Tokenizer",
    "convert",
    "inspect",
    "load",
    "load_tokenizer",
    "open",
    "open_pack",
    "save",
    "verify",
]


# Tensor containers ------------------------------------------------------------------------------


def _numeric_view(arr: np.ndarray, dtype: str) -> np.ndarray:
    """Storage bytes as the element type (bf16 and float8 through ml_dtypes), zero-copy."""
    from matrixctl.tensors import DTYPES

    d = DTYPES[dtype]
    if d.numeric:
        return arr
    import ml_dtypes

    return arr.view(getattr(ml_dtypes, d.ml_dtypes or ""))


class TensorFile(Mapping[str, "np.ndarray"]):
    """A tensor container opened for reading: a mapping of tensor name -> numpy array.

    `f[name]` and `f.get(name)` return the tensor shaped and typed (bf16 and float8 as
    `ml_dtypes` types). Raw little-endian data (safetensors, zTensor raw, npy, STB, EMBD
    `.weights`) comes as a read-only zero-copy view of the mapped file; compressed, quantized,
    big-endian or sparse data is decoded into a new array (sparse tensors dense). Views must not
    be used after `close()`: copy what you keep (`load` does). `infos` maps each name to its
    `TensorInfo` (dtype, shape, layout) without reading data.
    """

    def __init__(self, path: str | os.PathLike[str], **options: Any) -> None:
        from matrixctl.opening import open_tensors

        self.path = _path(path)
        self._stack = contextlib.ExitStack()
        source: TensorSource = self._stack.enter_context(open_tensors(self.path, options))
        self._source: TensorSource | None = source
        self.format: str = source.format
        self.infos: dict[str, TensorInfo] = {i.name: i for i in source.tensors()}
        self.metadata: dict[str, Any] = dict(source.metadata())

    def __getitem__(self, name: str) -> np.ndarray:
        info = self.infos[name]  # KeyError for a name the file does not hold
        source = self._open_source()
        if info.layout in ("sparse_csr", "sparse_coo"):
            from matrixctl.converters.tensors import densify

            flat = densify(source, info)
        elif info.layout == "dense":
            flat = source.array(info)
        else:
            raise UsageError(
                f"{self.path}: tensor {name!r} is stored {info.layout}; open the file without "
                "keep_quantized to read it dequantized"
            )
        return _numeric_view(flat, info.dtype).reshape(info.shape)

    def _open_source(self) -> TensorSource:
        if self._source is None:
            raise UsageError(f"{self.path} is closed")
        return self._source

    def __iter__(self) -> Iterator[str]:
        return iter(self.infos)

    def __len__(self) -> int:
        return len(self.infos)

    def __contains__(self, name: object) -> bool:
        return name in self.infos

    def close(self) -> None:
        self._source = None
        self._stack.close()

    def __enter__(self) -> TensorFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<TensorFile {self.path!r} {self.format}: {len(self.infos)} tensors>"


def open(path: str | os.PathLike[str], **options: Any) -> TensorFile:
    """Open any tensor container (format sniffed from its bytes, structural checks run).
    `keep_quantized=True` keeps GGUF's quantized tensors as raw blocks (not readable as arrays)."""
    return TensorFile(path, **options)


def load(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """Every tensor of a container as an array of its own (copied: valid after the file is
    closed), in storage order."""
    import numpy as np

    with TensorFile(path) as f:
        return {name: np.array(f[name]) for name in f}


def _dtype_of(name: str, arr: np.ndarray) -> str:
    from matrixctl.tensors import DTYPES, dtype_named

    for d in DTYPES.values():
        if d.ml_dtypes is not None and arr.dtype.name == d.ml_dtypes:
            return d.name
    known = dtype_named(arr.dtype.name) if arr.dtype.kind in "biufc" else None
    if known is None:
        raise UsageError(
            f"tensor {name!r}: numpy dtype {arr.dtype} has no tensor type in matrixctl",
            hint="cast it first, e.g. arr.astype('float32')",
        )
    return known.name


def _array_source(tensors: Mapping[str, Any], metadata: Mapping[str, Any]) -> TensorSource:
    import numpy as np

    from matrixctl.tensors import DTYPES, TensorInfo, TensorSource, chunked

    class ArraySource(TensorSource):
        format = "numpy"

        def __init__(self) -> None:
            self._arrays: dict[str, np.ndarray] = {}
            self._infos: list[TensorInfo] = []
            for name, value in tensors.items():
                if not isinstance(name, str) or not name:
                    raise UsageError(f"tensor names must be non-empty strings, got {name!r}")
                arr = np.asarray(value)
                dtype = _dtype_of(name, arr)
                storage = np.dtype(DTYPES[dtype].storage)
                # Little-endian C-order bytes (a copy only for another byte order or layout).
                if DTYPES[dtype].numeric:
                    raw = np.ascontiguousarray(arr.astype(storage, copy=False))
                else:
                    raw = np.ascontiguousarray(arr).view(storage)
                self._arrays[name] = raw
                self._infos.append(TensorInfo(name, dtype, tuple(int(d) for d in arr.shape)))

        def tensors(self) -> list[TensorInfo]:
            return list(self._infos)

        def metadata(self) -> dict[str, Any]:
            return dict(metadata)

        def stream(self, info: TensorInfo, role: str = "data") -> Iterator[Any]:
            yield from chunked(self._arrays[info.name].reshape(-1).view(np.uint8))

        def array(self, info: TensorInfo, role: str = "data", *, verify: bool = True) -> Any:
            return self._arrays[info.name].reshape(-1)

    return ArraySource()


class _Named:
    """What the converter needs of an input for its messages: a name."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.path = name


def save(
    path: str | os.PathLike[str],
    tensors: Mapping[str, Any],
    *,
    metadata: Mapping[str, Any] | None = None,
    format: str | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Write `tensors` (name -> array) to a container chosen by `format` or the file's suffix
    (`.zt`, `.safetensors`, `.npy`, `.npz`, `.weights`, `.stb`). Atomic: the file appears only
    complete. `options` are `convert`'s (`compress="zstd"`, `digest`, `dtype=[...]`,
    `per_file`). Returns the converter's summary (what `convert --json` reports)."""
    from matrixctl.converters import destination_format
    from matrixctl.converters.tensors import convert_source
    from matrixctl.formats.registry import TENSOR_CONTAINERS

    dst = _path(path, output=True)
    _check_types(options, format=format)
    if not isinstance(tensors, Mapping):
        raise TypeError(f"tensors must be a mapping of name -> array, not {type(tensors).__name__}")
    _check_text(tensors.keys(), "a tensor name")
    _check_text(metadata, "metadata")
    dst_fmt = destination_format(dst, format)
    container = next((c for c in TENSOR_CONTAINERS if c.format == dst_fmt), None)
    sink_cls = container.io()[1] if container is not None else None
    if sink_cls is None:
        raise UsageError(f"{dst}: save cannot write {dst_fmt}")
    source = _array_source(tensors, metadata or {})
    result = convert_source(source, _Named("<arrays>"), dst, dict(options), dst_fmt=dst_fmt,  # type: ignore[arg-type]
                            sink_cls=sink_cls)  # fmt: skip
    return {**result.summary, "notes": list(result.notes)}


def convert(
    src: str | os.PathLike[str], dst: str | os.PathLike[str], **options: Any
) -> dict[str, Any]:
    """`matrixctl convert SRC DST` with the CLI's options as keywords (`to`, `select`,
    `exclude`, `dtype`, `compress`, `digest`, `meta`, `per_file`, `densify`, `keep_quantized`,
    `atoms`; list options take lists). Returns what `convert --json` prints after
    `schema_version` and `ok`, plus `notes` (the warnings the CLI prints)."""
    from matrixctl import converters as conversions
    from matrixctl.opening import open_sniffed

    src_path, dst_path = _path(src), _path(dst, output=True)
    _check_types(options)
    to = options.pop("to", None)
    names = ("atoms", "select", "exclude", "meta", "per_file", "dtype", "compress", "digest")
    unknown = sorted(set(options) - {*names, "densify", "keep_quantized"})
    if unknown:
        raise UsageError(f"convert() got unknown options: {', '.join(unknown)}")
    given: dict[str, Any] = {name: options.get(name) or None for name in names}
    given["per_file"] = options.get("per_file")
    given["densify"] = options.get("densify") or None
    given["keep_quantized"] = options.get("keep_quantized") or None
    dst_fmt = conversions.destination_format(dst_path, to)
    with open_sniffed(src_path) as (source, src_fmt):
        converter = conversions.find(src_fmt, dst_fmt)
        conversions.check_options(converter, given)
        result = converter.load()(source, dst_path, given)  # type: ignore[arg-type]
    return {
        "input": src_path,
        "output": dst_path,
        "from": src_fmt,
        "to": dst_fmt,
        **result.summary,
        "notes": list(result.notes),
    }


# Checking ---------------------------------------------------------------------------------------


def verify(path: str | os.PathLike[str]) -> FileReport:
    """Every check `matrixctl verify` runs, as its report (the same findings and codes). Never
    raises for a bad input: an unreadable path is a report with `unreadable` set."""
    from matrixctl.validate.engine import examine

    try:
        name = _path(path)
    except InputError as err:  # no file can have this name: a report, as for a missing one
        from matrixctl.findings import from_error

        report = FileReport(str(err.path), None, unreadable=True)
        report.findings.append(from_error(err))
        return report
    return examine(name, scan=True)[0]


def inspect(
    path: str | os.PathLike[str],
    *,
    full: bool = False,
    stats: bool = False,
    ids: str | None = None,
    symbols: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """Exactly the document `matrixctl inspect --json PATH` prints (parsed): `schema_version`,
    `ok`, and `files` with the one entry for `path`. `full`, `stats`, `ids` ("START:COUNT")
    and `symbols` (a π map path) are the CLI's options. Never raises for a bad input; a bad
    option is a UsageError, an unreadable map the error `--symbols` gives."""
    from matrixctl.inspection import inspect_path
    from matrixctl.jsondoc import document
    from matrixctl.validate.ids import IdPreview, parse_range

    if ids is not None and not isinstance(ids, str):
        raise TypeError(f"ids must be a str 'START:COUNT', not {type(ids).__name__}")
    start, count = parse_range(ids)
    smap = None
    if symbols is not None:
        from matrixctl.tokenizers.pi import load_symbol_map

        smap = load_symbol_map(_path(symbols))[0]
    preview = IdPreview(start, count, smap)
    try:
        name = _path(path)
    except InputError as err:  # no file can have this name: a report, as for a missing one
        from matrixctl.findings import from_error
        from matrixctl.inspection import Inspection

        report = FileReport(str(err.path), None, unreadable=True)
        report.findings.append(from_error(err))
        unread = Inspection(str(err.path), report, None, None, stats)
        return document({"files": [unread.entry()]}, ok=False)
    seen = inspect_path(name, full=full, stats=stats, ids=preview)
    return document({"files": [seen.entry()]}, ok=seen.report.exit_code() == 0)


# Tokenizers -------------------------------------------------------------------------------------


class Tokenizer:
    """A π symbol map or an SCX configuration, loaded and checked.

    `encode(text) -> np.ndarray` of token ids, `decode(ids) -> str`, `encode_batch(texts)`.
    `kind` is `"pi"` or `"scx"`. π ids are int64; SCX tokens are uint16 (its stream carries its
    configuration hash first, as `tokenize scx encode` writes it).
    """

    def __init__(self, kind: str, impl: Any, vocab_size: int | None) -> None:
        self.kind = kind
        self._impl = impl
        self.vocab_size = vocab_size

    def encode(self, text: str | bytes) -> np.ndarray:
        if self.kind == "pi":
            if not isinstance(text, str):
                raise UsageError("a π tokenizer encodes str")
            _check_text([text], "the text")
            ids: np.ndarray = self._impl.encode(text)
            return ids
        from matrixctl.tokenizers.scx.api import encode_bytes

        _check_text([text], "the text")
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        return encode_bytes(self._impl, data)

    def encode_batch(self, texts: Iterable[str | bytes]) -> list[np.ndarray]:
        return [self.encode(t) for t in texts]

    def decode_bytes(self, ids: Any) -> bytes:
        import numpy as np

        if self.kind == "pi":
            out: bytes = self._impl.decode_bytes(_ids(ids))
            return out
        from matrixctl.tokenizers.scx.api import iter_decode

        tokens = _ids(ids).astype(np.int64).astype("<u2", casting="unsafe")
        return b"".join(part.tobytes() for part in iter_decode(self._impl, [tokens]))

    def decode(self, ids: Any) -> str:
        """The text of `ids`. Bytes that are not UTF-8 are an error: PI_DECODE_UTF8 for a π
        map, API_DECODE_UTF8 for SCX (`decode_bytes` gives the bytes)."""
        if self.kind == "pi":
            text: str = self._impl.decode(_ids(ids))
            return text
        data = self.decode_bytes(ids)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise FormatError(
                API_DECODE_UTF8, f"decoded bytes are not UTF-8: {exc}", offset=exc.start
            ) from None

    def __repr__(self) -> str:
        return f"<Tokenizer {self.kind} vocab_size={self.vocab_size}>"


API_DECODE_UTF8 = codes.define(
    "API_DECODE_UTF8",
    "Python API: decoded token ids are not UTF-8 text (Tokenizer.decode_bytes gives the bytes).",
    group="api",
)


def load_tokenizer(
    path: str | os.PathLike[str] | None = None, *, trust: Sequence[str] | None = None
) -> Tokenizer:
    """A π symbol map (JSON) or a signed SCX registry, sniffed from its bytes; None: the bundled
    default π map. `trust` names SCX trust files (default: MATRIXCTL_SCX_TRUST), as
    `tokenize scx --trust` does."""
    from matrixctl.opening import open_sniffed

    if path is None:
        from matrixctl.tokenizers.pi import default_map_path

        path = default_map_path()
    name = _path(path)
    with open_sniffed(name) as (_, fmt):
        pass
    if fmt == "pi-symbol-map":
        from matrixctl.tokenizers.pi import Tokenizer as PiTokenizer
        from matrixctl.tokenizers.pi import load_symbol_map

        smap, _raw = load_symbol_map(name)
        return Tokenizer("pi", PiTokenizer(smap), smap.vocab_size)
    if fmt == "scx-registry":
        from matrixctl.tokenizers.scx.api import load_config

        tok, _data = load_config(name, list(trust) if trust else None)
        return Tokenizer("scx", tok, None)
    raise FormatError(
        codes.UNKNOWN_FORMAT,
        f"not a tokenizer (a π symbol map or an SCX registry); format: {fmt}",
        path=name,
        offset=0,
    )


# Ingest packs -----------------------------------------------------------------------------------


def open_pack(path: str | os.PathLike[str], *, verify: bool = False) -> PackDataset:
    """A dataset over an ingest pack, checked on open (`verify=True`: every check of
    `matrixctl verify PACKDIR`, which reads the whole pack). See `matrixctl.dataset`."""
    return PackDataset(_path(path), verify=verify)


# Arguments --------------------------------------------------------------------------------------
# A wrong Python type is a TypeError (as Python's own functions raise); a wrong value of the right
# type is a MatrixError with the CLI's code (docs/api.md, "Errors").


def _path(path: Any, *, output: bool = False) -> str:
    """A path argument as the str the codecs take: bytes and `os.PathLike` are decoded as the
    file system does (undecodable bytes as surrogate escapes); a NUL, which no file name can
    hold, is the missing file it names (IO_NOT_FOUND; IO_WRITE for an output), not Python's
    ValueError."""
    name = os.fsdecode(os.fspath(path))
    if "\0" in name:
        if output:
            raise OutputError(codes.IO_WRITE, "a path cannot hold a NUL byte", path=repr(name))
        raise InputError(
            codes.IO_NOT_FOUND,
            "no such file or folder (a path cannot hold a NUL byte)",
            path=repr(name),
        )
    return name


_TEXT_OPTIONS = ("to", "compress", "digest", "atoms", "quantize", "zt_version")
_LIST_OPTIONS = ("select", "exclude", "dtype", "meta")


def _check_types(options: Mapping[str, Any], **named: Any) -> None:
    """`save`/`convert` options of the CLI's types: text, lists of text, an int for
    `per_file`, a bool for the flags. (Their values are checked where the CLI checks them.)"""
    for key, value in {**options, **named}.items():
        if value is None:
            continue
        if key in (*_TEXT_OPTIONS, "format"):
            ok = isinstance(value, str) or (key == "zt_version" and type(value) is int)
            want = "a str"
        elif key in _LIST_OPTIONS:
            ok = isinstance(value, list | tuple) and all(isinstance(v, str) for v in value)
            want = "a list of str"
        elif key == "per_file":
            ok, want = type(value) is int, "an int"
        elif key in ("densify", "keep_quantized", "sha256"):
            ok, want = isinstance(value, bool), "a bool"
        else:
            continue
        if not ok:
            raise TypeError(f"{key} must be {want}, not {type(value).__name__} ({value!r:.40})")
    meta = options.get("meta")
    if meta is not None:
        _check_text(meta, "meta")


def _check_text(value: Any, what: str) -> None:
    """Text that a file will hold must be Unicode that UTF-8 can encode: a lone surrogate
    (from a non-UTF-8 file name or a cut escape) is a UsageError naming it, not the
    UnicodeEncodeError a codec would raise halfway through a write."""
    items: Iterable[Any]
    if isinstance(value, str):
        items = [value]
    elif isinstance(value, Mapping):
        items = [*value.keys(), *value.values()]
    elif isinstance(value, list | tuple) or what in ("a tensor name", "the text"):
        items = value
    else:
        return
    for item in items:
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise UsageError(
                    f"{what}: {item[:40]!a} is not valid Unicode text (U+"
                    f"{ord(item[exc.start]):04X} at character {exc.start}, a lone surrogate)"
                ) from None
        elif isinstance(item, Mapping | list | tuple):
            _check_text(item, what)


def _ids(ids: Any) -> np.ndarray:
    """Token ids as an integer array (TypeError for anything else, e.g. text or floats)."""
    import numpy as np

    arr = np.asarray(ids)
    if arr.dtype.kind not in "iub" and not (arr.size == 0 and arr.dtype.kind == "f"):
        raise TypeError(f"token ids must be integers, not {arr.dtype}")
    return arr
