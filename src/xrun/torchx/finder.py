"""TorchX 0.7.0's ``torchx.specs.finder`` and ``torchx.specs.builders`` as stand-ins over
:mod:`xrun.component` (xrun's component lookup and command-line parser). Loaded by name when a
TorchX file or script imports them while the stand-ins apply (see
:mod:`xrun.torchx.stand_ins`); written from TorchX's documented API, not its code."""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from xrun import component as xcomponent
from xrun.errors import UsageError
from xrun.specs import AppDef, make_app_handle, parse_mounts

__all__ = [
    "ComponentNotFoundException",
    "ComponentValidationException",
    "get_builtin_source",
    "get_component",
    "get_components",
    "make_app_handle",
    "materialize_appdef",
    "parse_args",
    "parse_mounts",
]


# --------------------------------------------------------------------------- specs.finder
class ComponentValidationException(Exception):
    pass


class ComponentNotFoundException(Exception):
    pass


@dataclass
class _Component:
    """TorchX's finder record of one component."""

    name: str
    description: str
    fn_name: str
    fn: Callable[..., Any]
    validation_errors: list[str] = field(default_factory=list)


def _record(comp: xcomponent.Component) -> _Component:
    fn_name = comp.name.rpartition(":" if ":" in comp.name else ".")[2]
    return _Component(comp.name, comp.summary(), fn_name, comp.fn, [])


def get_component(name: str) -> _Component:
    """The builtin, plugin or ``file.py:fn`` component ``name`` (xrun's lookup)."""
    try:
        return _record(xcomponent.get_component(name))
    except UsageError as e:
        text = str(e)
        missing = ("unknown component", "does not exist", "has no function", "is not MODULE")
        if any(m in text for m in missing):
            raise ComponentNotFoundException(text) from None
        raise ComponentValidationException(text) from None


def get_components() -> dict[str, _Component]:
    """Every builtin and plugin component by name (``xrun builtins``)."""
    return {name: _record(c) for name, c in xcomponent.list_components().items()}


def get_builtin_source(name: str) -> str:
    """The source of the builtin component ``name`` (e.g. ``dist.ddp``)."""
    return inspect.getsource(inspect.unwrap(get_component(name).fn))


# --------------------------------------------------------------------------- specs.builders
def _raw(value: Any) -> str:
    """A typed value (TorchX's defaults may be typed) as xrun's command-line text."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        return ",".join(f"{k}={v}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


def _defaults(
    cmpnt_defaults: Mapping[str, Any] | None, config: Mapping[str, Any] | None
) -> dict[str, tuple[str, str]]:
    out = {k: (_raw(v), "cmpnt_defaults") for k, v in (cmpnt_defaults or {}).items()}
    out.update({k: (_raw(v), "config") for k, v in (config or {}).items()})
    return out


def _analyze(cmpnt_fn: Callable[..., Any]) -> xcomponent.Component:
    return xcomponent.analyze(getattr(cmpnt_fn, "__name__", "component"), cmpnt_fn)


def materialize_appdef(
    cmpnt_fn: Callable[..., Any],
    cmpnt_args: list[str],
    cmpnt_defaults: dict[str, Any] | None = None,
    config: dict[str, Any] | None = None,
) -> AppDef:
    """Call ``cmpnt_fn`` with command-line ``cmpnt_args``: its own defaults < ``cmpnt_defaults``
    < ``config`` < ``cmpnt_args`` (xrun's parser: the same flags as ``xrun run``)."""
    comp = _analyze(cmpnt_fn)
    return xcomponent.call_component(comp, cmpnt_args, _defaults(cmpnt_defaults, config))


def parse_args(
    cmpnt_fn: Callable[..., Any],
    cmpnt_args: list[str],
    cmpnt_defaults: dict[str, Any] | None = None,
    config: dict[str, Any] | None = None,
) -> argparse.Namespace:
    """The arguments :func:`materialize_appdef` would call ``cmpnt_fn`` with, typed."""
    comp = _analyze(cmpnt_fn)
    parsed = xcomponent.parse_argv(comp, cmpnt_args)
    values: dict[str, Any] = {
        p.name: p.default for p in comp.params if not p.varargs and not p.required
    }
    raw = {k: v for k, (v, _) in _defaults(cmpnt_defaults, config).items()}
    raw.update(parsed.options)
    for name, text in raw.items():
        param = comp.option(name)
        if param is None:
            raise UsageError(f"{comp.name} has no parameter {name!r}")
        values[name] = xcomponent.convert_value(comp, param, text, f"--{name}")
    var = comp.varargs
    if var is not None:
        values[var.name] = [
            xcomponent.convert_value(comp, var, a, f"*{var.name}") for a in parsed.varargs
        ]
    return argparse.Namespace(**values)
