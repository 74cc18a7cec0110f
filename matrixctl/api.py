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

    def __init__(self, path: str | os.PathLike[str], *, keep_quantized: bool = False) -> None:
        from matrixctl.opening import open_tensors

        self.path = _path(path)
        self._stack = contextlib.ExitStack()
        options: dict[str, object] = {"keep_quantized": True} if keep_quantized else {}
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


def open(path: str | os.PathLike[str], *, keep_quantized: bool = False) -> TensorFile:
    """Open any tensor container (format sniffed from its bytes, structural checks run).
    `keep_quantized=True` keeps GGUF's quantized tensors as raw blocks (not readable as arrays);
    any other keyword is a TypeError."""
    return TensorFile(path, keep_quantized=keep_quantized)


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


def _as_array(name: str, value: Any) -> np.ndarray:
    """`value` as a numpy array without a copy or a cast where numpy can view it. A foreign
    tensor numpy cannot take as it is (a torch bfloat16 tensor: numpy has no bfloat16; one on
    a GPU, or one that requires grad) is a UsageError with a hint, never the foreign library's
    own exception. Duck-typed: torch need not be installed."""
    import numpy as np

    try:
        return np.asarray(value)
    except (TypeError, ValueError, RuntimeError) as exc:
        kind = f"{type(value).__module__}.{type(value).__qualname__}"
        dtype = str(getattr(value, "dtype", ""))
        if "bfloat16" in dtype:
            hint = (
                "numpy has no bfloat16: pass value.float() (an exact widening to f32), or "
                "value.view(torch.int16).numpy().view(ml_dtypes.bfloat16) to store bf16 as it is"
            )
        else:
            hint = "pass a numpy array (for torch: value.detach().cpu().numpy())"
        raise UsageError(
            f"tensor {name!r}: a {kind} of dtype {dtype or '?'} cannot be taken as a numpy "
            f"array without a copy or a cast ({type(exc).__name__}: {str(exc)[:80]})",
            hint=hint,
        ) from None


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
                arr = _as_array(name, value)
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


def _patterns(option: str, value: str | Iterable[str] | None) -> list[str] | None:
    """A repeatable CLI option's keyword: one string or several (a list, a tuple)."""
    if value is None:
        return None
    if not isinstance(value, str | Iterable) or isinstance(value, bytes | Mapping):
        raise TypeError(f"{option} must be a str or a list of str, not {type(value).__name__}")
    items = [value] if isinstance(value, str) else list(value)
    if not all(isinstance(v, str) for v in items):
        raise TypeError(f"{option} must be a str or a list of str, got {value!r:.60}")
    return items or None


