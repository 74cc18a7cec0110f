"""The compiled fast path of `cbor.loads_deterministic` accepts exactly what the strict
decoder accepts, with the same value, and leaves every refusal to the strict decoder."""

from __future__ import annotations

import math

import cbor2
import pytest

from matrixctl import cbor

MAX = cbor.DETERMINISTIC_DEPTH


def strict(raw: bytes) -> object:
    decoder = cbor._Deterministic(raw, MAX, cbor.MAX_ITEMS)
    value, pos = decoder.value(0, 0)
    if pos != len(raw):
        raise cbor.CborError("trailing", "trailing", pos)
    return value


GOOD = [
    {"objects": {}},
    {"a": 1, "b": [1, 2, {"c": b"\x00\x01"}], "z": None, "t": True, "f": False},
    {"b": -1, "aa": 2**64 - 1, "n": -(2**64)},
    {"x": 1.5, "y": 1.0e300, "w": 0.1, "inf": math.inf, "neg": -0.0},
    {"é": "ü", "e": "x" * 300, "k" * 30: [[[]]]},
]


@pytest.mark.parametrize("value", GOOD, ids=range(len(GOOD)))
def test_fast_path_takes_deterministic_manifests(value: object) -> None:
    raw = cbor.dumps(value)
    fast = cbor._fast_deterministic(raw, MAX, cbor.MAX_ITEMS)
    assert fast is not None
    assert fast[0] == strict(raw) == value
    assert cbor.loads_deterministic(raw) == value


BAD = {
    "bignum tag": cbor2.dumps({"a": 2**64}),
    "datetime tag": bytes.fromhex("a16161c1181e"),  # {"a": 1(30)}
    "self-describe tag": bytes.fromhex("d9d9f7a0"),
    "wide float": bytes.fromhex("a16161fb3ff8000000000000"),  # 1.5 as a double
    "wide head": bytes.fromhex("a161611801"),
    "indefinite map": bytes.fromhex("bf6161 01ff".replace(" ", "")),
    "keys out of order": bytes.fromhex("a2616201616101"),
    "longer key first": bytes.fromhex("a2626161016162 01".replace(" ", "")),
    "duplicate key": bytes.fromhex("a2616101616102"),
    "integer key": bytes.fromhex("a10101"),
    "undefined": bytes.fromhex("a16161f7"),
    "trailing byte": bytes.fromhex("a0 00".replace(" ", "")),
    "nan payload": bytes.fromhex("a16161f97e01"),
    "too deep": b"\x81" * (MAX + 1) + b"\x00",
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_fast_path_leaves_refusals_to_the_strict_decoder(name: str) -> None:
    raw = BAD[name]
    assert cbor._fast_deterministic(raw, MAX, cbor.MAX_ITEMS) is None
    with pytest.raises(cbor.CborError):
        strict(raw)
    with pytest.raises(cbor.CborError):
        cbor.loads_deterministic(raw)


def test_item_limit_holds_on_the_fast_path() -> None:
    raw = cbor.dumps({"a": list(range(100))})
    assert cbor._fast_deterministic(raw, MAX, 50) is None
    with pytest.raises(cbor.CborError) as err:
        cbor.loads_deterministic(raw, max_items=50)
    assert err.value.kind == "limit"
