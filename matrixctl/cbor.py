"""Strict CBOR decoders and a deterministic encoder, for the zTensor manifests.

The decoders are compiled (`matrixctl/_cbor_kernel.c`; this module is their API): `loads` for
zTensor v1 manifests, `loads_deterministic` for zTensor 2 manifests, which must also be in the
deterministic encoding. The encoder is Python.

Why not a general CBOR library: a manifest comes from an untrusted file and every structure in it
decides which bytes are read later, so the decoder must

- check every declared length and count against the bytes actually left before it allocates or
  loops (a 9-byte head can declare 2**64 items);
- refuse what has no place in a manifest and could make two readers disagree: duplicate map keys
  (one reader keeps the first, another the last), tags (semantic tags turn into foreign objects),
  non-text map keys, undefined and reserved simple values;
- bound the nesting depth and the total number of items, so decoding time and memory stay
  proportional to a sane manifest whatever the file declares;
- say where a problem is: every error carries the byte offset (relative to the start of the
  encoded data; callers add the manifest's offset in the file).

Indefinite-length strings, arrays and maps (RFC 7049 2.2) are accepted by `loads`, since the
zTensor spec names RFC 7049 and serde_cbor (the reference implementation's decoder) accepts
them; the encoder never writes them. A chunk of an indefinite-length string must be a definite
string of the same type; a chunk is decoded as an item before its type is checked (so a chunk
that is a tag is refused as a tag, one that is an array as too deep), and a chunk that is itself
an indefinite-length string is refused as a bad chunk at the head of the innermost one.

The encoder writes the deterministic form of RFC 8949 4.2.1 (which for text keys is also the
canonical form of RFC 7049 3.9): definite lengths, shortest integer heads, map keys sorted by
their encoded bytes, floats in the shortest of f16/f32/f64 that keeps the value exactly.
"""

from __future__ import annotations

import math
import struct
from typing import Any

from matrixctl import _cbor_kernel

MAX_DEPTH = 64
MAX_ITEMS = 16_000_000  # ~1.5 GB of Python objects at worst; a 100k-tensor manifest has ~2M


class CborError(ValueError):
    """Malformed or refused CBOR; `offset` is relative to the start of the encoded bytes."""

    def __init__(self, kind: str, message: str, offset: int) -> None:
        super().__init__(message)
        # "malformed", "duplicate", "tag", "depth", "limit", "trailing"; the deterministic
        # decoder adds "deterministic", "order", "key", "simple"
        self.kind = kind
        self.message = message
        self.offset = offset


def loads(data: bytes | memoryview, *, max_items: int = MAX_ITEMS) -> Any:
    """Decode exactly one CBOR data item that fills `data`; raise CborError otherwise."""
    return _cbor_kernel.loads(data, max_items, MAX_DEPTH, CborError)


# Encoder ------------------------------------------------------------------------------------


def _head(major: int, arg: int) -> bytes:
    if arg < 24:
        return bytes([(major << 5) | arg])
    if arg < 0x100:
        return bytes([(major << 5) | 24, arg])
    if arg < 0x10000:
        return bytes([(major << 5) | 25]) + arg.to_bytes(2, "big")
    if arg < 0x1_0000_0000:
        return bytes([(major << 5) | 26]) + arg.to_bytes(4, "big")
    if arg < 1 << 64:
        return bytes([(major << 5) | 27]) + arg.to_bytes(8, "big")
    raise ValueError(f"integer {arg} does not fit a CBOR head (64 bits)")


def _float(value: float) -> bytes:
    if math.isnan(value):
        return b"\xf9\x7e\x00"  # the one canonical NaN
    for fmt, code in (("<e", 0xF9), ("<f", 0xFA)):
        try:
            packed = struct.pack(fmt, value)
        except OverflowError:
            continue
        if struct.unpack(fmt, packed)[0] == value:
            return bytes([code]) + packed[::-1]
    return b"\xfb" + struct.pack(">d", value)


_KEYS: dict[str, bytes] = {}  # encoded map keys (a manifest repeats "dtype", "offset", ...)
_SMALL = [bytes([n]) for n in range(24)]  # unsigned integers below 24: the head alone


def _first(entry: tuple[bytes, Any]) -> bytes:
    return entry[0]


def _encode(value: Any, out: list[bytes]) -> None:
    if value is None:
        out.append(b"\xf6")
    elif value is True:
        out.append(b"\xf5")
    elif value is False:
        out.append(b"\xf4")
    elif isinstance(value, int):
        out.append(_head(0, value) if value >= 0 else _head(1, -1 - value))
    elif isinstance(value, float):
        out.append(_float(value))
    elif isinstance(value, str):
        raw = value.encode("utf-8")
        out.append(_head(3, len(raw)))
        out.append(raw)
    elif isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        out.append(_head(2, len(raw)))
        out.append(raw)
    elif isinstance(value, list | tuple):
        out.append(_head(4, len(value)))
        for item in value:
            _encode(item, out)
    elif isinstance(value, dict):
        entries = []
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"manifest map keys must be text, got {type(key).__name__}")
            encoded = _KEYS.get(key)
            if encoded is None:
                raw = key.encode("utf-8")
                encoded = _head(3, len(raw)) + raw
                if len(_KEYS) < 1024:
                    _KEYS[key] = encoded
            entries.append((encoded, item))
        entries.sort(key=_first)
        out.append(_head(5, len(entries)))
        for encoded, item in entries:
            out.append(encoded)
            if type(item) is int and 0 <= item < 24:
                out.append(_SMALL[item])
            else:
                _encode(item, out)
    else:
        raise TypeError(f"cannot encode {type(value).__name__} as CBOR")


def dumps(value: Any) -> bytes:
    """Deterministic CBOR (RFC 8949 4.2.1) of JSON-like data with text map keys."""
    out: list[bytes] = []
    _encode(value, out)
    return b"".join(out)


# Deterministic decoder (zTensor 2) ----------------------------------------------------------

DETERMINISTIC_DEPTH = 32


def loads_deterministic(
    data: bytes | memoryview, *, max_depth: int = DETERMINISTIC_DEPTH, max_items: int = MAX_ITEMS
) -> Any:
    """Decode exactly one item that fills `data` and is in the Core Deterministic Encoding of
    RFC 8949 4.2.1, as the zTensor 2 manifest must be: shortest heads, definite lengths, map
    keys in strictly ascending order of their encoded bytes (which also rules out duplicates),
    floats in the shortest width that keeps the value exactly (`_float`'s choice) and NaN only
    as f9 7e00; no tags, no simple values other than false, true and null; text map keys only;
    at most `max_depth` levels of arrays and maps counted from the root (the root map is level
    1). Raise CborError otherwise."""
    return _cbor_kernel.loads_deterministic(data, max_depth, max_items, CborError)
