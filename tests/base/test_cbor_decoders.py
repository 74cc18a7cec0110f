"""The strict CBOR decoders (`cbor.loads`, zTensor v1; `cbor.loads_deterministic`, zTensor 2;
compiled in matrixctl/_cbor_kernel.c): what they accept, and every refusal with its kind,
message and offset (the messages and offsets are those of the Python decoders they replaced;
the zTensor codes carry them to the user with the manifest's offset added)."""

from __future__ import annotations

import math
import mmap
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies

from matrixctl import cbor

NEST65 = "81" * 65 + "00"
MAPS65 = "a16161" * 65 + "00"
CUT = "CBOR {} needs {} bytes at offset {}, only {} left"
BAD_CHUNK = "bad chunk inside an indefinite-length string"
SIMPLE = "CBOR simple value {} is not allowed in a manifest"
KEY = "map key is a {}, manifests use text keys only"
U64 = 2**64 - 1

V1_REFUSED = {
    "empty": ("", "malformed", CUT.format("item head", 1, 0, 0), 0),
    "item head cut": ("a16161", "malformed", CUT.format("item head", 1, 3, 0), 3),
    "argument cut": ("1900", "malformed", CUT.format("argument", 2, 1, 1), 1),
    "string cut": ("6261", "malformed", CUT.format("string", 2, 1, 1), 1),
    "string of 2**64-1": ("7bffffffffffffffff", "malformed", CUT.format("string", U64, 9, 0), 9),
    "array of 2**64-1": (
        "9bffffffffffffffff",
        "malformed",
        CUT.format(f"array of {U64} items", U64, 9, 0),
        9,
    ),
    "map of 2**64-1": (
        "bbffffffffffffffff",
        "malformed",
        CUT.format(f"map of {U64} entries", 2 * U64, 9, 0),
        9,
    ),
    "map count over bytes": ("a3616100", "malformed", CUT.format("map of 3 entries", 6, 1, 3), 1),
    "reserved info": ("1c", "malformed", "reserved additional information 28 in major type 0", 0),
    "indefinite int": ("1f", "malformed", "reserved additional information 31 in major type 0", 0),
    "indefinite tag": ("df", "malformed", "reserved additional information 31 in major type 6", 0),
    "reserved simple": ("fc", "malformed", "reserved additional information 28 in major type 7", 0),
    "tag": ("c100", "tag", "CBOR tag 1 is not allowed in a manifest", 0),
    "bignum tag": ("c24101", "tag", "CBOR tag 2 is not allowed in a manifest", 0),
    "undefined": ("f7", "malformed", SIMPLE.format(23), 0),
    "simple 16": ("f0", "malformed", SIMPLE.format(16), 0),
    "one-byte simple": ("f820", "malformed", SIMPLE.format(32), 0),
    "stray break": ("ff", "malformed", "unexpected CBOR break code", 0),
    "break in map value": ("a16161ff", "malformed", "unexpected CBOR break code", 3),
    "duplicate key": ("a2616101616102", "duplicate", "duplicate map key 'a'", 4),
    "int key": ("a10102", "malformed", KEY.format("int"), 1),
    "array key": ("a1800102", "malformed", KEY.format("list"), 1),
    "null key": ("a1f601", "malformed", KEY.format("NoneType"), 1),
    "bytes key": ("a1416101", "malformed", KEY.format("bytes"), 1),
    "nesting 65": (NEST65, "depth", "CBOR nesting deeper than 64 levels", 64),
    "maps nesting 65": (MAPS65, "depth", "CBOR nesting deeper than 64 levels", 192),
    "invalid utf-8 start": (
        "6180",
        "malformed",
        "text string is not valid UTF-8 (invalid start byte)",
        1,
    ),
    "invalid continuation": (
        "62c328",
        "malformed",
        "text string is not valid UTF-8 (invalid continuation byte)",
        1,
    ),
    "surrogate": (
        "63eda080",
        "malformed",
        "text string is not valid UTF-8 (invalid continuation byte)",
        1,
    ),
    "utf-8 cut": (
        "62e282",
        "malformed",
        "text string is not valid UTF-8 (unexpected end of data)",
        1,
    ),
    "trailing": ("0000", "trailing", "1 bytes follow the CBOR item inside its declared size", 1),
    "trailing after map": (
        "a0a0",
        "trailing",
        "1 bytes follow the CBOR item inside its declared size",
        1,
    ),
    "indefinite array open": ("9f01", "malformed", CUT.format("array item or break", 1, 2, 0), 2),
    "indefinite map open": ("bf616101", "malformed", CUT.format("map key or break", 1, 4, 0), 4),
    "indefinite map key cut": ("bf", "malformed", CUT.format("map key or break", 1, 1, 0), 1),
    "indefinite string open": ("7f6161", "malformed", CUT.format("string chunk", 1, 3, 0), 3),
    "chunk of other type": ("7f4161ff", "malformed", BAD_CHUNK, 1),
    "chunk tag": ("5fc100ff", "tag", "CBOR tag 1 is not allowed in a manifest", 1),
    "chunk array": ("5f80ff", "depth", "CBOR nesting deeper than 64 levels", 1),
    "chunk int": ("7f00ff", "malformed", BAD_CHUNK, 1),
    "chunk simple": ("7ff7ff", "malformed", SIMPLE.format(23), 1),
    "chunk float": ("7ff90000ff", "malformed", BAD_CHUNK, 1),
    "nested indefinite": ("7f7f6161ffff", "malformed", BAD_CHUNK, 1),
    "nested indefinite 3": ("5f5f5f4100ffffff", "malformed", BAD_CHUNK, 2),
    "chunk invalid utf-8": (
        "7f6180ff",
        "malformed",
        "text string is not valid UTF-8 (invalid start byte)",
        2,
    ),
    "chunk text in bytes": (
        "5f62c328ff",
        "malformed",
        "text string is not valid UTF-8 (invalid continuation byte)",
        2,
    ),
}

