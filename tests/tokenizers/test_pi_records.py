"""The π tokenizer's value classes without dataclasses: `SymbolMap` (a frozen plain class whose
symbols may load on first use) and `SpaceMarking` (a record) keep the value semantics the
dataclasses had: equality and hash by the defining fields, frozen, `replace`, pickling."""

from __future__ import annotations

import copy
import pickle

import pytest

from matrixctl.tokenizers import pi


def _map(**changes: object) -> pi.SymbolMap:
    fields: dict[str, object] = {
        "vocab_size": 10,
        "unk_id": 0,
        "pad_id": 1,
        "byte_fallback": False,
        "byte_base_id": None,
        "normalization": "nfc",
        "symbols": ((2, "a"), (3, "b")),
        "eos_id": 4,
        "extra": {"name": "test"},
        "space_marking": pi.SpaceMarking("sentencepiece", marker="\u2581"),
        "specials": frozenset({4}),
    }
    fields.update(changes)
    return pi.SymbolMap(**fields)  # type: ignore[arg-type]


def test_equal_and_hashed_by_the_defining_fields_not_extra() -> None:
    a, b = _map(), _map(extra={"name": "other", "description": "x"})
    assert a == b and hash(a) == hash(b)
    for field, value in [
        ("vocab_size", 11),
        ("unk_id", 2),
        ("pad_id", 0),
        ("byte_fallback", True),
        ("normalization", "nfkc"),
        ("symbols", ((2, "a"),)),
        ("eos_id", None),
        ("space_marking", None),
        ("specials", frozenset()),
    ]:
        assert _map(**{field: value}) != a, field
    assert a != object()


def test_frozen() -> None:
    m = _map()
    with pytest.raises(AttributeError):
        m.vocab_size = 3  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del m.unk_id
    marking = pi.SpaceMarking("byte_level")
    with pytest.raises(AttributeError):
        marking.scheme = "wordpiece"  # type: ignore[misc]


def test_defaults_and_replace() -> None:
    m = pi.SymbolMap(10, 0, 0, False, None, "none", ((1, "x"),))
    assert (m.eos_id, m.version, m.extra, m.space_marking, m.specials) == (
        None,
        pi.VERSION,
        {},
        None,
        frozenset(),
    )
    full = _map()
    small = full.replace(symbols=((2, "a"),), specials=frozenset())
    assert small.symbols == ((2, "a"),) and small.specials == frozenset()
    assert small.extra == full.extra and small.vocab_size == full.vocab_size
    assert full.symbols == ((2, "a"), (3, "b"))  # the original is unchanged
    with pytest.raises(TypeError, match="no field"):
        full.replace(colour="blue")
    marking = pi.SpaceMarking("wordpiece", continuation="##", lowercase=True)
    assert marking.replace(lowercase=False) == pi.SpaceMarking("wordpiece", continuation="##")
    assert hash(marking) == hash(pi.SpaceMarking("wordpiece", continuation="##", lowercase=True))


def test_a_deferred_map_loads_its_symbols_on_first_use_and_pickles_them() -> None:
    loads: list[int] = []

    def load() -> tuple[tuple[int, str], ...]:
        loads.append(1)
        return ((2, "a"), (3, "b"))

    eager = _map()
    fields = {k: getattr(eager, k) for k in pi._MAP_FIELDS if k != "symbols"}
    lazy = pi.SymbolMap.deferred(load, extra=eager.extra, **fields)
    assert loads == []
    back = pickle.loads(pickle.dumps(lazy))  # loads them: the loader is not picklable
    assert loads == [1]
    assert back == eager and lazy == eager
    assert back.symbols == eager.symbols and back.extra == eager.extra
    assert copy.deepcopy(eager) == eager
    assert "2 symbols" in repr(eager)
