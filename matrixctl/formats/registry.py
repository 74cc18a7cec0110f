"""Every format matrixctl knows, in one place.

A format is recognised by its leading bytes (never by its file name): an entry names its magic,
or a cheap sniff function over the first bytes. The `handler` module loads, describes and
validates the format (see `matrixctl.validate`); it is imported only when a file of that format
is met, so this module stays cheap to import.

To add a format: write its codec in `matrixctl/formats/`, its handler (load, describe, rules),
and add one `Format(...)` line below.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from matrixctl import codes
from matrixctl.errors import InputError
from matrixctl.formats import hf_tokenizer, ingest_pack, pi_symbol_map
from matrixctl.records import FrozenRecord

if TYPE_CHECKING:
    from matrixctl.io import Source

SNIFF_BYTES = 64

UNKNOWN_FOLDER = codes.define(
    "UNKNOWN_FOLDER",
    "A folder was given where a file or a known folder was expected: it lacks the files that "
    "mark a Hugging Face model folder, an ingest pack or a GGUF ingest folder (the message says "
    "which).",
    group="general",
)


# The sniffers below look at the bytes before importing their codec: a file of another format
# should not pay for importing it (the npz codec imports zipfile, about 10 ms of a convert's
# start-up).


def _sniff_safetensors(head: bytes, size: int) -> bool:
    if head[8:9] not in (b"{", b" ", b"\n", b"\r", b"\t"):  # a u64 size, then the JSON header
        return False
    if any(head[:n] in by_magic for n, by_magic in _MAGICS):
        return False  # another format's magic (a .npy, a GGUF): its bytes say what it is
    from matrixctl.formats.st_container import sniff

    return sniff(head, size)


def _sniff_npz(head: bytes, size: int) -> bool:
    if not head.startswith((b"PK\x03\x04", b"PK\x05\x06")):  # a member, or an empty ZIP
        return False
    from matrixctl.formats.npy import sniff_npz

    return sniff_npz(head, size)


def _sniff_stb_sidecar(head: bytes, size: int) -> bool:
    if b"{" not in head:  # a JSON object
        return False
    from matrixctl.formats.stb import sniff_sidecar

    return sniff_sidecar(head, size)


def _is_mds_dir(path: str) -> bool:
    from matrixctl.formats.mds import is_mds_dir

    return is_mds_dir(path)


def _is_hf_model_dir(path: str) -> bool:
    from matrixctl.formats.hf_model import is_model_dir

    return is_model_dir(path)


class Format(FrozenRecord):
    """One format: `doc` names docs/formats/<doc>.md when it is not named after the format;
    `holds`, for a folder format, the files that mark it (for error lines)."""

    __slots__ = (
        "directory",
        "doc",
        "extensions",
        "handler",
        "holds",
        "magic",
        "name",
        "sniff",
        "title",
    )
    name: str
    title: str
    handler: str
    magic: bytes | None
    sniff: Callable[[bytes, int], bool] | None
    directory: Callable[[str], bool] | None
    extensions: tuple[str, ...]
    doc: str | None
    holds: str | None

    def __init__(
        self,
        name: str,
        title: str,
        handler: str,
        magic: bytes | None = None,
        sniff: Callable[[bytes, int], bool] | None = None,
        directory: Callable[[str], bool] | None = None,
        extensions: tuple[str, ...] = (),
        doc: str | None = None,
        holds: str | None = None,
    ) -> None:
        self._init(name, title, handler, magic, sniff, directory, extensions, doc, holds)

    def matches(self, head: bytes, size: int) -> bool:
        if self.magic is not None:
            return head.startswith(self.magic)
        return self.sniff is not None and self.sniff(head, size)


FORMATS: list[Format] = [
    Format(
        "matrix-atom",
        "MATRIX-ATOM v1 token file",
        "matrixctl.validate.matrix_atom",
        magic=b"MTRXATOM",
        extensions=(".bin", ".atoms"),
    ),
    Format(
        "svgt",
        "SVG-Tensor grid projection",
        "matrixctl.validate.svgt",
        magic=b"SVGTENSR",
        extensions=(".svgt",),
    ),
    Format(
        "token-stream",
        "matrixctl binary token stream",
        "matrixctl.validate.token_stream",
        magic=b"MXTOKENS",
        extensions=(".mxt", ".tokens"),
    ),
    Format(
        "pi-symbol-map",
        "π tokenizer symbol map (JSON)",
        "matrixctl.validate.pi_symbol_map",
        sniff=pi_symbol_map.sniff,
    ),
    Format(
        "doc-index", "ingest pack document index", "matrixctl.validate.doc_index", magic=b"MXDOCIDX"
    ),
    Format(
        "ingest-pack",
        "MATRIX ingest pack (folder)",
        "matrixctl.validate.ingest_pack",
        directory=ingest_pack.is_pack,
        holds="ingest_manifest.json",
    ),
    Format(
        "ztensor",
        "zTensor v1.1",
        "matrixctl.validate.ztensor",
        magic=b"ZTEN1000",
        extensions=(".zt",),
    ),
    Format(
        "safetensors",
        "safetensors",
        "matrixctl.validate.st_container",
        sniff=_sniff_safetensors,
        extensions=(".safetensors",),
    ),
    Format(
        "npy", "NumPy array", "matrixctl.validate.npy", magic=b"\x93NUMPY", extensions=(".npy",)
    ),
    Format(
        "npz",
        "NumPy archive",
        "matrixctl.validate.npz",
        sniff=_sniff_npz,
        extensions=(".npz",),
        doc="npy",
    ),
    Format(
        "ztensor-v2",
        "zTensor v2 (ztensor 2.x)",
        "matrixctl.validate.ztensor2",
        magic=b"\x89ZT2\r\n\x1a\n",
    ),
    Format(
        "scx-registry",
        "SCX tokenizer registry (SCX-TOK-REG-V1)",
        "matrixctl.validate.scx_registry",
        magic=b"SCXTKREG",
        extensions=(".scxr",),
    ),
    Format(
        "scx-manifest",
        "SCX tokenizer manifest (AGL-TOK-MANIFEST-V1)",
        "matrixctl.validate.scx_manifest",
        sniff=lambda head, size: head.startswith(b'{\n  "format": "AGL-TOK-MANIFEST-V1",'),
        extensions=(".json",),
    ),
    Format(
        "scx-shard",
        "SCX shard (a piece of an input cut by `pack shards`)",
        "matrixctl.validate.scx_shard",
        magic=b"SCXSHARD",
        extensions=(".scxs",),
    ),
    Format(
        "embd",
        "EMBD model weights",
        "matrixctl.validate.embd",
        magic=b"EMBD",
        extensions=(".weights",),
    ),
    Format(
        "stb",
        "SVG-Tensor binary (STB0)",
        "matrixctl.validate.stb",
        magic=b"STB0",
        extensions=(".stb",),
    ),
    Format(
        "stb-sidecar",
        "STB sidecar (names, shapes, bin files)",
        "matrixctl.validate.stb_sidecar",
        sniff=_sniff_stb_sidecar,
        doc="stb",
    ),
    Format(
        "hf-tokenizer",
        "Hugging Face tokenizer.json",
        "matrixctl.validate.hf_tokenizer",
        sniff=hf_tokenizer.sniff,
        extensions=(".json",),
    ),
    Format(
        "hf-model-dir",
        "Hugging Face model folder",
        "matrixctl.validate.hf_model",
        directory=_is_hf_model_dir,
        holds="config.json + model.safetensors (or model.safetensors.index.json)",
    ),
    Format("gguf", "GGUF model", "matrixctl.validate.gguf", magic=b"GGUF", extensions=(".gguf",)),
    Format(
        "megatron",
        "Megatron indexed dataset (.idx of a .bin/.idx pair)",
        "matrixctl.validate.megatron",
        magic=b"MMIDIDX\x00\x00",
        extensions=(".idx",),
    ),
    Format(
        "mds",
        "MosaicML MDS dataset (folder)",
        "matrixctl.validate.mds",
        directory=_is_mds_dir,
        holds="index.json with MDS shards",
    ),
    Format(
        "gguf-ingest",
        "GGUF ingest folder (symbol map, tokenizer, embeddings)",
        "matrixctl.validate.gguf_ingest",
        directory=lambda p: os.path.isfile(os.path.join(p, "gguf_manifest.json")),
        holds="gguf_manifest.json",
        doc="gguf",
    ),
]

_BY_NAME = {f.name: f for f in FORMATS}


def get(name: str) -> Format:
    return _BY_NAME[name]


def names() -> list[str]:
    return [f.name for f in FORMATS]


def sniff_bytes(head: bytes, size: int) -> str | None:
    """The first format in `FORMATS` order that claims `head` (a file's first bytes)."""
    # A magic is looked up at once; only the formats told by a function that come before the
    # magic's format in the registry are asked (as the loop over every format would).
    hit = _NO_MAGIC
    for n, by_magic in _MAGICS:
        got = by_magic.get(head[:n])
        if got is not None and got[0] < hit[0]:
            hit = got
    for index, fmt in _SNIFFED:
        if index > hit[0]:
            break
        if fmt.sniff is not None and fmt.sniff(head, size):
            return fmt.name
    return hit[1]


def _magic_tables() -> tuple[tuple[int, dict[bytes, tuple[int, str]]], ...]:
    """(magic length, magic -> (registry index, format)) for every length a magic has; the
    first registered format keeps a magic two formats share."""
    tables: dict[int, dict[bytes, tuple[int, str]]] = {}
    for i, f in enumerate(FORMATS):
        if f.directory is None and f.magic is not None:
            tables.setdefault(len(f.magic), {}).setdefault(f.magic, (i, f.name))
    return tuple(sorted(tables.items()))


_NO_MAGIC: tuple[int, str | None] = (len(FORMATS), None)
_MAGICS = _magic_tables()
_SNIFFED = [(i, f) for i, f in enumerate(FORMATS) if f.directory is None and f.magic is None]


# The one place a name tells the format: bytes no format claims, in a file whose name ends so,
# are reported as that format's damage (its reader names what is wrong: the header size, the
# JSON, the magic), not as unknown bytes. safetensors has no magic: its header is all there is
# to sniff, so a file whose header is broken (not JSON, an array) would otherwise be "unknown";
# a `.npy` whose magic is damaged is reported as a .npy with a bad magic; a ZIP named `.npz`
# whose first member is not an array is read as numpy reads it (an archive of members).
NAMED_FALLBACK = {".safetensors": "safetensors", ".npy": "npy", ".npz": "npz", ".gguf": "gguf"}


def sniff(src: Source) -> str | None:
    got = sniff_bytes(src.head(SNIFF_BYTES), src.size)
    if got is None and src.size:
        ext = os.path.splitext(src.path)[1].lower()
        got = NAMED_FALLBACK.get(ext)
    return got


def sniff_dir(path: str) -> Format | None:
    """The folder format `path` is, or None for files. A folder no format claims is
    UNKNOWN_FOLDER, naming what it lacks (exit 2, like any input that cannot be read)."""
    if not os.path.isdir(path):
        return None
    for fmt in FORMATS:
        if fmt.directory is not None and fmt.directory(path):
            return fmt
    from matrixctl.formats.hf_model import incomplete

    why = incomplete(path)
    if why is None:
        kinds = "; ".join(f"{f.name}: {f.holds}" for f in FORMATS if f.holds is not None)
        why = f"is a folder without the files of any folder format ({kinds})"
    raise InputError(UNKNOWN_FOLDER, why, path=path)


# Known formats matrixctl does not read, recognised so the message can say what the file is.
FOREIGN_MAGIC: list[tuple[bytes, str]] = []
FOREIGN_MAGIC.append(
    (
        b"PK\x03\x04",
        "a ZIP archive that is not a NumPy .npz (a PyTorch checkpoint is never loaded)",
    )
)
FOREIGN_MAGIC += [
    (b"\x80" + bytes([p]), "a Python pickle: never loaded, it could run code") for p in (2, 3, 4, 5)
]


def explain_unknown(src: Source) -> str | None:
    head = src.head(SNIFF_BYTES)
    for magic, text in FOREIGN_MAGIC:
        if head.startswith(magic):
            return text
    return None


class Container(FrozenRecord):
    """A tensor container. Its codec `module` defines `TENSOR_IO = {format: (SourceClass or
    None, SinkClass or None)}` (see `matrixctl.tensors`); `extensions` name output files."""

    __slots__ = ("extensions", "format", "module")
    format: str
    module: str
    extensions: tuple[str, ...]

    def __init__(self, format: str, module: str, extensions: tuple[str, ...] = ()) -> None:
        self._init(format, module, extensions)

    def io(self) -> tuple[Any, Any]:
        classes: tuple[Any, Any] = importlib.import_module(self.module).TENSOR_IO[self.format]
        return classes


# One line per tensor container; `convert` goes from any of them to any other.
TENSOR_CONTAINERS: list[Container] = [
    Container("ztensor", "matrixctl.formats.ztensor", (".zt",)),
    Container("safetensors", "matrixctl.formats.st_container", (".safetensors",)),
    Container("npy", "matrixctl.formats.npy", (".npy",)),
    Container("npz", "matrixctl.formats.npy", (".npz",)),
    Container("ztensor-v2", "matrixctl.formats.ztensor2"),
    Container("embd", "matrixctl.formats.embd", (".weights",)),
    Container("stb", "matrixctl.formats.stb", (".stb",)),
    Container("stb-sidecar", "matrixctl.formats.stb"),
    Container("hf-model-dir", "matrixctl.formats.hf_model"),
    Container("gguf", "matrixctl.formats.gguf_write", (".gguf",)),
]
