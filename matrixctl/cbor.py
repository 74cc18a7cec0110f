"""A strict CBOR decoder and a deterministic encoder, for the zTensor manifest.

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

Indefinite-length strings, arrays and maps (RFC 7049 2.2) are accepted, since the zTensor spec
names RFC 7049 and serde_cbor (the reference implementation's decoder) accepts them; the
encoder never writes them.

The encoder writes the deterministic form of RFC 8949 4.2.1 (which for text keys is also the
canonical form of RFC 7049 3.9): definite lengths, shortest integer heads, map keys sorted by
their encoded bytes, floats in the shortest of f16/f32/f64 that keeps the value exactly.
"""

from __future__ import annotations

import math
import struct
from typing import Any

MAX_DEPTH = 64
MAX_ITEMS = 16_000_000  # ~1.5 GB of Python objects at worst; a 100k-tensor manifest has ~2M

_BREAK = object()


class CborError(ValueError):
    """Malformed or refused CBOR; `offset` is relative to the start of the encoded bytes."""

    def __init__(self, kind: str, message: str, offset: int) -> None:
        super().__init__(message)
        self.kind = kind  # "malformed", "duplicate", "tag", "depth", "limit", "trailing"
        self.message = message
        self.offset = offset


def _half_to_float(bits: int) -> float:
    value: float = struct.unpack("<e", bits.to_bytes(2, "little"))[0]
    return value


