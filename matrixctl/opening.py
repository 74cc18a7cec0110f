"""Open any path and tell its format from its bytes: the one sniff-and-open for library code.

A path is a file (mapped, or spooled when it is a pipe), `-` (stdin), or a folder that a folder
format recognises (`formats/registry.py` `directory=` sniffs: an ingest pack, a Hugging Face
model folder, ...). The errors are the CLI's: a missing path is `IO_NOT_FOUND`, a folder no
format claims `UNKNOWN_FOLDER`, bytes no format claims are `UNKNOWN_FORMAT` (with the registry's
explanation when it recognises something matrixctl does not read). The Python API
(`matrixctl.api`), the CLI, the validation engine and `convert` open through here.

Opening a tensor container checks it first (`open_checked`: its format's structural rules, so a
damaged file is refused with the code `verify` reports) and hands the checked parse to the
codec's `TensorSource`: codecs never call back up into validation (docs/architecture.md,
"Layers").
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from matrixctl import codes
from matrixctl.errors import FormatError, InputError, UsageError

if TYPE_CHECKING:
    from matrixctl.io import Folder, Source
    from matrixctl.tensors import TensorSource


def _open_input(path: str, fmt: str | None) -> tuple[Source | Folder, str | None]:
    """`open_path`'s work without the block: the caller closes what it gets."""
    # Names from the module, not the module from its package: `from package import module`
    # runs importlib's Python-level `_handle_fromlist` on every call.
    from matrixctl.formats.registry import sniff, sniff_dir
    from matrixctl.io import Folder, Source

    try:
        src = Source.open(path)
    except InputError as err:
        # A folder: the format that claims it, or UNKNOWN_FOLDER naming what it lacks. Files
        # are the common case: they are opened without a stat of their own first.
        folder = sniff_dir(path) if err.code == codes.IO_IS_DIR else None
        if folder is None:
            raise
        return Folder(path), folder.name
    try:
        return src, fmt or sniff(src)
    except BaseException:
        src.close()
        raise


def _known(src: Source | Folder, fmt: str | None) -> str:
    """`fmt`, or the UNKNOWN_FORMAT error (with what the bytes are when the registry knows)."""
    if fmt is not None:
        return fmt
    from matrixctl.formats import registry
    from matrixctl.io import Source

    known = registry.explain_unknown(src) if isinstance(src, Source) else None
    raise FormatError(
        codes.UNKNOWN_FORMAT,
        known or "format not recognised from its bytes",
        path=src.name,
        offset=0,
    )


@contextlib.contextmanager
def open_path(path: str, fmt: str | None = None) -> Iterator[tuple[Source | Folder, str | None]]:
    """`(opened input, format name or None)` for `path`: a folder a folder format claims is
    a `Folder`, anything else is opened as a `Source` and sniffed (unless `fmt` names its
    format); None when no format claims the bytes. The input is closed when the block ends.
    Opening errors (`IO_NOT_FOUND`, `UNKNOWN_FOLDER`, ...) are raised before the block runs."""
    src, got = _open_input(path, fmt)
    with src:
        yield src, got


@contextlib.contextmanager
def open_sniffed(path: str) -> Iterator[tuple[Source | Folder, str]]:
    """`(opened input, format name)` for `path`; the input is closed when the block ends."""
    src, fmt = _open_input(path, None)
    with src:
        yield src, _known(src, fmt)


def tensor_source_class(fmt: str) -> type[TensorSource] | None:
    """The `TensorSource` class of a tensor container format, or None for other formats."""
    cls = _SOURCE_CLASSES.get(fmt)
    if cls is None:
        from matrixctl.formats.registry import TENSOR_CONTAINERS

        container = next((c for c in TENSOR_CONTAINERS if c.format == fmt), None)
        if container is None:
            return None
        cls = _SOURCE_CLASSES[fmt] = container.io()[0]
    return cls


_SOURCE_CLASSES: dict[str, type[TensorSource] | None] = {}  # format -> its class, once imported


