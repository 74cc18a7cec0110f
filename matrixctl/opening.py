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
from matrixctl.errors import FormatError, UsageError
from matrixctl.io import STDIO

if TYPE_CHECKING:
    from matrixctl.io import Folder, Source
    from matrixctl.tensors import TensorSource


@contextlib.contextmanager
def open_path(path: str, fmt: str | None = None) -> Iterator[tuple[Source | Folder, str | None]]:
    """`(opened input, format name or None)` for `path`: a folder a folder format claims is
    a `Folder`, anything else is opened as a `Source` and sniffed (unless `fmt` names its
    format); None when no format claims the bytes. The input is closed when the block ends.
    Opening errors (`IO_NOT_FOUND`, `UNKNOWN_FOLDER`, ...) are raised before the block runs."""
    from matrixctl.formats import registry
    from matrixctl.io import Folder, Source

    folder = registry.sniff_dir(path) if path != STDIO else None
    with Folder(path) if folder is not None else Source.open(path) as src:
        if folder is not None:
            yield src, folder.name
        else:
            yield src, fmt or registry.sniff(src)  # type: ignore[arg-type]


@contextlib.contextmanager
def open_sniffed(path: str) -> Iterator[tuple[Source | Folder, str]]:
    """`(opened input, format name)` for `path`; the input is closed when the block ends."""
    from matrixctl.formats import registry
    from matrixctl.io import Source

    with open_path(path) as (src, fmt):
        if fmt is None:
            known = registry.explain_unknown(src) if isinstance(src, Source) else None
            raise FormatError(
                codes.UNKNOWN_FORMAT,
                known or "format not recognised from its bytes",
                path=src.name,
                offset=0,
            )
        yield src, fmt


def tensor_source_class(fmt: str) -> type[TensorSource] | None:
    """The `TensorSource` class of a tensor container format, or None for other formats."""
    from matrixctl.formats.registry import TENSOR_CONTAINERS

    container = next((c for c in TENSOR_CONTAINERS if c.format == fmt), None)
    if container is None:
        return None
    cls: type[TensorSource] | None = container.io()[0]
    return cls


def open_checked(src: Source | Folder, fmt: str) -> Any:
    """Load `src` with its format's handler and run the structural rules; raise the first error
    as a FormatError (the same code `verify` reports). Returns the handler's subject."""
    from matrixctl.codes import Severity
    from matrixctl.findings import FileReport
    from matrixctl.validate.engine import handler, run_rules

    mod = handler(fmt)
    subject = mod.load_dir(src.path) if getattr(src, "is_folder", False) else mod.load(src)
    report = FileReport(src.name, fmt)
    run_rules(fmt, subject, report, scan=False)
    for f in report.findings:
        if f.severity is Severity.ERROR:
            raise FormatError(f.code, f.message, path=src.name, offset=f.offset, field=f.field)
    return subject


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


@contextlib.contextmanager
def open_tensors(path: str, options: dict[str, object] | None = None) -> Iterator[TensorSource]:
    """Any tensor container, sniffed and checked (its structural rules run, so a damaged file
    is refused with the code `verify` reports), opened for reading until the block ends.
    `options` are source options (`keep_quantized`), refused by a source that has none."""
    with open_sniffed(path) as (src, fmt):
        cls = tensor_source_class(fmt)
        if cls is None:
            raise FormatError(
                codes.UNKNOWN_FORMAT,
                f"not a tensor container matrixctl reads (format: {fmt})",
                path=src.name,
                offset=0,
            )
        source = open_with_options(cls, src, dict(options or {}), fmt)  # type: ignore[arg-type]
        try:
            yield source
        finally:
            source.close()
