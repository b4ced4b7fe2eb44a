"""Run options: how a scheduler declares them (a frozen dataclass whose fields are made with
:func:`option`, or TorchX's ``runopts().add(...)`` for plugins), and how ``-cfg`` text and
``.xrunconfig`` values become ONE typed value (:meth:`runopts.resolve`), once, at the edge.
``xrun runopts`` and ``xrun configure`` print the same table.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, cast, overload

from xrun.config import Sourced
from xrun.errors import UsageError
from xrun.limits import check_duration, shown, to_float

OptionsT = TypeVar("OptionsT")
CfgVal = str | int | float | bool | list[str] | dict[str, str] | None


@dataclass
class runopt:  # noqa: N801 - TorchX's name
    name: str
    type_: type
    help: str
    default: CfgVal = None
    required: bool = False
    aliases: tuple[str, ...] = ()  # other spellings accepted (TorchX's, e.g. mail-user)
    # A number of seconds: 0 to MAX_DURATION_S (a day), like every duration xrun takes.
    seconds: bool = False


_TYPE_NAMES: dict[type, str] = {
    str: "str",
    int: "int",
    float: "float",
    bool: "bool",
    list: "list[str]",
    dict: "dict[str, str]",
}


def type_name(type_: type) -> str:
    """How a run option's type is shown (``xrun runopts``, ``xrun configure``)."""
    return _TYPE_NAMES.get(type_, type_.__name__)


_TRUE = {"true", "1", "yes", "y", "on"}
_FALSE = {"false", "0", "no", "n", "off"}


class _NotConvertible(Exception):
    """A converter's "this value is not a valid one of my type" (the caller names the option)."""


def _to_bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    s = str(value).strip().lower()
    if s in _TRUE:
        return True
    if s in _FALSE:
        return False
    raise _NotConvertible