V1_ACCEPTED = {
    "indefinite text": ("7f6161626263ff", "abc"),
    "indefinite bytes": ("5f4100420102ff", b"\x00\x01\x02"),
    "indefinite map": ("bf616101616202ff", {"a": 1, "b": 2}),
    "indefinite array": ("9f0102ff", [1, 2]),
    "half": ("f93e00", 1.5),
    "f32": ("fa3fc00000", 1.5),
    "f64": ("fb3ff8000000000000", 1.5),
    "max u64": ("1bffffffffffffffff", U64),
    "min neg": ("3bffffffffffffffff", -(2**64)),
    "non-shortest head": ("190001", 1),
    "nesting 64": ("81" * 64 + "00", [0]),
    "empty containers": ("a2616180616ba0", {"a": [], "k": {}}),
}

FLOAT_FORM = "float at offset 0 is not in its shortest exact form (or is a NaN other than f9 7e00)"

DET_REFUSED = {
    "empty": ("", "malformed", "CBOR item head needs a byte at offset 0", 0),
    "argument cut": (
        "1900",
        "malformed",
        "CBOR argument needs 2 bytes at offset 1, only 1 left",
        0,
    ),
    "non-shortest 1": (
        "1801",
        "deterministic",
        "integer head at offset 0 is not in its shortest form",
        0,
    ),
    "non-shortest 2": (
        "190001",
        "deterministic",
        "integer head at offset 0 is not in its shortest form",
        0,
    ),
    "non-shortest 4": (
        "1a0000ffff",
        "deterministic",
        "integer head at offset 0 is not in its shortest form",
        0,
    ),
    "non-shortest 8": (
        "1b00000000ffffffff",
        "deterministic",
        "integer head at offset 0 is not in its shortest form",
        0,
    ),
    "non-shortest length": (
        "780161",
        "deterministic",
        "integer head at offset 0 is not in its shortest form",
        0,
    ),
    "indefinite": ("5f4161ff", "deterministic", "indefinite length is not deterministic CBOR", 0),
    "reserved": (
        "1c",
        "deterministic",
        "reserved additional information 28 is not deterministic CBOR",
        0,
    ),
    "string past end": (
        "7bffffffffffffffff",
        "malformed",
        "CBOR string of 18,446,744,073,709,551,615 bytes at offset 0 runs past the end",
        0,
    ),
    "array cannot fit": (
        "9bffffffffffffffff",
        "malformed",
        "array of 18,446,744,073,709,551,615 items at offset 0 cannot fit",
        0,
    ),
    "map cannot fit": ("a3616100", "malformed", "map of 3 entries at offset 0 cannot fit", 0),
    "too deep": (
        "81" * 33 + "00",
        "depth",
        "nesting deeper than 32 levels from the manifest root",
        32,
    ),
    "order": ("a2616200616100", "order", "map keys out of order at 'a'", 4),
    "longer first": ("a262616100616201", "order", "map keys out of order at 'b'", 5),
    "duplicate": ("a2616100616100", "duplicate", "duplicate map key 'a'", 4),
    "int key": ("a10102", "key", "map key is a int: only text keys", 1),
    "tag": ("c000", "tag", "CBOR tag 0 is not allowed in a manifest", 0),
    "simple": ("f7", "simple", SIMPLE.format(23), 0),
    "one-byte simple": ("f818", "simple", SIMPLE.format(24), 0),
    "wide float": ("fa3fc00000", "deterministic", FLOAT_FORM, 0),
    "f64 for f32": ("fb3ff8000000000000", "deterministic", FLOAT_FORM, 0),
    "nan payload": ("f97e01", "deterministic", FLOAT_FORM, 0),
    "nan f32": ("fa7fc00000", "deterministic", FLOAT_FORM, 0),
    "trailing": ("0000", "trailing", "1 bytes follow the CBOR item inside its length", 1),
    "invalid utf-8": (
        "6180",
        "malformed",
        "text string is not valid UTF-8 (invalid start byte)",
        1,
    ),
    "map value cut": ("a16161", "malformed", "CBOR item head needs a byte at offset 3", 3),
    "array cut": ("81", "malformed", "array of 1 items at offset 0 cannot fit", 0),
}

