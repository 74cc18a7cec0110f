"""The input kinds of `ingest docs`: one module per kind, each registered once.

A kind module defines `KINDS`, a tuple of `Kind` records (one for most modules; `columnar`
holds Parquet and Arrow). A `Kind` says
- how it is recognised: by the name (`names`: suffixes that decide, whatever the bytes;
  `hints`: suffixes the bytes must agree with), by leading bytes (`magics`), or by content
  (`sniff`, asked in `priority` order when the name says nothing);
- how it yields documents: `documents(fp, name, opts, counters)` (`(item, pieces)`), or for a
  kind of one text per document `texts(fp, ...)` (batched through the tokenizer), or, for a
  container read by its footer, `by_path(...)` over the file as stored;
- whether and where a large file can be cut into work units (`cut`: "lines" at line ends,
  "text" at line ends the tokenizer allows, "row-groups"; `ingest/units.py` cuts).

Every module of this package that defines `KINDS` is found at import (the CLI's
`--input-kind` choices come from here): adding a kind is one module plus its tests
(docs/architecture.md, "Adding an input kind"). Compression is not a kind: `compressed.py`
wraps any kind's bytes, recognised by magic (gzip, zstd, xz, bzip2).

Sniffing (docs/formats/ingest-pack.md, "Extraction"; docs/inputs.md): a container magic
decides first; a NUL byte in the first 8 KiB means binary; then a name that states the kind;
then a name that hints it (the first line must agree); then each kind's content sniff; text
otherwise.
"""

from __future__ import annotations

import json as jsonlib  # `json` is a kind module of this package
import pkgutil
from dataclasses import dataclass
from importlib import import_module
from typing import Any

from matrixctl.ingest.kinds.base import CUTS, SNIFF, HashingReader, Kind, Options


def _discover() -> dict[str, Kind]:
    found: list[Kind] = []
    for info in pkgutil.iter_modules(__path__):
        module = import_module(f"{__name__}.{info.name}")
        found.extend(getattr(module, "KINDS", ()))
    found.sort(key=lambda k: (k.priority, k.name))
    registry: dict[str, Kind] = {}
    for kind in found:
        if kind.name in registry or kind.name in ("auto", "binary"):
            raise RuntimeError(f"input kind {kind.name!r} is registered twice or reserved")
        if kind.cut is not None and kind.cut not in CUTS:
            raise RuntimeError(f"input kind {kind.name!r}: unknown cut {kind.cut!r}")
        registry[kind.name] = kind
    return registry


REGISTRY: dict[str, Kind] = _discover()
NAMES: tuple[str, ...] = tuple(REGISTRY)  # the CLI's --input-kind choices, with "auto"
BY_PATH: tuple[str, ...] = tuple(k.name for k in REGISTRY.values() if k.by_path is not None)
_NAMED = {suffix: k.name for k in REGISTRY.values() for suffix in k.names}
_HINTED = {suffix: k.name for k in REGISTRY.values() for suffix in k.hints}
_MAGICS = [(magic, k.name) for k in REGISTRY.values() for magic in k.magics]
_SNIFFS = [(k.sniff, k.name) for k in REGISTRY.values() if k.sniff is not None]


def get(name: str) -> Kind:
    return REGISTRY[name]


def _suffix(name: str) -> str:
    base = name.replace("\\", "/").rsplit("/", 1)[-1].lower()
    dot = base.rfind(".")
    return base[dot:] if dot > 0 else ""


def name_kind(name: str) -> str | None:
    """The kind a file's name states, or None when the name says nothing."""
    return _NAMED.get(_suffix(name))


def name_hint(name: str) -> str | None:
    """The kind a file's name hints (`.json`, `.jsonl`, `.ndjson`): the bytes must agree."""
    return _HINTED.get(_suffix(name))


def strip_compression(name: str) -> str:
    """`corpus.jsonl.gz` -> `corpus.jsonl`: the name a compressed file's content goes by."""
    from matrixctl.ingest.kinds.compressed import SUFFIXES

    suffix = _suffix(name)
    return name[: -len(suffix)] if suffix in SUFFIXES else name


