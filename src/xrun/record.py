"""Small records compared by value, as plain classes: what a dataclass would give, without
making one. Making a dataclass class (or a ``typing.NamedTuple``) costs 0.1-1 ms each, and
these are on measured paths: the agent's start-up (benchmark 1), the dry run (benchmark 5),
a worker's ``import xrun.tracker`` (tests/core/tracker/test_cost.py). Standard library only,
and none of it imported.
"""

from __future__ import annotations

# Not typing.TYPE_CHECKING: importing typing costs a few ms, and nothing here needs it at run
# time (mypy treats any name TYPE_CHECKING as true).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Self

__all__ = ["Record", "Value"]


class Record:
    """Equality, hash and repr by the fields named in ``_fields``."""

    __slots__ = ()
    _fields: tuple[str, ...] = ()

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and all(
            getattr(self, f) == getattr(other, f) for f in self._fields
        )

    def __hash__(self) -> int:
        # by repr: a field may hold a dict (a tracker artifact's metadata)
        return hash(tuple(repr(getattr(self, f)) for f in self._fields))

    def __repr__(self) -> str:
        inner = ", ".join(f"{f}={getattr(self, f)!r}" for f in self._fields)
        return f"{type(self).__name__}({inner})"


class Value(Record):
    """A :class:`Record` that cannot change once made (a frozen dataclass's promise): a
    subclass names its ``_fields`` (and ``__slots__``) and passes their values, in that
    order, to ``Value.__init__``."""

    __slots__ = ()

    def __init__(self, *values: object) -> None:
        for name, value in zip(self._fields, values, strict=True):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"a {type(self).__name__} is a value: {name} cannot change")

    def __reduce__(self) -> tuple[object, ...]:
        # pickle and copy set a slotted object's fields with setattr, which a Value refuses:
        # rebuild it as __init__ would, from every slot of its class and its bases.
        names = [n for c in type(self).__mro__ for n in c.__dict__.get("__slots__", ())]
        return (_rebuild, (type(self), {n: getattr(self, n) for n in names if hasattr(self, n)}))

    def _replace(self, **changes: object) -> Self:
        """A copy with ``changes`` (``dataclasses.replace``'s, ``namedtuple._replace``'s)."""
        unknown = set(changes) - set(self._fields)
        if unknown:
            raise TypeError(f"{type(self).__name__} has no field {sorted(unknown)[0]!r}")
        return type(self)(*(changes.get(f, getattr(self, f)) for f in self._fields))


def _rebuild(cls: type[Value], state: dict[str, object]) -> Value:
    """A :class:`Value` of ``cls`` with ``state`` (slot -> value), for pickle and copy."""
    obj = cls.__new__(cls)
    for name, value in state.items():
        object.__setattr__(obj, name, value)
    return obj