class _Decoder:
    """Recursive descent over one bytes object; hot paths (short text, small ints, maps of
    text keys) are inlined, since a manifest is mostly those."""

    def __init__(self, data: bytes, max_items: int) -> None:
        self.data = data
        self.end = len(data)
        self.items = 0
        self.max_items = max_items

    def fail(self, message: str, offset: int, kind: str = "malformed") -> CborError:
        return CborError(kind, message, offset)

    def short(self, pos: int, n: int, what: str) -> CborError:
        return self.fail(
            f"CBOR {what} needs {n} bytes at offset {pos}, only {self.end - pos} left", pos
        )

    def value(self, pos: int, depth: int) -> tuple[Any, int]:
        data = self.data
        if pos >= self.end:
            raise self.short(pos, 1, "item head")
        self.items += 1
        if self.items > self.max_items:
            raise self.fail(
                f"more than {self.max_items:,} CBOR items: refusing to decode further",
                pos,
                "limit",
            )
        start = pos
        initial = data[pos]
        major, info = initial >> 5, initial & 0x1F
        pos += 1
        arg: int | None
        if info < 24:
            arg = info
        elif info < 28:
            size = 1 << (info - 24)
            if pos + size > self.end:
                raise self.short(pos, size, "argument")
            arg = int.from_bytes(data[pos : pos + size], "big")
            pos += size
        elif info == 31 and major in (2, 3, 4, 5, 7):
            arg = None
        else:
            raise self.fail(f"reserved additional information {info} in major type {major}", start)
        if major in (2, 3):
            if arg is None:
                return self.indefinite_string(major, pos)
            end = pos + arg
            if end > self.end:
                raise self.short(pos, arg, "string")
            if major == 2:
                return data[pos:end], end
            try:
                return data[pos:end].decode("utf-8"), end
            except UnicodeDecodeError as exc:
                raise self.fail(
                    f"text string is not valid UTF-8 ({exc.reason})", pos + exc.start
                ) from None
        if major == 0:
            return arg, pos
        if major == 5:
            if depth >= MAX_DEPTH:
                raise self.fail(f"CBOR nesting deeper than {MAX_DEPTH} levels", start, "depth")
            result: dict[str, Any] = {}
            if arg is None:
                while True:
                    if pos >= self.end:
                        raise self.short(pos, 1, "map key or break")
                    if data[pos] == 0xFF:
                        return result, pos + 1
                    pos = self.entry(result, pos, depth)
            # Every entry takes at least two bytes: a count beyond the bytes left is a lie.
            if 2 * arg > self.end - pos:
                raise self.short(pos, 2 * arg, f"map of {arg} entries")
            for _ in range(arg):
                pos = self.entry(result, pos, depth)
            return result, pos
        if major == 4:
            if depth >= MAX_DEPTH:
                raise self.fail(f"CBOR nesting deeper than {MAX_DEPTH} levels", start, "depth")
            out: list[Any] = []
            if arg is None:
                while True:
                    if pos >= self.end:
                        raise self.short(pos, 1, "array item or break")
                    if data[pos] == 0xFF:
                        return out, pos + 1
                    item, pos = self.value(pos, depth + 1)
                    out.append(item)
            if arg > self.end - pos:
                raise self.short(pos, arg, f"array of {arg} items")
            for _ in range(arg):
                # Unsigned items (a shape's dimensions) decoded here, as in entry().
                initial = data[pos] if pos < self.end else 0xFF
                if initial < 0x1C and self.items < self.max_items:
                    self.items += 1
                    if initial < 0x18:
                        out.append(initial)
                        pos += 1
                        continue
                    size = 1 << (initial - 0x18)
                    if pos + 1 + size > self.end:
                        raise self.short(pos + 1, size, "argument")
                    out.append(int.from_bytes(data[pos + 1 : pos + 1 + size], "big"))
                    pos += 1 + size
                    continue
                item, pos = self.value(pos, depth + 1)
                out.append(item)
            return out, pos
        if major == 1:
            assert arg is not None
            return -1 - arg, pos
        if major == 6:
            raise self.fail(f"CBOR tag {arg} is not allowed in a manifest", start, "tag")
        # major 7: simple values and floats
        if info == 20:
            return False, pos
        if info == 21:
            return True, pos
        if info == 22:
            return None, pos
        if info == 25:
            assert arg is not None
            return _half_to_float(arg), pos
        if info == 26:
            return struct.unpack(">f", data[pos - 4 : pos])[0], pos
        if info == 27:
            return struct.unpack(">d", data[pos - 8 : pos])[0], pos
        if info == 31:
            raise self.fail("unexpected CBOR break code", start)
        raise self.fail(f"CBOR simple value {arg} is not allowed in a manifest", start)

    def entry(self, result: dict[str, Any], pos: int, depth: int) -> int:
        data = self.data
        end = self.end
        key_at = pos
        # Short text keys (0x60-0x77) and, below, small unsigned and short text values are
        # decoded here instead of through value(): they are most of a manifest's items. Same
        # checks in the same order, so the same errors at the same offsets.
        initial = data[pos] if pos < end else 0
        if 0x60 <= initial <= 0x77 and self.items < self.max_items:
            self.items += 1
            stop = pos + 1 + initial - 0x60
            if stop > end:
                raise self.short(pos + 1, initial - 0x60, "string")
            try:
                key = data[pos + 1 : stop].decode("utf-8")
            except UnicodeDecodeError as exc:
                raise self.fail(
                    f"text string is not valid UTF-8 ({exc.reason})", pos + 1 + exc.start
                ) from None
            pos = stop
        else:
            key, pos = self.value(pos, depth + 1)
            if type(key) is not str:
                raise self.fail(
                    f"map key is a {type(key).__name__}, manifests use text keys only", key_at
                )
        if key in result:
            raise self.fail(f"duplicate map key {key!r}", key_at, "duplicate")
        initial = data[pos] if pos < end else 0xFF
        if self.items < self.max_items:
            if initial < 0x18:
                self.items += 1
                result[key] = initial
                return pos + 1
            if initial < 0x1C:  # unsigned with a 1, 2, 4 or 8 byte argument
                self.items += 1
                size = 1 << (initial - 0x18)
                stop = pos + 1 + size
                if stop > end:
                    raise self.short(pos + 1, size, "argument")
                result[key] = int.from_bytes(data[pos + 1 : stop], "big")
                return stop
            if 0x60 <= initial <= 0x77:
                self.items += 1
                stop = pos + 1 + initial - 0x60
                if stop > end:
                    raise self.short(pos + 1, initial - 0x60, "string")
                try:
                    result[key] = data[pos + 1 : stop].decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise self.fail(
                        f"text string is not valid UTF-8 ({exc.reason})", pos + 1 + exc.start
                    ) from None
                return stop
        result[key], pos = self.value(pos, depth + 1)
        return pos

    def indefinite_string(self, major: int, pos: int) -> tuple[Any, int]:
        parts: list[bytes] = []
        data = self.data
        while True:
            if pos >= self.end:
                raise self.short(pos, 1, "string chunk")
            if data[pos] == 0xFF:
                pos += 1
                break
            chunk_at = pos
            chunk, pos = self.value(pos, MAX_DEPTH)
            if data[chunk_at] >> 5 != major or data[chunk_at] & 0x1F == 31:
                raise self.fail("bad chunk inside an indefinite-length string", chunk_at)
            parts.append(chunk.encode("utf-8") if major == 3 else chunk)
        raw = b"".join(parts)
        if major == 2:
            return raw, pos
        try:
            return raw.decode("utf-8"), pos
        except UnicodeDecodeError as exc:
            raise self.fail(f"text string is not valid UTF-8 ({exc.reason})", pos) from None


