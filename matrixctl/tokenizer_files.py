"""The files a model tokenizer comes from, opened in one place (docs/tokenizers.md, "Loading").

A model tokenizer (`matrixctl.tokenizers.model`) is built from plain data: a GGUF's metadata as
Python values, or a parsed Hugging Face `tokenizer.json`. This module finds that data at a path
and says where it came from:

- a GGUF file, vocabulary-only or a whole model (only the `tokenizer.*` keys and
  `general.architecture`/`general.name` are read; tensors are never touched);
- an `ingest gguf` output folder (its symbol map holds the tokens in GGUF order, its
  `gguf_tokenizer.json` every other tokenizer key; both are checked against the folder's
  manifest before use);
- a `tokenizer.json`, or a folder holding one (a Hugging Face model folder).

`ModelSource` is picklable (a Dask worker builds the tokenizer from it) and records the source's
SHA-256: of the GGUF or `tokenizer.json` read, and for an `ingest gguf` folder, of the GGUF it was
made from (its manifest says). The tokenizer codecs never open files; the layers above
(`ingest docs --tokenizer`, `tokenize model`, `matrixctl.load_tokenizer`) open them here.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from matrixctl import codes
from matrixctl.errors import FormatError, InputError, from_os_error

if TYPE_CHECKING:
    from matrixctl.tokenizers.model.base import ModelTokenizer

TOKENIZER_SOURCE = codes.define(
    "TOKENIZER_SOURCE",
    "A model tokenizer path is not a GGUF file, an `ingest gguf` folder, a tokenizer.json or a "
    "folder holding one, or its files disagree with their manifest.",
    group="tokenizer",
)

MAX_TOKENIZER_JSON = (
    1 << 30
)  # a tokenizer.json larger than this is refused (the largest are ~30 MB)
HF_TOKENIZER = "tokenizer.json"
GGUF_MANIFEST = "gguf_manifest.json"
GGUF_SIDECAR = "gguf_tokenizer.json"
GGUF_SYMBOLS = "pi_symbol_map.json"
GENERAL_KEYS = ("general.architecture", "general.name")


@dataclass
class ModelSource:
    """Where a model tokenizer comes from and the data it is built from.

    - `path`: the path as given; `kind`: "gguf", "gguf-ingest" or "tokenizer.json";
    - `sha256` (`sha256:<hex>`) and `size`: of the GGUF or tokenizer.json read (for an
      `ingest gguf` folder, of the GGUF it was made from, as its manifest records). A GGUF's
      digest is computed on first use (a whole model is gigabytes: a one-line encode does not
      wait for it), from the file, which must still have the size and modification time it
      had when its metadata was read (IO_CHANGED otherwise);
    - `data`: the GGUF metadata as plain values, or the parsed tokenizer.json.
    """

    path: str
    kind: str
    digest: str | None
    size: int
    data: Any
    stat: tuple[int, int] | None = None  # the GGUF's (size, mtime_ns) when read

    @property
    def sha256(self) -> str:
        if self.digest is None:
            self.digest = _file_digest(self.path, self.stat)
        return self.digest

    def build(self) -> ModelTokenizer:
        """The tokenizer (TOKENIZER_UNSUPPORTED names a family or pre-tokenizer matrixctl does
        not implement exactly; TOKENIZER_VOCAB a missing or malformed key)."""
        from matrixctl.tokenizers.model.load import from_gguf_kv, from_tokenizer_json

        try:
            if self.kind == "tokenizer.json":
                return from_tokenizer_json(self.data)
            return from_gguf_kv(self.data)
        except FormatError as err:
            err.path = err.path or self.path
            raise

    def record(self, tok: ModelTokenizer) -> dict[str, Any]:
        """What a pack's manifest says of the tokenizer that made it (`verify` checks it)."""
        return {
            "kind": self.kind,
            "path": self.path,
            "sha256": self.sha256,
            "bytes": self.size,
            "family": tok.family,
            "pre_tokenizer": tok.pre,
            "follows": tok.source,
            "vocab_size": tok.vocab_size,
            "bos_id": tok.bos_id,
            "eos_id": tok.eos_id,
            "unk_id": tok.unk_id,
            "pad_id": tok.pad_id,
        }


