"""zTensor 2: the footer and the manifest (spec 2, 3 and 8): the L0 checks (`read_footer`,
`read_manifest`) and the lenient parse of the objects and parts (`parse`)."""

from __future__ import annotations

import operator
from typing import Any

from matrixctl import cbor
from matrixctl.errors import FormatError
from matrixctl.findings import Problem
from matrixctl.formats.ztensor2.layout import (
    _SHARD_RE,
    ALIGN,
    FOOTER,
    FOOTER_SIZE,
    LOGICAL,
    MAGIC,
    MAX_MANIFEST,
    MAX_NAME,
    MAX_RANK,
    MIN_SIZE,
    STORAGE,
    U64,
    VERSION,
    ZT2_CBOR,
    ZT2_DECODED_LENGTH,
    ZT2_DIGEST_FORMAT,
    ZT2_DTYPE,
    ZT2_MAGIC,
    ZT2_MANIFEST_BOUNDS,
    ZT2_MANIFEST_HASH,
    ZT2_NAME,
    ZT2_PARTS,
    ZT2_SCHEMA,
    ZT2_SHAPE,
    ZT2_SHARD,
    ZT2_TRUNCATED,
    ZT2_VERSION,
    Footer,
    Obj,
    Part,
    Zt2File,
    shown,
)
from matrixctl.formats.ztensor2.parts import parse_digest
from matrixctl.tensors import (
    element_count,
)


def read_footer(buf: Any, size: int, *, end: int | None = None) -> Footer:
    """The footer ending at `end` (EOF by default) after the L0 checks (spec 2.1-2.3, 8 steps
    1-4): size, both magics, version, manifest bounds and cap. The hash is checked by
    `read_manifest`."""
    end = size if end is None else end
    if end < MIN_SIZE:
        raise FormatError(
            ZT2_TRUNCATED,
            f"file is {end} bytes; magic and footer alone need {MIN_SIZE}",
            offset=end,
            field="footer",
        )
    if bytes(buf[:8]) != MAGIC:
        raise FormatError(
            ZT2_MAGIC, "the file does not start with the zTensor 2 magic", offset=0, field="magic"
        )
    at = end - FOOTER_SIZE
    moff, mlen, mhash, version, reserved, magic = FOOTER.unpack(bytes(buf[at:end]))
    if magic != MAGIC:
        raise FormatError(
            ZT2_MAGIC,
            "the last 8 bytes are not the zTensor 2 magic: the footer is not at EOF (a truncated "
            "file or a crashed append; there is no recovery)",
            offset=end - 8,
            field="footer.magic",
        )
    if version != VERSION:
        raise FormatError(
            ZT2_VERSION,
            f"footer version {version}: this reader knows version 2 only",
            offset=at + 24,
            field="footer.version",
        )
    f = Footer(at, moff, mlen, mhash, version, reserved)
    if mlen == 0:
        if moff or mhash:
            raise FormatError(
                ZT2_MANIFEST_BOUNDS,
                f"manifest_length is 0 (a data shard) but manifest_offset is {moff} and "
                f"manifest_hash 0x{mhash:016x}: a data shard has all three zero",
                offset=at,
                field="footer.manifest_offset",
            )
        return f
    if mlen > MAX_MANIFEST:
        raise FormatError(
            ZT2_MANIFEST_BOUNDS,
            f"manifest_length {mlen:,} exceeds the 1 GiB cap: refusing to read it",
            offset=at + 8,
            field="footer.manifest_length",
        )
    if moff % ALIGN or moff < ALIGN:
        raise FormatError(
            ZT2_MANIFEST_BOUNDS,
            f"manifest_offset {moff:,} is not a multiple of 4096 at or above 4096",
            offset=at,
            field="footer.manifest_offset",
        )
    if moff + mlen > at:
        raise FormatError(
            ZT2_MANIFEST_BOUNDS,
            f"manifest bytes {moff:,}..{moff + mlen:,} run past the data region, which ends at "
            f"the footer ({at:,})",
            offset=at,
            field="footer.manifest_length",
        )
    return f


