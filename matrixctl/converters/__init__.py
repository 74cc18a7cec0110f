"""The converters of `matrixctl convert`: one registry of converters between formats.

A converter is found by (source format, destination format). The source format is sniffed from
the file's bytes; the destination format comes from `--to` or, failing that, from the output
file's extension (an output has no bytes to sniff yet). Each converter is a function
`convert(source, dst_path, options) -> Result` in a module imported only when used; `source` is
the opened input (`matrixctl.io.Source`), so stdin works too.

Tensor containers need no converter per pair: each container is one line of
`TENSOR_CONTAINERS` (in `matrixctl/formats/registry.py`) naming its `TensorSource` and/or
`TensorSink` class (see `matrixctl.tensors`), and `matrixctl.converters.tensors` converts any
source into any sink.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from matrixctl import codes
from matrixctl.errors import UsageError
from matrixctl.formats.registry import TENSOR_CONTAINERS, Container
from matrixctl.records import FrozenRecord, Record

if TYPE_CHECKING:
    from matrixctl.io import Source

CONVERT_UNSUPPORTED = codes.define(
    "CONVERT_UNSUPPORTED", "No converter exists between the two formats.", group="convert"
)


class Result(Record):
    """What a conversion did, for the command to report (never printed by the converter)."""

    __slots__ = ("notes", "summary")

    def __init__(
        self, summary: dict[str, Any] | None = None, notes: list[str] | None = None
    ) -> None:
        self.summary: dict[str, Any] = {} if summary is None else summary
        self.notes: list[str] = [] if notes is None else notes


ConvertFn = Callable[["Source", str, dict[str, Any]], Result]


class Converter(FrozenRecord):
    """A converter from `src` to `dst`: `target` is "module:function"."""

    __slots__ = ("dst", "options", "src", "target")
    src: str
    dst: str
    target: str
    options: tuple[str, ...]

    def __init__(self, src: str, dst: str, target: str, options: tuple[str, ...] = ()) -> None:
        self._init(src, dst, target, options)

    def load(self) -> ConvertFn:
        module, _, name = self.target.partition(":")
        fn: ConvertFn = getattr(importlib.import_module(module), name)
        return fn


class TensorConverter(Converter):
    """Any tensor container to any other, through `matrixctl.converters.tensors`."""

    __slots__ = ("sink_cls", "source_cls")
    source_cls: Any
    sink_cls: Any

    def __init__(
        self,
        src: str,
        dst: str,
        target: str,
        options: tuple[str, ...] = (),
        source_cls: Any = None,
        sink_cls: Any = None,
    ) -> None:
        self._init(src, dst, target, options, source_cls, sink_cls)

    def load(self) -> ConvertFn:
        import functools

        from matrixctl.converters import tensors

        fn: ConvertFn = functools.partial(
            tensors.convert,
            src_fmt=self.src,
            dst_fmt=self.dst,
            source_cls=self.source_cls,
            sink_cls=self.sink_cls,
        )
        return fn


TENSOR_OPTIONS: tuple[str, ...] = ("select", "dtype", "compress", "digest", "densify", "progress")
TENSOR_OPTIONS += ("exclude", "meta", "per_file", "keep_quantized", "quantize")

IDS_OPTIONS: tuple[str, ...] = ("dtype", "vocab_size")

CONVERTERS: list[Converter] = [
    Converter("svgt", "svg", "matrixctl.converters.svg:svgt_to_svg", options=("atoms",)),
    # Token ids <-> .npy (matrixctl.converters.ids): 1-D for a stream, atoms x atom_size for atoms.
    Converter("token-stream", "npy", "matrixctl.converters.ids:stream_to_npy"),
    Converter("matrix-atom", "npy", "matrixctl.converters.ids:atoms_to_npy"),
    Converter("npy", "token-stream", "matrixctl.converters.ids:npy_to_stream", IDS_OPTIONS),
    Converter("npy", "matrix-atom", "matrixctl.converters.ids:npy_to_atoms", IDS_OPTIONS),
    # An ingest pack to the dataset formats trainers read (matrixctl.converters.training).
    Converter("ingest-pack", "megatron", "matrixctl.converters.training:pack_to_megatron"),
    Converter("ingest-pack", "mds", "matrixctl.converters.training:pack_to_mds"),
    Converter("ingest-pack", "hf-parquet", "matrixctl.converters.training:pack_to_hf_parquet"),
    # ...and back into a pack: written by the pack builder, so the targets are in ingest/
    # (named here, imported only when used; docs/training.md).
    Converter("megatron", "ingest-pack", "matrixctl.ingest.imports:megatron_to_pack"),
    Converter("mds", "ingest-pack", "matrixctl.ingest.imports:mds_to_pack"),
]


# Destination format by output extension (outputs only: inputs are always sniffed).
OUTPUT_EXTENSIONS: dict[str, str] = {".svg": "svg", ".mxt": "token-stream", ".bin": "matrix-atom"}

# Short names `--to` takes besides a format's name and its output extensions (zt, weights, ...).
TO_ALIASES: dict[str, str] = {"st": "safetensors", "pack": "ingest-pack"}


def _writable() -> dict[str, Container]:
    """The containers convert can write: those whose codec has a sink (imports each codec, so
    only on the way to a conversion or an error, never at start-up)."""
    return {c.format: c for c in TENSOR_CONTAINERS if c.io()[1] is not None}


def writable_formats() -> dict[str, list[str]]:
    """Every format convert can write, with the other names `--to` accepts for it (its output
    extensions without the dot, and TO_ALIASES): derived from the registries, so a container
    that gains a sink is offered everywhere by itself."""
    names: dict[str, list[str]] = {c.dst: [] for c in CONVERTERS}
    for ext, fmt in OUTPUT_EXTENSIONS.items():
        names.setdefault(fmt, []).append(ext[1:])
    for c in _writable().values():
        names.setdefault(c.format, []).extend(e[1:] for e in c.extensions)
    for alias, fmt in TO_ALIASES.items():
        if fmt in names:
            names[fmt].append(alias)
    return {fmt: sorted(set(alt) - {fmt}) for fmt, alt in sorted(names.items())}


def describe_writable() -> str:
    """`embd (or weights), ..., ztensor (or zt)`: what convert writes, for help and errors."""
    return ", ".join(
        f"{fmt} (or {', '.join(alt)})" if alt else fmt for fmt, alt in writable_formats().items()
    )


def destination_format(dst: str, to: str | None) -> str:
    if to:
        for name, alt in writable_formats().items():
            if to.lower() == name or to.lower() in alt:
                return name
        readable = {c.format for c in TENSOR_CONTAINERS} | {c.src for c in CONVERTERS}
        if to in readable:
            raise UsageError(
                f"convert reads {to} but cannot write it",
                code=CONVERT_UNSUPPORTED,
                hint=f"--to takes one of: {describe_writable()}",
            )
        raise UsageError(
            f"--to {to!r} is not a format convert can write",
            hint=f"--to takes one of: {describe_writable()}",
        )
    ext = os.path.splitext(dst)[1].lower()
    fmt = OUTPUT_EXTENSIONS.get(ext)
    for c in TENSOR_CONTAINERS:  # imports only the codec the extension names (start-up time)
        if fmt is None and ext in c.extensions and c.io()[1] is not None:
            fmt = c.format
    if fmt is None:
        raise UsageError(
            f"cannot tell the output format from {dst!r}",
            hint=f"name it with one of {', '.join(sorted(_extensions()))} or pass --to FORMAT",
        )
    return fmt


def ztensor_version(dst_fmt: str, version: int | None, src_fmt: str | None = None) -> str:
    """`--zt-version` picks the zTensor container; without it a `.zt` output is v2 when the
    input is v2 (a v2 file stays v2) and v1.1 otherwise (docs/formats/ztensor2.md)."""
    if dst_fmt not in ("ztensor", "ztensor-v2"):
        if version is not None:
            raise UsageError(f"--zt-version applies to zTensor output only, not {dst_fmt}")
        return dst_fmt
    if version is None:
        return "ztensor-v2" if src_fmt == "ztensor-v2" else dst_fmt
    if version not in (1, 2):
        raise UsageError(f"--zt-version must be 1 or 2, got {version}")
    return "ztensor" if version == 1 else "ztensor-v2"


def _extensions() -> list[str]:
    return [*OUTPUT_EXTENSIONS, *(e for c in _writable().values() for e in c.extensions)]


def find(src_fmt: str, dst_fmt: str) -> Converter:
    for conv in CONVERTERS:
        if conv.src == src_fmt and conv.dst == dst_fmt:
            return conv
    containers = {c.format: c for c in TENSOR_CONTAINERS}
    if src_fmt in containers and dst_fmt in containers:
        source_cls = containers[src_fmt].io()[0]
        sink_cls = containers[dst_fmt].io()[1]
        if source_cls is not None and sink_cls is not None:
            return TensorConverter(
                src_fmt,
                dst_fmt,
                "matrixctl.converters.tensors:convert",
                TENSOR_OPTIONS,
                source_cls=source_cls,
                sink_cls=sink_cls,
            )
    sources = sorted({c.src for c in CONVERTERS if c.dst == dst_fmt})
    if dst_fmt in containers:
        sources = sorted(c.format for c in TENSOR_CONTAINERS if c.io()[0] is not None)
        if containers[dst_fmt].io()[1] is None:
            sources = []
        sources = sorted({*sources, *(c.src for c in CONVERTERS if c.dst == dst_fmt)})
    raise UsageError(
        f"cannot convert {src_fmt} to {dst_fmt}",
        code=CONVERT_UNSUPPORTED,
        hint=f"{dst_fmt} can be made from: {', '.join(sources) or 'nothing yet'}",
    )


def check_options(conv: Converter, options: dict[str, Any]) -> None:
    for name, value in options.items():
        if value is not None and name not in conv.options:
            flag = "--" + name.replace("_", "-")
            raise UsageError(f"{flag} does not apply to {conv.src} -> {conv.dst}")