def _to_int(value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    # ASCII digits, and few enough of them for int() (Python reads at most 4,300).
    if isinstance(value, str) and re.fullmatch(r"[+-]?[0-9]{1,4000}", value.strip()):
        return int(value)
    raise _NotConvertible


def _to_float(value: object) -> float:
    """A finite number: no run option means anything by NaN or an infinity."""
    out = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        out = float(value) if abs(value) < 1e308 else None
    elif isinstance(value, str):
        out = to_float(value)  # NaN, refused below, for '٢' as for 'soon'
    if out is None or not math.isfinite(out):
        raise _NotConvertible
    return out


def _to_str(value: object) -> str:
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    raise _NotConvertible


def _to_list(value: object) -> list[str]:
    """A list, or a string split on ``;`` (on ``,`` when it has no ``;``), blanks dropped."""
    if isinstance(value, list):
        return [str(v) for v in value]
    if isinstance(value, str):
        return [v for v in (s.strip() for s in value.split(";" if ";" in value else ",")) if v]
    raise _NotConvertible


def _to_dict(value: object) -> dict[str, str]:
    """A dict, or a string ``K1:V1;K2:V2`` (every item needs a key and a ``:``)."""
    if isinstance(value, dict):
        return {str(k): str(v) for k, v in value.items()}
    if isinstance(value, str):
        out: dict[str, str] = {}
        for item in filter(None, (s.strip() for s in value.split(";"))):
            k, sep, v = item.partition(":")
            if not sep or not k:
                raise _NotConvertible
            out[k] = v
        return out
    raise _NotConvertible


# One converter per run option type: a value of any other type, or one its converter refuses,
# is a UsageError that names the option.
_CONVERTERS: dict[type, Callable[[object], CfgVal]] = {
    bool: _to_bool,
    int: _to_int,
    float: _to_float,
    str: _to_str,
    list: _to_list,
    dict: _to_dict,
}


def _convert(opt: runopt, value: object) -> CfgVal:
    """Convert a config value (often a string from the CLI or a config file) to the option's
    type; a duration must be 0 to a day."""
    if value is None:
        return None
    converter = _CONVERTERS.get(opt.type_)
    if converter is not None:
        try:
            out = converter(value)
        except _NotConvertible:
            pass
        else:
            if opt.seconds:
                check_duration(out, f"run option {opt.name}")  # type: ignore[arg-type]
            return out
    expected = _TYPE_NAMES.get(opt.type_, opt.type_.__name__)
    if opt.type_ is float:
        expected = "finite float"
    raise UsageError(f"run option {opt.name}={shown(value)} is not a valid {expected}")


def option(
    help: str,
    default: CfgVal = None,
    *,
    required: bool = False,
    aliases: tuple[str, ...] = (),
    seconds: bool = False,
) -> Any:
    """One field of a scheduler's options dataclass: its help and default, which ``xrun runopts``
    and ``xrun configure`` show (the type is the field's annotation, see :class:`runopts`).

    A list or dict default is copied for each instance; ``required`` leaves the field without
    a default (the options dataclasses are keyword-only, so field order does not matter).
    """
    meta = {"help": help, "aliases": aliases, "seconds": seconds}
    if required:
        return field(metadata=meta)
    if isinstance(default, (list, dict)):
        return field(default_factory=default.copy, metadata=meta)
    return field(default=default, metadata=meta)


def _option_type(hint: object, where: str) -> type:
    """A field annotation (``str | None``, ``list[str]``, ``float``) -> the run option type."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    args = [a for a in typing.get_args(hint) if a is not type(None)] if union else [hint]
    base = (typing.get_origin(args[0]) or args[0]) if len(args) == 1 else None
    if not isinstance(base, type) or base not in _CONVERTERS:
        raise TypeError(
            f"{where}: {hint} is not a run option type ({', '.join(_TYPE_NAMES.values())})"
        )
    return base


@functools.cache
def _dataclass_options(options: type) -> tuple[runopt, ...]:
    """One run option per field of ``options``: its name, its annotation's type, and what
    :func:`option` put in its metadata. Cached: resolving the annotations (get_type_hints)
    costs many times a whole resolve, and every dry run asks for the run options twice."""
    hints = typing.get_type_hints(options)
    out = []
    for f in dataclasses.fields(options):
        default: CfgVal = None
        if f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        elif f.default is not dataclasses.MISSING:
            default = f.default
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        meta = f.metadata
        out.append(
            runopt(
                f.name,
                _option_type(hints[f.name], f"{options.__name__}.{f.name}"),
                meta.get("help", ""),
                default,
                required,
                tuple(meta.get("aliases", ())),
                bool(meta.get("seconds", False)),
            )
        )
    return tuple(out)


class runopts(Generic[OptionsT]):  # noqa: N801 - TorchX's name
    """A scheduler's typed, self-describing run options (``xrun runopts S`` prints them).

    ``runopts(SomeOptions)`` describes the fields of a frozen dataclass (each made with
    :func:`option`), and :meth:`resolve` returns an instance of it: the builtins' way, one
    typed value that the request code reads. ``runopts()`` plus :meth:`add` is TorchX's way
    (plugins): :meth:`resolve` then returns a dict.
    """

    @overload
    def __init__(self: runopts[dict[str, CfgVal]]) -> None: ...

    @overload
    def __init__(self: runopts[OptionsT], options: type[OptionsT]) -> None: ...

    def __init__(self, options: type[OptionsT] | None = None) -> None:
        self._opts: dict[str, runopt] = {}
        self._aliases: dict[str, str] = {}
        self.options = options
        if options is not None:
            # a class is hashable (mypy does not know it of a type[T])
            for opt in _dataclass_options(options):  # type: ignore[arg-type]
                self._put(opt)

    def _put(self, opt: runopt) -> None:
        self._opts[opt.name] = opt
        self._aliases.update(dict.fromkeys(opt.aliases, opt.name))

    def add(
        self,
        name: str,
        type_: type,
        help: str,
        default: CfgVal = None,
        required: bool = False,
        aliases: tuple[str, ...] = (),
        seconds: bool = False,
    ) -> None:
        if self.options is not None:
            # The dataclass is the one source of truth: an option it lacks could not be set.
            raise TypeError(f"run options of {self.options.__name__}: add a field there instead")
        self._put(runopt(name, type_, help, default, required, aliases, seconds))

    def __iter__(self) -> Iterator[runopt]:
        return iter(self._opts.values())

    def __contains__(self, name: object) -> bool:
        return name in self._opts or name in self._aliases

    def get(self, name: str) -> runopt | None:
        """The option called ``name`` or one of its aliases."""
        return self._opts.get(self._aliases.get(name, name))

    def canonical(self, cfg: Mapping[str, object], scheduler: str = "") -> dict[str, object]:
        """``cfg`` with aliases replaced by the option's name; UsageError for an unknown key or
        an option given under two spellings."""
        out: dict[str, object] = {}
        for key, value in cfg.items():
            opt = self.get(key)
            if opt is None:
                import difflib  # benchmark 5: only a misspelt name needs it

                close = difflib.get_close_matches(key, [*self._opts, *self._aliases], n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                valid = ", ".join(self._opts) or "none"
                raise UsageError(
                    f"unknown run option {key!r} for scheduler {scheduler or '?'}{hint}; valid: {valid}"
                )
            if opt.name in out:
                raise UsageError(
                    f"run option {opt.name!r} is given twice (also as {key!r}); give it once"
                )
            out[opt.name] = value
        return out

    def resolve(self, cfg: Mapping[str, object], scheduler: str = "") -> OptionsT:
        """Fill defaults, convert values to their types, reject unknown or missing keys; the
        options dataclass (or a dict) of the values. The dataclass's own checks of a value
        (``__post_init__``) run here too: every run option is checked once, before any use."""
        values = self._values(cfg, scheduler)
        if self.options is None:
            return cast(OptionsT, values)
        return self.options(**values)

    def _values(self, cfg: Mapping[str, object], scheduler: str) -> dict[str, CfgVal]:
        cfg = self.canonical(cfg, scheduler)
        out: dict[str, CfgVal] = {}
        for opt in self._opts.values():
            if opt.name in cfg and cfg[opt.name] is not None:
                out[opt.name] = _convert(opt, cfg[opt.name])
            elif opt.required:
                raise UsageError(
                    f"run option {opt.name!r} is required for scheduler {scheduler or '?'}: "
                    f"pass -cfg {opt.name}=VALUE ({opt.help})"
                )
            elif self.options is None:  # a dataclass fills its own (a fresh list per instance)
                out[opt.name] = opt.default
        return out

    def __str__(self) -> str:
        lines = []
        for o in self._opts.values():
            tname = type_name(o.type_)
            req = "required" if o.required else f"default: {o.default!r}"
            also = f", also {', '.join(o.aliases)}" if o.aliases else ""
            lines.append(f"    {o.name} ({tname}, {req}{also})\n        {o.help}")
        return "\n".join(lines)


def resolve_run_options(
    opts: runopts, defaults: dict[str, Sourced], scheduler: str
) -> dict[str, CfgVal]:
    """Config-file run options checked against ``opts``, converted to their types.

    A bad key or value raises UsageError naming the file, section and key (``opts.resolve``
    would only name the key).
    """
    out: dict[str, CfgVal] = {}
    for key, (raw, source) in defaults.items():
        opt = opts.get(key)
        if opt is None:
            names = [o.name for o in opts]
            import difflib  # benchmark 5: only a misspelt name needs it

            close = difflib.get_close_matches(key, names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise UsageError(
                f"{source}: unknown run option for {scheduler}{hint}; valid: "
                f"{', '.join(names) or 'none'}"
            )
        single = runopts()
        single.add(opt.name, opt.type_, opt.help)
        try:  # under the option's own name: an alias (mail-user) is the same option
            out[opt.name] = single.resolve({opt.name: raw}, scheduler)[opt.name]
        except UsageError as e:
            raise UsageError(f"{source}: {e}") from None
    return out