DET_ACCEPTED = {
    "half": ("f93e00", 1.5),
    "f32": ("fa47800000", 65536.0),
    "f64": ("fb3fb999999999999a", 0.1),
    "inf": ("f97c00", math.inf),
    "prefix key first": ("a261610062616101", {"a": 0, "aa": 1}),
    "nesting 32": ("81" * 32 + "00", [0]),
    "max u64": ("1bffffffffffffffff", U64),
    "min neg": ("3bffffffffffffffff", -(2**64)),
}


def _refusal(fn: object, hexdata: str) -> tuple[str, str, int]:
    with pytest.raises(cbor.CborError) as err:
        fn(bytes.fromhex(hexdata))  # type: ignore[operator]
    assert str(err.value) == err.value.message
    return err.value.kind, err.value.message, err.value.offset


def _innermost(value: object) -> object:
    while isinstance(value, list) and len(value) == 1 and isinstance(value[0], list):
        value = value[0]
    return value


@pytest.mark.parametrize("name", sorted(V1_REFUSED))
def test_v1_refusals(name: str) -> None:
    hexdata, kind, message, offset = V1_REFUSED[name]
    assert _refusal(cbor.loads, hexdata) == (kind, message, offset)


@pytest.mark.parametrize("name", sorted(V1_ACCEPTED))
def test_v1_accepts(name: str) -> None:
    hexdata, want = V1_ACCEPTED[name]
    got = cbor.loads(bytes.fromhex(hexdata))
    assert _innermost(got) == want and type(_innermost(got)) is type(want)


@pytest.mark.parametrize("name", sorted(DET_REFUSED))
def test_deterministic_refusals(name: str) -> None:
    hexdata, kind, message, offset = DET_REFUSED[name]
    assert _refusal(cbor.loads_deterministic, hexdata) == (kind, message, offset)