def loads(data: bytes | memoryview, *, max_items: int = MAX_ITEMS) -> Any:
    """Decode exactly one CBOR data item that fills `data`; raise CborError otherwise."""
    decoder = _Decoder(bytes(data), max_items)
    value, pos = decoder.value(0, 0)
    if pos != len(data):
        raise CborError(
            "trailing",
            f"{len(data) - pos} bytes follow the CBOR item inside its declared size",
            pos,
        )
    return value


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


class _Deterministic:
    """Decoder that accepts only the Core Deterministic Encoding of RFC 8949 4.2.1, as the
    zTensor 2 manifest must be: shortest heads, definite lengths, map keys in strictly
    ascending order of their encoded bytes (which also rules out duplicates), floats in the
    shortest width that keeps the value and NaN only as f9 7e00; no tags, no simple values
    other than false, true and null; text map keys only; at most `max_depth` levels of arrays
    and maps counted from the root (the root map is level 1)."""

    def __init__(self, data: bytes, max_depth: int, max_items: int) -> None:
        self.data = data
        self.end = len(data)
        self.items = 0
        self.max_depth = max_depth
        self.max_items = max_items

    def head(self, pos: int) -> tuple[int, int, int, int]:
        """(major, info, argument, position after the head), shortest form enforced."""
        data = self.data
        if pos >= self.end:
            raise CborError("malformed", f"CBOR item head needs a byte at offset {pos}", pos)
        initial = data[pos]
        major, info = initial >> 5, initial & 0x1F
        if info < 24:
            return major, info, info, pos + 1
        if info > 27:
            what = "indefinite length" if info == 31 else f"reserved additional information {info}"
            raise CborError("deterministic", f"{what} is not deterministic CBOR", pos)
        size = 1 << (info - 24)
        if pos + 1 + size > self.end:
            raise CborError(
                "malformed",
                f"CBOR argument needs {size} bytes at offset {pos + 1}, only "
                f"{self.end - pos - 1} left",
                pos,
            )
        arg = int.from_bytes(data[pos + 1 : pos + 1 + size], "big")
        if major != 7 and arg < (24 if size == 1 else 1 << (4 * size)):
            raise CborError(
                "deterministic", f"integer head at offset {pos} is not in its shortest form", pos
            )
        return major, info, arg, pos + 1 + size

    def value(self, pos: int, depth: int) -> tuple[Any, int]:
        self.items += 1
        if self.items > self.max_items:
            raise CborError(
                "limit", f"more than {self.max_items:,} CBOR items: refusing to decode", pos
            )
        start = pos
        major, info, arg, pos = self.head(pos)
        if major == 0:
            return arg, pos
        if major == 1:
            return -1 - arg, pos
        if major in (2, 3):
            end = pos + arg
            if end > self.end:
                raise CborError(
                    "malformed",
                    f"CBOR string of {arg:,} bytes at offset {start} runs past the end",
                    start,
                )
            if major == 2:
                return self.data[pos:end], end
            try:
                return self.data[pos:end].decode("utf-8"), end
            except UnicodeDecodeError as exc:
                raise CborError(
                    "malformed", f"text string is not valid UTF-8 ({exc.reason})", pos + exc.start
                ) from None
        if major in (4, 5):
            if depth >= self.max_depth:
                raise CborError(
                    "depth",
                    f"nesting deeper than {self.max_depth} levels from the manifest root",
                    start,
                )
            if major == 4:
                if arg > self.end - pos:
                    raise CborError(
                        "malformed", f"array of {arg:,} items at offset {start} cannot fit", start
                    )
                out: list[Any] = []
                for _ in range(arg):
                    item, pos = self.value(pos, depth + 1)
                    out.append(item)
                return out, pos
            if 2 * arg > self.end - pos:
                raise CborError(
                    "malformed", f"map of {arg:,} entries at offset {start} cannot fit", start
                )
            result: dict[str, Any] = {}
            prev: bytes | None = None
            for _ in range(arg):
                key_at = pos
                key, pos = self.value(pos, depth + 1)
                if type(key) is not str:
                    raise CborError(
                        "key", f"map key is a {type(key).__name__}: only text keys", key_at
                    )
                encoded = self.data[key_at:pos]
                if prev is not None and encoded <= prev:
                    kind = "duplicate" if encoded == prev else "order"
                    what = "duplicate map key" if encoded == prev else "map keys out of order at"
                    raise CborError(kind, f"{what} {key!r}", key_at)
                prev = encoded
                result[key], pos = self.value(pos, depth + 1)
            return result, pos
        if major == 6:
            raise CborError("tag", f"CBOR tag {arg} is not allowed in a manifest", start)
        # major 7
        if info == 20:
            return False, pos
        if info == 21:
            return True, pos
        if info == 22:
            return None, pos
        if info in (25, 26, 27):
            raw = self.data[start:pos]
            value: float = (
                _half_to_float(arg)
                if info == 25
                else struct.unpack(">f" if info == 26 else ">d", raw[1:])[0]
            )
            if _float(value) != raw:
                raise CborError(
                    "deterministic",
                    f"float at offset {start} is not in its shortest exact form "
                    "(or is a NaN other than f9 7e00)",
                    start,
                )
            return value, pos
        raise CborError("simple", f"CBOR simple value {arg} is not allowed in a manifest", start)


