"""Small records compared by value, as plain classes: what a dataclass would give, without
making one. Making a dataclass class (or a ``typing.NamedTuple``) costs 0.1-1 ms each: it
compiles its ``__init__``, ``__eq__`` and ``__repr__`` from source with ``exec``. These are on
measured paths: the agent's start-up (benchmark 1), the dry run (benchmark 5), a worker's
``import xrun.tracker`` (tests/core/tracker/test_cost.py). So a :class:`Value` writes each field
once, as an annotation, and its metaclass derives ``__slots__``, ``_fields`` and
``__match_args__`` from them; one generic ``__init__`` (and ``__eq__``, ``__hash__``,
``__repr__``, ``_replace``) serves every class, with no code generated. Marked with
``typing.dataclass_transform`` (PEP 681), so mypy types each constructor as a dataclass's.
Standard library only, and none of it imported.
"""

from __future__ import annotations

# Not typing.TYPE_CHECKING: importing typing costs a few ms, and nothing here needs it at run
# time (mypy treats any name TYPE_CHECKING as true).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, ClassVar, Self, dataclass_transform
else:

    def dataclass_transform(**_kwargs: object) -> object:
        return lambda cls: cls


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


def _is_classvar(annotation: object) -> bool:
    # a string under `from __future__ import annotations`, else the typing object itself
    text = annotation if isinstance(annotation, str) else repr(annotation)
    return text.startswith(("ClassVar", "typing.ClassVar"))


@dataclass_transform(frozen_default=True)
class _ValueMeta(type):
    """Makes a :class:`Value` class's fields from its annotations, in order, after its bases':
    ``__slots__`` (plus any the class names itself, which are not fields), ``_fields``,
    ``__match_args__`` and ``_defaults`` (a class attribute with a field's name is its default,
    moved off the class, where it would clash with the slot)."""

    def __new__(
        mcs, name: str, bases: tuple[type, ...], ns: dict[str, Any], **kwargs: Any
    ) -> _ValueMeta:
        defaults: dict[str, object] = {}
        for base in reversed(bases):
            defaults.update(getattr(base, "_defaults", {}))
        if "_fields" not in ns:  # else the class spells out its slots and fields itself
            slots = tuple(ns.get("__slots__", ()))
            inherited: tuple[str, ...] = ()
            for base in reversed(bases):
                inherited += tuple(f for f in getattr(base, "_fields", ()) if f not in inherited)
            own = [
                n
                for n, a in ns.get("__annotations__", {}).items()
                if not _is_classvar(a) and n not in slots and n not in inherited
            ]
            for n in own:
                if n in ns:
                    defaults[n] = ns.pop(n)
            ns["__slots__"] = (*own, *slots)
            ns["_fields"] = (*inherited, *own)
        ns.setdefault("__match_args__", ns["_fields"])
        ns["_defaults"] = defaults
        return super().__new__(mcs, name, bases, ns, **kwargs)


class Value(Record, metaclass=_ValueMeta):
    """A :class:`Record` that cannot change once made (a frozen dataclass's promise). A
    subclass annotates its fields (``x: int``, ``y: int = 0``) and gets a constructor that takes
    them positionally or by keyword, defaults filled in, as a dataclass's does. A class that
    computes something on the way in writes its own ``__init__`` and passes every field to
    ``Value.__init__``. A name in the class's own ``__slots__`` is a slot that is not a field:
    neither compared, printed nor set by ``__init__``."""

    __slots__ = ()
    _defaults: ClassVar[dict[str, object]] = {}

    def __init__(self, *args: object, **kwargs: object) -> None:
        fields = self._fields
        if not kwargs and len(args) == len(fields):  # the common call: every field in order
            for name, value in zip(fields, args, strict=True):
                object.__setattr__(self, name, value)
            return
        if len(args) > len(fields):
            raise TypeError(
                f"{type(self).__name__} takes {len(fields)} fields {fields}, got {len(args)}"
            )
        defaults = self._defaults
        for i, name in enumerate(fields):
            if i < len(args):
                if name in kwargs:
                    raise TypeError(f"{type(self).__name__} got {name!r} twice")
                value = args[i]
            elif name in kwargs:
                value = kwargs.pop(name)
            elif name in defaults:
                value = defaults[name]
            else:
                raise TypeError(f"{type(self).__name__} is missing the field {name!r}")
            object.__setattr__(self, name, value)
        if kwargs:  # what is left names no field
            raise TypeError(f"{type(self).__name__} has no field {sorted(kwargs)[0]!r}")

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