def sniff_model_source(path: str) -> str | None:
    """ "gguf", "gguf-ingest" or "tokenizer.json" when `path` looks like one (magic, folder
    marker or file name; nothing is parsed), else None."""
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, GGUF_MANIFEST)):
            return "gguf-ingest"
        if os.path.isfile(os.path.join(path, HF_TOKENIZER)):
            return "tokenizer.json"
        return None
    try:
        with open(path, "rb") as fp:
            head = fp.read(64)
    except OSError:
        return None
    from matrixctl.formats import hf_tokenizer
    from matrixctl.formats.gguf_constants import MAGIC
    from matrixctl.formats.registry import SNIFF_BYTES

    if head.startswith(MAGIC):
        return "gguf"
    if os.path.basename(path) == HF_TOKENIZER or hf_tokenizer.sniff(head[:SNIFF_BYTES], 0):
        return "tokenizer.json"
    return None


def open_model_source(path: str | os.PathLike[str]) -> ModelSource:
    """The model tokenizer data at `path` (see the module's docstring), checked to be there
    and readable; the tokenizer itself is made by `ModelSource.build`."""
    name = os.fspath(path)
    if not os.path.lexists(name):
        raise InputError(codes.IO_NOT_FOUND, "no such file or folder", path=name)
    kind = sniff_model_source(name)
    if kind == "gguf":
        return _from_gguf(name)
    if kind == "gguf-ingest":
        return _from_gguf_folder(name)
    if kind == "tokenizer.json":
        file = os.path.join(name, HF_TOKENIZER) if os.path.isdir(name) else name
        return _from_tokenizer_json(name, file)
    raise FormatError(
        TOKENIZER_SOURCE,
        "not a model tokenizer: expected a GGUF file, an `ingest gguf` folder, a tokenizer.json "
        "or a folder holding one",
        path=name,
        offset=None if os.path.isdir(name) else 0,
    )


def load_model_tokenizer(path: str | os.PathLike[str]) -> tuple[ModelTokenizer, ModelSource]:
    source = open_model_source(path)
    return source.build(), source


# GGUF ----------------------------------------------------------------------------------------


def gguf_tokenizer_kv(gf: Any, buf: Any) -> dict[str, Any]:
    """The tokenizer keys of a parsed GGUF as plain values: strings as `str` (bytes that are not
    UTF-8 as surrogate escapes, so none is lost), arrays as lists, scalars as int, float or bool.
    """
    from matrixctl.formats import gguf as gguf_format
    from matrixctl.formats.gguf_constants import BOOL, SCALARS, STRING

    out: dict[str, Any] = {}
    for kv in gf.kvs.values():
        name = kv.name
        if not (name.startswith("tokenizer.") or name in GENERAL_KEYS):
            continue
        value = kv.value
        if isinstance(value, bytes):
            out[name] = value.decode("utf-8", "surrogateescape")
        elif isinstance(value, gguf_format.GgufArray):
            if value.item_type == STRING:
                out[name] = _strings(value, buf)
            elif value.item_type in SCALARS and value.item_type != BOOL:
                out[name] = value.numpy(buf).tolist()
            else:
                out[name] = value.values(buf)
        elif kv.vtype == BOOL:
            out[name] = bool(value)
        else:
            out[name] = value
    return out


def _strings(arr: Any, buf: Any) -> list[str]:
    """A GGUF string array as `str`s (surrogate escapes for bytes that are not UTF-8): the
    items joined by NUL in one copy and decoded at once when no item holds a NUL (a vocabulary
    of 128k tokens and 280k merges in milliseconds), else item by item."""
    if arr.count == 0:
        return []
    joined = arr.joined(buf)
    if joined.count(b"\x00") == arr.count - 1:
        return joined.decode("utf-8", "surrogateescape").split("\x00")
    return [s.decode("utf-8", "surrogateescape") for s in arr.strings(buf)]


def _from_gguf(path: str) -> ModelSource:
    from matrixctl.formats import gguf as gguf_format
    from matrixctl.io import Source

    try:
        st = os.stat(path)  # before the read: the digest, made later, must be of these bytes
    except OSError as exc:
        raise from_os_error(exc, path) from None
    with Source.open(path) as src:
        gf = gguf_format.parse(src.buf, src.size)
        kv = gguf_tokenizer_kv(gf, src.buf)
        size = src.size
    if "tokenizer.ggml.model" not in kv:
        raise FormatError(
            TOKENIZER_SOURCE,
            "the GGUF has no tokenizer (no tokenizer.ggml.model key)",
            path=path,
            field="tokenizer.ggml.model",
        )
    return ModelSource(path, "gguf", None, size, kv, (st.st_size, st.st_mtime_ns))