def manifest_hash(data: Any) -> int:
    import xxhash

    value: int = xxhash.xxh3_64_intdigest(data)
    return value


def read_manifest(buf: Any, f: Footer) -> dict[str, Any]:
    """The manifest map: hash checked, deterministic CBOR decoded (spec 8 steps 4-5)."""
    if f.manifest_length == 0:
        return {}
    raw = memoryview(buf)[f.manifest_offset : f.manifest_offset + f.manifest_length]
    try:
        got = manifest_hash(raw)
        if got != f.manifest_hash:
            raise FormatError(
                ZT2_MANIFEST_HASH,
                f"manifest XXH3-64 is 0x{got:016x}, the footer says 0x{f.manifest_hash:016x}",
                offset=f.offset + 16,
                field="footer.manifest_hash",
            )
        try:
            root = cbor.loads_deterministic(raw)
        except cbor.CborError as err:
            raise FormatError(
                ZT2_CBOR,
                f"manifest: {err.message}",
                offset=f.manifest_offset + err.offset,
                field="manifest",
            ) from None
    finally:
        raw.release()
    if not isinstance(root, dict):
        raise FormatError(
            ZT2_SCHEMA,
            f"the manifest is a CBOR {type(root).__name__}, not a map",
            offset=f.manifest_offset,
            field="manifest",
        )
    return root


def _uint(value: Any) -> bool:
    return type(value) is int and 0 <= value < U64


def _uint_list(values: list[Any]) -> bool:
    """Whether every item is a u64 (`_uint`): one loop, no generator (a shape per object)."""
    for v in values:  # noqa: SIM110
        if type(v) is not int or not 0 <= v < U64:
            return False
    return True


def name_problem(name: str) -> str | None:
    """Why `name` breaks the name rules of spec 3.5 (None: it does not)."""
    if not name:
        return "is empty"
    if "\x00" in name:
        return "contains U+0000"
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME:
        return f"is longer than {MAX_NAME} bytes"
    return None


def parse(buf: Any, size: int, *, end: int | None = None) -> Zt2File:
    """Footer, manifest and schema. Raises FormatError when nothing can be checked; other
    problems are collected in `problems` (the object concerned is left out of `objects`)."""
    end = size if end is None else end
    f = read_footer(buf, size, end=end)
    root = read_manifest(buf, f)
    zt = Zt2File(end, f, {}, {}, {})
    if f.manifest_length == 0:
        return zt
    at = f.manifest_offset
    probs = zt.problems

    def bad(code: str, message: str, where: str) -> None:
        probs.append(Problem(code, message, at, where))

    objects = root.get("objects")
    if not isinstance(objects, dict):
        raise FormatError(
            ZT2_SCHEMA, "the manifest has no map 'objects' (required)", offset=at, field="objects"
        )
    if "attributes" in root:
        zt.attributes = _attributes(root["attributes"], "attributes", bad) or {}
    shards = root.get("shards")
    if shards is not None:
        if not isinstance(shards, dict):
            bad(ZT2_SCHEMA, f"'shards' is not a map but {_cbor_kind(shards)}", "shards")
        else:
            for name, entry in shards.items():
                where = f"shards/{name}"
                if not _SHARD_RE.fullmatch(name):
                    bad(
                        ZT2_NAME,
                        f"shard name {shown(name, 80)} is not allowed: a shard name is 1-64 "
                        "bytes of A-Z a-z 0-9 . _ - and does not start with '.'",
                        where,
                    )
                    continue
                if not isinstance(entry, dict):
                    bad(
                        ZT2_SHARD,
                        f"shard {name!r}: entry is not a map but {_cbor_kind(entry)}",
                        where,
                    )
                    continue
                if not _uint(entry.get("size")) or not isinstance(entry.get("digest"), str):
                    bad(ZT2_SHARD, f"shard {name!r}: size (u64) and digest (text) required", where)
                    continue
                try:
                    parse_digest(entry["digest"])
                except ValueError as exc:
                    bad(ZT2_DIGEST_FORMAT, f"shard {name!r}: digest is malformed: {exc}", where)
                    continue
                zt.shards[name] = entry
    # Blob order: by the first offset of the object's parts in this file (0 without one),
    # then by name.
    keyed: list[tuple[int, str, Obj]] = []
    for name, obj in objects.items():
        got = _object(name, obj, shards, bad)
        if got is not None:
            first: int | None = None
            for p in got.parts.values():
                if p.shard is None and (first is None or p.offset < first):
                    first = p.offset
            keyed.append((first or 0, got.name, got))
    keyed.sort(key=_by_first_two)
    zt.objects = {name: o for _, name, o in keyed}
    return zt


