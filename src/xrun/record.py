"""Small records compared by value, as plain classes: what a dataclass would give, without
making one. Making a dataclass class (or a ``typing.NamedTuple``) costs 0.1-1 ms each, and
these are on measured paths: the agent's start-up (benchmark 1), the dry run (benchmark 5),
a worker's ``import xrun.tracker`` (tests/core/tracker/test_cost.py). Standard library only,
and none of it imported.
"""

from __future__ import annotations

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