def sniff_kind(head: bytes, name: str) -> str:
    """A kind's name or `binary`: see the module doc for the order of the rules."""
    for magic, kind in _MAGICS:
        if head.startswith(magic):
            return kind
    if b"\0" in head[:SNIFF]:
        return "binary"
    named = name_kind(name) or name_hint(name)
    if named is not None:
        return named
    body = head.removeprefix(b"\xef\xbb\xbf").lstrip()
    for sniff, kind in _SNIFFS:
        if sniff(body):
            return kind
    return "text"


def detect_kind(
    head: bytes, name: str, fp: Any, limit: int, forced: str = "auto"
) -> tuple[str, Any]:
    """The kind of a stream whose first bytes are `head` (already read back into `fp`).

    Where neither the name nor the first byte settle it (a leading `{` or `[` without a
    `.json`/`.jsonl` name), one complete record decides: the first non-blank line is read
    whole (at most `limit` bytes) and parsed. A JSON object is JSON Lines; another complete
    value is JSON; a line the parser rejects before its end (`[ This is a pointer`, `[Unit]`)
    is text; a line that ends before the value does (a pretty-printed `{`) is one JSON
    document. Returns the kind and the reader to extract from (the line given back)."""
    from matrixctl.ingest.kinds.compressed import Prefixed

    if forced != "auto":
        binary = b"\0" in head[:SNIFF] and forced not in BY_PATH
        return ("binary" if binary else forced), fp
    kind = sniff_kind(head, name)
    if kind not in ("json", "jsonl") or name_hint(name) is not None:
        return kind, fp
    lines: list[bytes] = []
    size = 0
    while size <= limit:
        line = fp.readline(limit + 1 - size)
        if not line:
            break
        lines.append(line)
        size += len(line)
        if line.strip() and line.endswith(b"\n"):
            break
    fp = Prefixed(b"".join(lines), fp)
    first = b"".join(lines).removeprefix(b"\xef\xbb\xbf").strip()
    if size > limit or not first:
        return "json", fp
    try:
        value = jsonlib.loads(first)
    except (ValueError, RecursionError) as exc:
        pos = getattr(exc, "pos", None)
        if (
            isinstance(exc, jsonlib.JSONDecodeError)
            and pos is not None
            and pos < len(first.decode("utf-8", "replace"))
        ):
            return "text", fp
        return "json", fp
    return ("jsonl" if isinstance(value, dict) else "json"), fp


@dataclass
class Opened:
    """One input opened for reading: its kind, a stream of its (decompressed) bytes from the
    start, the compression by magic and its decompressor (for its counts), and its head."""

    kind: str
    stream: Any
    compression: str | None
    decompressor: Any
    head: bytes


def open_input(reader: HashingReader, name: str, recorded: str, opts: Options) -> Opened:
    """The one sniff of an input: compression by magic, then the kind by content with the name
    as a hint (`name`: the path, "" for stdin; `recorded`: as errors name it). Every reader
    of an input (the tokenizing step, the cutter of work units) opens it here."""
    from matrixctl.ingest.kinds import compressed

    head = compressed.read_head(reader, SNIFF)
    stream: Any = compressed.Prefixed(head, reader)
    compression = compressed.sniff_compression(head)
    cut = compressed.cut_magic(head, name) if compression is None else None
    if cut is not None:  # the whole file is shorter than the magic its name promises
        from matrixctl.errors import FormatError

        raise FormatError(
            compressed.INGEST_COMPRESSED,
            f"{cut} stream ends inside its magic bytes (truncated: {len(head)} bytes)",
            path=recorded,
            offset=len(head),
            hint="offset into the file as stored",
        )
    dec = None
    if compression is not None:
        buffered, dec = compressed.decompressing(stream, compression, recorded)
        head = compressed.read_head(buffered, SNIFF)
        stream = compressed.Prefixed(head, buffered)
        name = strip_compression(name)
    kind, stream = detect_kind(head, name, stream, opts.max_doc, opts.input_kind)
    return Opened(kind, stream, compression, dec, head)