_by_first_two = operator.itemgetter(0, 1)


def _cbor_kind(value: Any) -> str:
    """What a manifest value is, in CBOR's words, for a message ("an array", "a text")."""
    kinds = ((bool, "a bool"), (int, "an integer"), (float, "a float"), (str, "a text"),
             (bytes, "a byte string"), (list, "an array"), (dict, "a map"))  # fmt: skip
    if value is None:
        return "null"
    return next((name for cls, name in kinds if isinstance(value, cls)), type(value).__name__)


def _attributes(value: Any, where: str, bad: Any) -> dict[str, Any] | None:
    if not isinstance(value, dict):
        bad(ZT2_SCHEMA, f"{where} is not a map but {_cbor_kind(value)}", where)
        return None
    for key in value:
        why = name_problem(key)
        if why:
            bad(ZT2_NAME, f"attribute key {shown(key, 60)} {why}", f"{where}/{key}")
            return None
    return value


def _object(name: str, obj: Any, shards: Any, bad: Any) -> Obj | None:
    where = f"objects/{name}"
    # A name of at most MAX_NAME / 4 characters without U+0000 is allowed (name_problem);
    # anything else is asked.
    if not (type(name) is str and name and len(name) * 4 <= MAX_NAME and "\x00" not in name):
        why = name_problem(name)
        if why:
            bad(ZT2_NAME, f"object name {shown(name, 60)} {why}", where)
            return None
    if not isinstance(obj, dict):
        bad(ZT2_SCHEMA, f"object {name!r}: not a map", where)
        return None
    shape = obj.get("shape")
    if type(shape) is not list or not _uint_list(shape):
        bad(
            ZT2_SCHEMA,
            f"object {name!r}: shape must be an array of u64, got {shown(shape, 60)}",
            f"{where}/shape",
        )
        return None
    if len(shape) > MAX_RANK:
        bad(ZT2_SHAPE, f"object {name!r}: rank {len(shape)} exceeds 64", f"{where}/shape")
        return None
    if element_count(shape) >= U64:
        bad(
            ZT2_SHAPE,
            f"object {name!r}: element count of {shown(shape, 60)} overflows u64",
            f"{where}/shape",
        )
        return None
    layout = obj.get("layout")
    if not isinstance(layout, str):
        bad(ZT2_SCHEMA, f"object {name!r}: 'layout' (text) is required", f"{where}/layout")
        return None
    attributes: dict[str, Any] = {}
    if "attributes" in obj:
        got = _attributes(obj["attributes"], f"{where}/attributes", bad)
        if got is None:
            return None
        attributes = got
    parts = obj.get("parts")
    if not isinstance(parts, dict):
        bad(ZT2_SCHEMA, f"object {name!r}: 'parts' (map) is required", f"{where}/parts")
        return None
    if not parts:
        bad(ZT2_PARTS, f"object {name!r}: parts is empty", f"{where}/parts")
        return None
    out: dict[str, Part] = {}
    for role, part in parts.items():
        p = _part(name, role, part, shards, bad)
        if p is None:
            return None
        out[role] = p
    return Obj(name, tuple(shape), layout, out, attributes)