def _file_digest(path: str, stat: tuple[int, int] | None) -> str:
    from matrixctl.io import IO_CHANGED, sha256_file

    def same() -> bool:
        try:
            st = os.stat(path)
        except OSError:
            return False
        return stat is None or (st.st_size, st.st_mtime_ns) == stat

    if not same():
        raise InputError(IO_CHANGED, "changed since its tokenizer was read", path=path)
    try:
        digest = sha256_file(path)
    except OSError as exc:
        raise from_os_error(exc, path) from None
    if not same():
        raise InputError(IO_CHANGED, "changed while it was hashed", path=path)
    return digest


def _read(path: str, limit: int) -> bytes:
    try:
        with open(path, "rb") as fp:
            data = fp.read(limit + 1)
    except OSError as exc:
        raise from_os_error(exc, path) from None
    if len(data) > limit:
        raise FormatError(TOKENIZER_SOURCE, f"larger than {limit:,} bytes", path=path, offset=0)
    return data


def _json(path: str, data: bytes) -> Any:
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise FormatError(TOKENIZER_SOURCE, f"not JSON: {exc}", path=path, offset=0) from None


def _from_tokenizer_json(given: str, file: str) -> ModelSource:
    data = _read(file, MAX_TOKENIZER_JSON)
    obj = _json(file, data)
    if not isinstance(obj, dict) or not isinstance(obj.get("model"), dict):
        raise FormatError(
            TOKENIZER_SOURCE, "not a tokenizer.json (no model object)", path=file, field="model"
        )
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    return ModelSource(given, "tokenizer.json", digest, len(data), obj)


def _from_gguf_folder(folder: str) -> ModelSource:
    """The GGUF's tokenizer keys, put back together from an `ingest gguf` folder: the tokens
    from the symbol map (symbol i is GGUF token i, its text the token's; the byte run
    <0x00>..<0xFF> from the map's byte fallback; tokens that are not UTF-8 from the sidecar's
    hex), every other tokenizer key from the sidecar, the architecture
    and name from the manifest. Each file read must have the SHA-256 the manifest records."""
    manifest_path = os.path.join(folder, GGUF_MANIFEST)
    manifest = _json(manifest_path, _read(manifest_path, 64 << 20))
    try:
        files = manifest["files"]
        source = manifest["source"]
        gguf_info = manifest.get("gguf") or {}
        digest, size = str(source["sha256"]), int(source["bytes"])
    except (KeyError, TypeError, ValueError):
        raise FormatError(
            TOKENIZER_SOURCE, "the manifest lacks files or source", path=manifest_path
        ) from None
    docs: dict[str, Any] = {}
    for name in (GGUF_SIDECAR, GGUF_SYMBOLS):
        path = os.path.join(folder, name)
        data = _read(path, 1 << 30)
        want = files.get(name, {}).get("sha256") if isinstance(files, dict) else None
        got = "sha256:" + hashlib.sha256(data).hexdigest()
        if want != got:
            raise FormatError(
                TOKENIZER_SOURCE,
                f"{name} has SHA-256 {got}, the folder's manifest says {want}",
                path=path,
                field=f"files.{name}.sha256",
            )
        docs[name] = _json(path, data)
    sidecar, smap = docs[GGUF_SIDECAR], docs[GGUF_SYMBOLS]
    try:
        kv: dict[str, Any] = dict(sidecar["metadata"])
        n = int(smap["vocab_size"])
        tokens = [""] * n
        for sym in smap["symbols"]:
            tokens[int(sym["id"])] = sym["text"]
        if smap.get("byte_fallback"):  # the run <0x00>..<0xFF> is the map's byte fallback
            base = int(smap["byte_base_id"])
            for b in range(256):
                tokens[base + b] = f"<0x{b:02X}>"
        for sid, hexed in (sidecar.get("not_utf8_tokens") or {}).items():
            tokens[int(sid)] = bytes.fromhex(hexed).decode("utf-8", "surrogateescape")
    except (KeyError, TypeError, ValueError, IndexError):
        raise FormatError(
            TOKENIZER_SOURCE,
            "the symbol map or gguf_tokenizer.json lacks the tokens or metadata",
            path=folder,
        ) from None
    kv["tokenizer.ggml.tokens"] = tokens
    for key, field in (("general.architecture", "architecture"), ("general.name", "name")):
        if isinstance(gguf_info.get(field), str):
            kv[key] = gguf_info[field]
    return ModelSource(folder, "gguf-ingest", digest, size, kv)