def _meta(value: Mapping[str, Any] | Iterable[str] | None) -> list[str] | None:
    """`meta=` as a mapping {key: text} or the CLI's ["KEY=VALUE", ...]."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        items = []
        for key, text in value.items():
            if not isinstance(key, str) or not isinstance(text, str):
                raise TypeError(f"meta maps str keys to str values, got {key!r}: {text!r:.40}")
            if "=" in key:
                raise UsageError(f"meta= keys hold no '=', got {key!r}")
            items.append(f"{key}={text}")
        return items or None
    return _patterns("meta", value)


def _check_scalars(**named: Any) -> None:
    """The API's scalar keywords of a wrong Python type are a TypeError, as Python's own
    functions raise (docs/api.md, "Errors"); their values are checked where the CLI checks
    them."""
    for key, value in named.items():
        if value is None:
            continue
        if key in ("densify", "keep_quantized"):
            ok, want = isinstance(value, bool), "a bool"
        elif key in ("per_file", "zt_version", "vocab_size"):
            ok, want = type(value) is int, "an int"
        else:
            ok, want = isinstance(value, str), "a str"
        if not ok:
            raise TypeError(f"{key} must be {want}, not {type(value).__name__} ({value!r:.40})")


def _options(
    *,
    select: str | Iterable[str] | None,
    exclude: str | Iterable[str] | None,
    dtype: str | Iterable[str] | None,
    meta: Mapping[str, Any] | Iterable[str] | None,
    compress: str | None,
    digest: str | None,
    quantize: str | None,
    per_file: int | None,
    densify: bool,
    keep_quantized: bool = False,
    atoms: str | None = None,
    vocab_size: int | None = None,
) -> dict[str, Any]:
    """The converter's options from the API's keywords, as the CLI gives them (a wrong
    Python type is a TypeError first)."""
    _check_scalars(
        compress=compress,
        digest=digest,
        quantize=quantize,
        per_file=per_file,
        densify=densify,
        keep_quantized=keep_quantized,
        atoms=atoms,
        vocab_size=vocab_size,
    )
    return {
        "atoms": atoms,
        "select": _patterns("select", select),
        "exclude": _patterns("exclude", exclude),
        "meta": _meta(meta),
        "per_file": per_file,
        "dtype": _patterns("dtype", dtype),
        "compress": compress,
        "digest": digest,
        "densify": densify or None,
        "keep_quantized": keep_quantized or None,
        "vocab_size": vocab_size,
        "quantize": quantize.lower() if quantize else None,
    }


def save(
    path: str | os.PathLike[str],
    tensors: Mapping[str, Any],
    *,
    metadata: Mapping[str, Any] | None = None,
    format: str | None = None,
    zt_version: int | None = None,
    compress: str | None = None,
    digest: str | None = None,
    dtype: str | Iterable[str] | None = None,
    select: str | Iterable[str] | None = None,
    exclude: str | Iterable[str] | None = None,
    meta: Mapping[str, Any] | Iterable[str] | None = None,
    quantize: str | None = None,
    per_file: int | None = None,
    densify: bool = False,
) -> dict[str, Any]:
    """Write `tensors` (name -> array) to a container chosen by `format` or the file's suffix
    (`.zt`, `.safetensors`, `.npy`, `.npz`, `.weights`, `.stb`, `.gguf`). Atomic: the file
    appears only complete. The keywords are `convert`'s options (docs/api.md); an unknown one is
    a TypeError. Returns the converter's summary (what `convert --json` reports) and `notes`."""
    from matrixctl.converters import destination_format, ztensor_version
    from matrixctl.converters.tensors import convert_source
    from matrixctl.formats.registry import TENSOR_CONTAINERS

    dst = _path(path, output=True)
    if not isinstance(tensors, Mapping):
        raise TypeError(f"tensors must be a mapping of name -> array, not {type(tensors).__name__}")
    _check_text(tensors.keys(), "a tensor name")
    _check_text(metadata, "metadata")
    _check_text(meta, "meta")
    _check_scalars(format=format, zt_version=zt_version)
    dst_fmt = ztensor_version(destination_format(dst, format), zt_version)
    container = next((c for c in TENSOR_CONTAINERS if c.format == dst_fmt), None)
    sink_cls = container.io()[1] if container is not None else None
    if sink_cls is None:
        raise UsageError(f"{dst}: save cannot write {dst_fmt}")
    options = _options(
        select=select,
        exclude=exclude,
        dtype=dtype,
        meta=meta,
        compress=compress,
        digest=digest,
        quantize=quantize,
        per_file=per_file,
        densify=densify,
    )
    source = _array_source(tensors, metadata or {})
    result = convert_source(source, _Named("<arrays>"), dst, options, dst_fmt=dst_fmt,  # type: ignore[arg-type]
                            sink_cls=sink_cls)  # fmt: skip
    return {**result.summary, "notes": list(result.notes)}


