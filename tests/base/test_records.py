"""matrixctl.records: value semantics of records without dataclasses."""

from __future__ import annotations

import copy
import pickle

import pytest

from matrixctl.records import FrozenRecord, Record


class Point(FrozenRecord):
    __slots__ = ("tag", "x", "y")
    x: int
    y: int
    tag: str

    def __init__(self, x: int, y: int, tag: str = "") -> None:
        self._init(x, y, tag)


class Labelled(Point):
    __slots__ = ("label",)
    label: str

    def __init__(self, x: int, y: int, tag: str = "", label: str = "") -> None:
        self._init(x, y, tag, label)


class Box(Record):
    __slots__ = ("items", "name")

    def __init__(self, name: str, items: list[int] | None = None) -> None:
        self.name = name
        self.items: list[int] = [] if items is None else items


def test_fields_follow_the_init_signature_not_the_slots() -> None:
    assert Point._record_fields == ("x", "y", "tag")
    assert Labelled._record_fields == ("x", "y", "tag", "label")
    assert Box._record_fields == ("name", "items")


def test_equality_by_class_and_value() -> None:
    assert Point(1, 2) == Point(1, 2, "")
    assert Point(1, 2) != Point(2, 1)
    assert Labelled(1, 2) != Point(1, 2)  # another class, as for dataclasses
    assert Point(1, 2) != (1, 2, "")
    assert Box("a") == Box("a", [])
    assert Box("a", [1]) != Box("a", [2])


def test_frozen_records_hash_and_refuse_assignment() -> None:
    p = Point(1, 2, "t")
    assert hash(p) == hash(Point(1, 2, "t"))
    assert {p, Point(1, 2, "t")} == {p}
    with pytest.raises(AttributeError, match="'x'"):
        p.x = 3  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del p.y
    with pytest.raises(TypeError):
        hash(Box("a"))  # mutable: not hashable


def test_mutable_records_take_assignment_but_no_new_attribute() -> None:
    b = Box("a")
    b.items.append(1)
    b.name = "b"
    assert b == Box("b", [1])
    with pytest.raises(AttributeError):
        b.other = 1  # type: ignore[attr-defined]


def test_repr_names_every_field_in_order() -> None:
    assert repr(Labelled(1, 2, "t", "l")) == "Labelled(x=1, y=2, tag='t', label='l')"
    assert repr(Box("a")) == "Box(name='a', items=[])"


def test_replace_copy_and_pickle() -> None:
    p = Labelled(1, 2, "t", "l")
    assert p.replace(y=5) == Labelled(1, 5, "t", "l")
    assert p == Labelled(1, 2, "t", "l")  # unchanged
    with pytest.raises(TypeError, match="no field z"):
        p.replace(z=1)
    for other in (copy.copy(p), copy.deepcopy(p), pickle.loads(pickle.dumps(p))):
        assert other == p and type(other) is Labelled
    b = Box("a", [1])
    deep = copy.deepcopy(b)
    assert deep == b and deep.items is not b.items


def test_an_init_that_does_not_take_every_field_is_refused() -> None:
    with pytest.raises(TypeError, match="must take exactly the fields"):

        class Bad(FrozenRecord):
            __slots__ = ("a", "b")

            def __init__(self, a: int) -> None:
                self._init(a, 0)
