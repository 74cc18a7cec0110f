"""Records: small classes of named fields, compared, hashed and shown by value.

`dataclasses` writes each decorated class's methods as Python source and compiles it when the
module is imported (three `exec` calls a class, six a frozen one: about 0.6 M instructions
each), and importing it imports `inspect` (with ast, dis and tokenize). On the path of a
`matrixctl convert` of small tensors that was about a quarter of the whole process's CPU
(docs/benchmarks.md, "convert: the whole process (conv18small; provisional)"). The classes
of the modules that path imports are records instead (docs/architecture.md, rule 13): a
record names its fields in `__slots__` and writes an `__init__` taking each of them as a
positional parameter (the signature gives their order); this module gives it equality,
`repr`, `replace`, copying and pickling from the field names, generating no code.

    class Component(FrozenRecord):
        __slots__ = ("role", "dtype", "count")
        role: str
        dtype: str
        count: int

        def __init__(self, role: str, dtype: str, count: int) -> None:
            self._init(role, dtype, count)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, NoReturn

if TYPE_CHECKING:
    from typing import Self


class Record:
    """Fields named by `__slots__` and taken by `__init__` as positional parameters, in the
    order of its signature. Equal when of the same class with equal fields (as a dataclass);
    not hashable."""

    __slots__ = ()
    _record_fields: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        init = cls.__init__
        if not hasattr(init, "__code__"):  # FrozenRecord itself: no fields, object's __init__
            return
        names = init.__code__.co_varnames[1 : init.__code__.co_argcount]
        slots: set[str] = set()
        for klass in cls.__mro__:
            declared = klass.__dict__.get("__slots__", ())
            slots.update((declared,) if isinstance(declared, str) else declared)
        if set(names) != slots:
            raise TypeError(f"{cls.__name__}.__init__ must take exactly the fields {sorted(slots)}")
        cls._record_fields = names

    def _values(self) -> tuple[Any, ...]:
        return tuple([getattr(self, name) for name in self._record_fields])

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._values() == other._values()

    __hash__: ClassVar[None] = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._record_fields)
        return f"{self.__class__.__qualname__}({shown})"

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (self.__class__, self._values())

    def replace(self, **changes: Any) -> Self:
        """A copy with `changes` (field name -> value), built by the class's `__init__`."""
        values = [changes.pop(name, getattr(self, name)) for name in self._record_fields]
        if changes:
            raise TypeError(f"{self.__class__.__name__} has no field {', '.join(changes)}")
        return self.__class__(*values)


class FrozenRecord(Record):
    """A record whose fields are set once, by `__init__` through `_init`; hashable."""

    __slots__ = ()

    def _init(self, *values: Any) -> None:
        for name, value in zip(self._record_fields, values, strict=True):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> NoReturn:
        raise AttributeError(f"cannot assign to field {name!r} of a {self.__class__.__name__}")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError(f"cannot delete field {name!r} of a {self.__class__.__name__}")

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(self._values())