def _part(name: str, role: str, part: Any, shards: Any, bad: Any) -> Part | None:
    where = f"objects/{name}/parts/{role}"
    # A part of this file without a logical type or an encoding, every field well-formed (the
    # decoder gives exact types: bool is not an int), is made at once; anything else goes
    # through the checks below, which say what is wrong. A name of at most MAX_NAME / 4
    # characters cannot exceed MAX_NAME bytes in UTF-8.
    if (
        type(part) is dict
        and type(role) is str
        and role
        and len(role) * 4 <= MAX_NAME
        and "\x00" not in role
        and type(dtype := part.get("dtype")) is str
        and dtype in STORAGE
        and type(blob := part.get("blob")) is list
        and len(blob) == 2
        and type(offset := blob[0]) is int
        and 0 <= offset < U64
        and type(length := blob[1]) is int
        and 0 <= length < U64
        and ((digest := part.get("digest")) is None or type(digest) is str)
        and _PLAIN_KEYS.issuperset(part)
    ):
        return Part(name, role, dtype, None, offset, length, None, None, None, digest, where)
    why = name_problem(role)
    if why:
        bad(ZT2_NAME, f"{name}: part name {shown(role, 60)} {why}", where)
        return None
    if not isinstance(part, dict):
        bad(ZT2_SCHEMA, f"{name}/{role}: part is not a map but {_cbor_kind(part)}", where)
        return None
    dtype = part.get("dtype")
    if not isinstance(dtype, str) or dtype not in STORAGE:
        bad(
            ZT2_DTYPE,
            f"{name}/{role}: dtype {shown(dtype, 40)} is not one of the 12 storage types",
            f"{where}/dtype",
        )
        return None
    ltype = part.get("type")
    if ltype is not None and not isinstance(ltype, str):
        bad(ZT2_SCHEMA, f"{name}/{role}: type is not text", f"{where}/type")
        return None
    if ltype in LOGICAL and LOGICAL[ltype][0] != dtype:
        bad(
            ZT2_DTYPE,
            f"{name}/{role}: logical type {ltype} requires dtype {LOGICAL[ltype][0]}, not {dtype}",
            f"{where}/dtype",
        )
        return None
    blob = part.get("blob")
    if not isinstance(blob, list) or len(blob) != 2:
        bad(
            ZT2_SCHEMA,
            f"{name}/{role}: blob must be an array of exactly two u64 [offset, length], got "
            f"{shown(blob, 60)}",
            f"{where}/blob",
        )
        return None
    if not all(_uint(v) for v in blob):
        bad(
            ZT2_SCHEMA,
            f"{name}/{role}: blob values must be u64, got {shown(blob, 60)}",
            f"{where}/blob",
        )
        return None
    shard = part.get("shard")
    if shard is not None:
        if not isinstance(shard, str):
            bad(ZT2_SCHEMA, f"{name}/{role}: shard is not text", f"{where}/shard")
            return None
        if not isinstance(shards, dict) or shard not in shards:
            bad(
                ZT2_SHARD,
                f"{name}/{role}: shard {shown(shard, 60)} is not in the shard table",
                f"{where}/shard",
            )
            return None
    encoding = part.get("encoding")
    if encoding is not None and not isinstance(encoding, str):
        bad(ZT2_SCHEMA, f"{name}/{role}: encoding is not text", f"{where}/encoding")
        return None
    decoded = part.get("decoded_length")
    if (encoding is None) != (decoded is None):
        what = "without an encoding" if encoding is None else f"missing for encoding {encoding}"
        bad(ZT2_DECODED_LENGTH, f"{name}/{role}: decoded_length {what}", f"{where}/decoded_length")
        return None
    if decoded is not None and not _uint(decoded):
        bad(ZT2_SCHEMA, f"{name}/{role}: decoded_length is not a u64", f"{where}/decoded_length")
        return None
    digest = part.get("digest")
    if digest is not None and not isinstance(digest, str):
        bad(ZT2_SCHEMA, f"{name}/{role}: digest is not text", f"{where}/digest")
        return None
    return Part(name, role, dtype, ltype, blob[0], blob[1], shard, encoding, decoded, digest, where)


# The keys of a part `_part` makes at once: any other key (a type, a shard, an encoding, a
# decoded length, or one it does not know) takes the checks.
_PLAIN_KEYS = frozenset(("dtype", "blob", "digest"))
