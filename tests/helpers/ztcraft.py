"""Build zTensor files by hand for tests (valid and hostile), with cbor2 as the CBOR encoder so
the manifests do not come from the code under test."""

from __future__ import annotations

import struct
from typing import Any

import cbor2

MAGIC = b"ZTEN1000"


def blob_file(
    objects: dict[str, tuple[dict[str, Any], dict[str, tuple[dict[str, Any], bytes]]]],
    *,
    attributes: dict[str, Any] | None = None,
    version: str = "1.1.0",
    manifest: Any = None,
    pad_byte: int = 0,
) -> bytes:
    """objects: name -> (object fields without components, role -> (component fields, bytes)).
    Blobs are laid out 64-aligned in order; `offset`/`length` in a component override."""
    out = bytearray(MAGIC)
    objs: dict[str, Any] = {}
    for name, (fields, comps) in objects.items():
        cd = {}
        for role, (cfields, data) in comps.items():
            out += bytes([pad_byte]) * ((-len(out)) % 64)
            c = dict(cfields)
            c.setdefault("offset", len(out))
            c.setdefault("length", len(data))
            out += data
            cd[role] = c
        o = dict(fields)
        o["components"] = cd
        objs[name] = o
    root: dict[str, Any] = {"version": version, "objects": objs}
    if attributes is not None:
        root["attributes"] = attributes
    raw = cbor2.dumps(root if manifest is None else manifest)
    return bytes(out) + raw + struct.pack("<Q", len(raw)) + MAGIC


def dense(shape: list[int], dtype: str, data: bytes, **comp: Any) -> tuple[dict, dict]:
    return {"shape": shape, "format": "dense"}, {"data": ({"dtype": dtype, **comp}, data)}


def with_manifest(raw_manifest: bytes, body: bytes = MAGIC + bytes(56)) -> bytes:
    return body + raw_manifest + struct.pack("<Q", len(raw_manifest)) + MAGIC