def loads_deterministic(
    data: bytes | memoryview, *, max_depth: int = DETERMINISTIC_DEPTH, max_items: int = MAX_ITEMS
) -> Any:
    """Decode exactly one item in deterministic CBOR (see `_Deterministic`); CborError else."""
    raw = bytes(data)
    fast = _fast_deterministic(raw, max_depth, max_items)
    if fast is not None:
        return fast[0]
    decoder = _Deterministic(raw, max_depth, max_items)
    value, pos = decoder.value(0, 0)
    if pos != len(raw):
        raise CborError(
            "trailing", f"{len(raw) - pos} bytes follow the CBOR item inside its length", pos
        )
    return value


def _plain(value: Any, depth: int, max_depth: int, floats: list[float]) -> int:
    """Items in `value` (keys counted, as `_Deterministic` counts them) when it holds only what
    a deterministic manifest may hold: text-keyed maps whose keys ascend in the order of their
    encoded bytes, arrays, text, bytes, u64/negative ints, floats (collected in `floats`), bool
    and null, containers at most `max_depth` levels deep. -1 when it holds anything else."""
    kind = type(value)
    if kind is dict:
        if depth >= max_depth:
            return -1
        count = 1
        prev: tuple[int, bytes] | None = None
        for key, item in value.items():
            if type(key) is not str:
                return -1
            encoded = key.encode("utf-8")
            # Encoded text keys order by length first (the head holds it), then bytewise.
            this = (len(encoded), encoded)
            if prev is not None and this <= prev:
                return -1
            prev = this
            got = _plain(item, depth + 1, max_depth, floats)
            if got < 0:
                return -1
            count += 1 + got
        return count
    if kind is list:
        if depth >= max_depth:
            return -1
        count = 1
        for item in value:
            got = _plain(item, depth + 1, max_depth, floats)
            if got < 0:
                return -1
            count += got
        return count
    if kind is int:
        return 1 if -(1 << 64) <= value < 1 << 64 else -1  # a bignum tag decodes to an int
    if kind is float:
        floats.append(value)
        return 1
    if kind in (str, bytes, bool) or value is None:
        return 1
    return -1


def _fast_deterministic(raw: bytes, max_depth: int, max_items: int) -> tuple[Any] | None:
    """`(value,)` when cbor2's compiled decoder reads `raw` into plain data that encodes back to
    exactly `raw`, which proves `raw` deterministic: cbor2 writes shortest heads and definite
    lengths, `_plain` checks the key order, types, integer range, depth and item count, and the
    byte comparison rules out tags, duplicate keys, trailing bytes and any other spelling.
    None when any step fails: `_Deterministic` then decodes `raw` and names the problem."""
    import cbor2

    try:
        value = cbor2.loads(raw)
    except Exception:  # any refusal: the strict decoder reports it
        return None
    floats: list[float] = []
    items = _plain(value, 0, max_depth, floats)
    if items < 0 or items > max_items:
        return None
    try:
        # Without canonical, cbor2 writes every float as a double: canonical is the shortest
        # exact form (and sorts keys, already checked), needed only when floats are present.
        if cbor2.dumps(value, canonical=bool(floats)) != raw:
            return None
        # ... and cbor2's shortest form of each float must be the one `_Deterministic` wants.
        if any(cbor2.dumps(f, canonical=True) != _float(f) for f in floats):
            return None
    except Exception:
        return None
    return (value,)