@pytest.mark.parametrize("name", sorted(DET_ACCEPTED))
def test_deterministic_accepts(name: str) -> None:
    hexdata, want = DET_ACCEPTED[name]
    got = cbor.loads_deterministic(bytes.fromhex(hexdata))
    assert _innermost(got) == want and type(_innermost(got)) is type(want)


def test_deterministic_nan_and_negative_zero() -> None:
    assert math.isnan(cbor.loads_deterministic(b"\xf9\x7e\x00"))
    zero = cbor.loads_deterministic(b"\xf9\x80\x00")
    assert zero == 0.0 and math.copysign(1.0, zero) < 0


def test_indefinite_strings_nested_deeper_than_the_stack_are_refused() -> None:
    """A chunk that is itself an indefinite-length string is refused at the head of the
    innermost one, however deep (the Python decoder ran out of recursion past ~500 levels)."""
    for n in (2, 600, 100_000):
        data = b"\x7f" * n + b"\xff" * n
        with pytest.raises(cbor.CborError) as err:
            cbor.loads(data)
        assert (err.value.message, err.value.offset) == (BAD_CHUNK, n - 1)


@pytest.mark.parametrize("deterministic", [False, True])
def test_item_limit(deterministic: bool) -> None:
    raw = cbor.dumps({"a": [1, 2, {"b": "c"}], "d": "e"})  # 10 items, keys counted
    loads = cbor.loads_deterministic if deterministic else cbor.loads
    assert loads(raw, max_items=10) == {"a": [1, 2, {"b": "c"}], "d": "e"}
    with pytest.raises(cbor.CborError) as err:
        loads(raw, max_items=9)
    tail = "" if deterministic else " further"
    assert err.value.kind == "limit"
    assert err.value.message == f"more than 9 CBOR items: refusing to decode{tail}"
    assert err.value.offset == len(raw) - 2  # the last item, "e"
    with pytest.raises(cbor.CborError) as err:
        loads(cbor.dumps(list(range(2000))), max_items=1500)
    assert err.value.message.startswith("more than 1,500 CBOR items")


def test_deterministic_depth_is_the_callers() -> None:
    raw = cbor.dumps([[[0]]])
    assert cbor.loads_deterministic(raw, max_depth=3) == [[[0]]]
    with pytest.raises(cbor.CborError) as err:
        cbor.loads_deterministic(raw, max_depth=2)
    assert (err.value.kind, err.value.offset) == ("depth", 2)
    with pytest.raises(ValueError, match="max_depth"):
        cbor.loads_deterministic(raw, max_depth=100_000)


def test_long_arrays_and_maps(tmp_path: Path) -> None:
    """Beyond the preallocation size, and read in place from a mapped file's slice."""
    value = {"a": list(range(10_000)), "m": {f"k{i:05d}": i for i in range(5000)}}
    raw = cbor.dumps(value)
    path = tmp_path / "m.cbor"
    path.write_bytes(b"xx" + raw + b"yy")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        view = memoryview(m)[2 : 2 + len(raw)]
        assert cbor.loads(view) == value
        assert cbor.loads_deterministic(view) == value
        view.release()


JSONISH = strategies.recursive(
    strategies.none()
    | strategies.booleans()
    | strategies.integers(min_value=-(2**64), max_value=2**64 - 1)
    | strategies.floats(allow_nan=False)
    | strategies.text(max_size=20)
    | strategies.binary(max_size=20),
    lambda inner: (
        strategies.lists(inner, max_size=5)
        | strategies.dictionaries(strategies.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(JSONISH)
def test_round_trips_through_the_encoder(value: object) -> None:
    raw = cbor.dumps(value)
    assert cbor.loads(raw) == value
    assert cbor.loads_deterministic(raw) == value
    assert cbor.dumps(cbor.loads_deterministic(raw)) == raw


@settings(max_examples=500, deadline=None)
@given(strategies.binary(max_size=64))
def test_any_bytes_give_a_value_or_a_cbor_error(data: bytes) -> None:
    for loads in (cbor.loads, cbor.loads_deterministic):
        try:
            loads(data)
        except cbor.CborError as err:
            assert 0 <= err.offset <= len(data)