def open_checked(src: Source | Folder, fmt: str, *, scan: bool = False) -> Any:
    """Load `src` with its format's handler and run the structural rules (`scan=True`: every
    rule `verify` runs); raise the first error as a FormatError (the same code `verify`
    reports). Returns the handler's subject."""
    from matrixctl.codes import Severity
    from matrixctl.findings import FileReport
    from matrixctl.validate.engine import handler, run_rules

    mod = handler(fmt)
    subject = mod.load_dir(src.path) if getattr(src, "is_folder", False) else mod.load(src)
    report = FileReport(src.name, fmt)
    run_rules(fmt, subject, report, scan=scan)
    for f in report.findings:
        if f.severity is Severity.ERROR:
            raise FormatError(f.code, f.message, path=src.name, offset=f.offset, field=f.field)
    for f in report.findings:
        if f.code in codes.UNSUPPORTED:
            # The third verdict: intact (verify passes it), but not something to convert.
            err = UsageError(
                f"{f.message} ({f.code})",
                code=CONVERT_NOT_TENSOR,
                hint="verify reports this file intact; matrixctl reads only tensor dtypes",
            )
            err.path, err.offset, err.field = src.name, f.offset, f.field
            raise err
    return subject


CONVERT_NOT_TENSOR = codes.define(
    "CONVERT_NOT_TENSOR",
    "The input is intact (verify passes it), but holds data that is not a tensor matrixctl "
    "converts: a structured, string or datetime .npy, a safetensors dtype matrixctl has no type "
    "for. Nothing was written.",
    group="convert",
)


SOURCE_OPTIONS = ("keep_quantized",)  # options a source class may declare in `accepts`


def open_with_options(
    source_cls: type[TensorSource], src: Source, options: dict[str, Any], src_fmt: str
) -> TensorSource:
    """Check `src` (`open_checked`) and construct the source with the checked parse, handing
    it the options it declares in `accepts` (refusing the others with a usage error before
    anything is read)."""
    accepts = getattr(source_cls, "accepts", ())
    mine = {k: options[k] for k in SOURCE_OPTIONS if options.get(k) is not None}
    for key in mine:
        if key not in accepts:
            flag = "--" + key.replace("_", "-")
            raise UsageError(f"{flag} does not apply to {src_fmt} input")
    checked = open_checked(src, src_fmt)
    if accepts:
        return source_cls(src, checked, mine)  # type: ignore[call-arg]
    return source_cls(src, checked)  # type: ignore[call-arg]


class open_tensors:  # used as a function: `with open_tensors(path) as source:`
    """Any tensor container, sniffed and checked (its structural rules run, so a damaged file
    is refused with the code `verify` reports), opened for reading until the block ends.
    `options` are source options (`keep_quantized`), refused by a source that has none.

    A class rather than a generator: every library read opens through here, and a generator
    context adds its frames to the open and the close of each file."""

    __slots__ = ("_input", "_options", "_path", "_source")

    def __init__(self, path: str, options: dict[str, object] | None = None) -> None:
        self._path = path
        self._options = dict(options or {})
        self._input: Source | Folder | None = None
        self._source: TensorSource | None = None

    def __enter__(self) -> TensorSource:
        src, got = _open_input(self._path, None)
        try:
            fmt = _known(src, got)
            cls = tensor_source_class(fmt)
            if cls is None:
                raise FormatError(
                    codes.UNKNOWN_FORMAT,
                    f"not a tensor container matrixctl reads (format: {fmt})",
                    path=src.name,
                    offset=0,
                )
            source = open_with_options(cls, src, self._options, fmt)  # type: ignore[arg-type]
        except BaseException:
            src.close()
            raise
        self._input, self._source = src, source
        return source

    def __exit__(self, *exc: object) -> None:
        src, source = self._input, self._source
        self._input = self._source = None
        try:
            if source is not None:
                source.close()
        finally:
            if src is not None:
                src.close()