def convert(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    to: str | None = None,
    zt_version: int | None = None,
    select: str | Iterable[str] | None = None,
    exclude: str | Iterable[str] | None = None,
    dtype: str | Iterable[str] | None = None,
    meta: Mapping[str, Any] | Iterable[str] | None = None,
    compress: str | None = None,
    digest: str | None = None,
    quantize: str | None = None,
    keep_quantized: bool = False,
    densify: bool = False,
    per_file: int | None = None,
    vocab_size: int | None = None,
    atoms: str | None = None,
) -> dict[str, Any]:
    """`matrixctl convert SRC DST`: every option of the CLI's is a keyword here (`--zt-version`
    is `zt_version`, ...; repeatable options take a string or a list, `meta` also a mapping);
    an unknown keyword is a TypeError. Returns what `convert --json` prints after
    `schema_version` and `ok`, plus `notes` (the warnings the CLI prints)."""
    from matrixctl import converters as conversions
    from matrixctl.opening import open_sniffed

    src_path, dst_path = _path(src), _path(dst, output=True)
    _check_text(meta, "meta")
    _check_scalars(to=to, zt_version=zt_version)
    given = _options(
        select=select,
        exclude=exclude,
        dtype=dtype,
        meta=meta,
        compress=compress,
        digest=digest,
        quantize=quantize,
        per_file=per_file,
        densify=densify,
        keep_quantized=keep_quantized,
        atoms=atoms,
        vocab_size=vocab_size,
    )
    dst_fmt = conversions.destination_format(dst_path, to)
    with open_sniffed(src_path) as (source, src_fmt):
        dst_fmt = conversions.ztensor_version(dst_fmt, zt_version, src_fmt)
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
    """A π symbol map, an SCX configuration or a model's own tokenizer, loaded and checked.

    `encode(text) -> np.ndarray` of token ids, `decode(ids) -> str`, `encode_batch(texts)`.
    `kind` is `"pi"`, `"scx"` or `"model"`. π and model ids are int64; SCX tokens are uint16
    (its stream carries its configuration hash first, as `tokenize scx encode` writes it).

    A model tokenizer (from a GGUF, an `ingest gguf` folder or a `tokenizer.json`; see
    docs/tokenizers.md) gives exactly the model's ids: `encode(text)` adds no special token
    and parses none (`<|endoftext|>` in a text is text); `encode(text, add_special=True)` adds
    the BOS/EOS the model's metadata asks for. `model` is the underlying
    `matrixctl.tokenizers.model.ModelTokenizer` (family, pre-tokenizer, special ids) and
    `source` where it came from (path, SHA-256).
    """

    def __init__(self, kind: str, impl: Any, vocab_size: int | None, source: Any = None) -> None:
        self.kind = kind
        self._impl = impl
        self.vocab_size = vocab_size
        self.model = impl if kind == "model" else None
        self.source = source

    def encode(self, text: str | bytes, *, add_special: bool = False) -> np.ndarray:
        if self.kind == "model":
            import numpy as np

            if not isinstance(text, str):
                raise UsageError("a model tokenizer encodes str")
            return np.array(self._impl.encode(text, add_special=add_special), dtype=np.int64)
        if add_special:
            raise UsageError("add_special goes with a model tokenizer (π and SCX add none)")
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

    def encode_batch(
        self, texts: Iterable[str | bytes], *, add_special: bool = False
    ) -> list[np.ndarray]:
        return [self.encode(t, add_special=add_special) for t in texts]

    def decode_bytes(self, ids: Any) -> bytes:
        import numpy as np

        if self.kind == "model":
            return bytes(self._impl.decode_bytes(np.asarray(ids, dtype=np.int64).tolist()))
        if self.kind == "pi":
            out: bytes = self._impl.decode_bytes(_ids(ids))
            return out
        from matrixctl.tokenizers.scx.api import iter_decode

        tokens = _ids(ids).astype(np.int64).astype("<u2", casting="unsafe")
        return b"".join(part.tobytes() for part in iter_decode(self._impl, [tokens]))

    def decode(self, ids: Any) -> str:
        """The text of `ids`. Bytes that are not UTF-8 are an error: PI_DECODE_UTF8 for a π
        map, API_DECODE_UTF8 for SCX and model tokenizers (`decode_bytes` gives the bytes)."""
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
        if self.kind == "model":
            m = self._impl
            return f"<Tokenizer model {m.family}/{m.pre} vocab_size={self.vocab_size}>"
        return f"<Tokenizer {self.kind} vocab_size={self.vocab_size}>"


API_DECODE_UTF8 = codes.define(
    "API_DECODE_UTF8",
    "Python API: decoded token ids are not UTF-8 text (Tokenizer.decode_bytes gives the bytes).",
    group="api",
)


def load_tokenizer(
    path: str | os.PathLike[str] | None = None, *, trust: Sequence[str] | None = None
) -> Tokenizer:
    """A π symbol map (JSON), a signed SCX registry or a model's tokenizer (a GGUF file, an
    `ingest gguf` folder, a `tokenizer.json` or a folder holding one), sniffed from its bytes;
    None: the bundled default π map. `trust` names SCX trust files (default:
    MATRIXCTL_SCX_TRUST), as `tokenize scx --trust` does."""
    from matrixctl.opening import open_sniffed
    from matrixctl.tokenizer_files import load_model_tokenizer, sniff_model_source

    if path is None:
        from matrixctl.tokenizers.pi import default_map_path

        path = default_map_path()
    name = _path(path)
    if sniff_model_source(name) is not None:
        model, source = load_model_tokenizer(name)
        return Tokenizer("model", model, model.vocab_size, source)
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
        f"not a tokenizer (a π symbol map, an SCX registry, a GGUF, an ingest gguf folder or "
        f"a tokenizer.json); format: {fmt}",
        path=name,
        offset=0,
    )


# Ingest packs -----------------------------------------------------------------------------------


def open_pack(
    path: str | os.PathLike[str], *, verify: bool = False, dtype: Any = None
) -> PackDataset:
    """A dataset over an ingest pack, checked on open (`verify=True`: every check of
    `matrixctl verify PACKDIR`, which reads the whole pack); `dtype` the id dtype every read
    returns, in new writable arrays (e.g. "int64" for an Embedding). See `matrixctl.dataset`."""
    return PackDataset(_path(path), verify=verify, dtype=dtype)


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
