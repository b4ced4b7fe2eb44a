"""The rest of TorchX 0.7.0's public API that component files and scripts import, as stand-ins
mapped onto xrun's own code (see :mod:`xrun.torchx.compat` for how and when stand-ins apply):

- ``torchx.specs.file_linter``: ``validate(path, component_function)`` (a static check of the
  file, nothing executed), ``get_fn_docstring``, ``LinterMessage``;
- ``torchx.specs.finder`` and ``torchx.specs.builders`` (``get_component``,
  ``materialize_appdef``, ...): :mod:`xrun.torchx.finder`, over :mod:`xrun.component`;
- ``torchx.schedulers``: ``get_scheduler_factories``, ``get_default_scheduler_name``,
  ``SchedulerFactory``, over xrun's scheduler registry;
- ``torchx.components.dist.get_role_name``;
- ``torchx.runner`` (and ``torchx.runner.api``): ``Runner``, ``get_runner`` from
  :mod:`xrun.runner`.

The runner is a layer above this one, and :mod:`xrun.component` (what the finder and builders
map onto) imports the stand-ins while it loads a TorchX file: importing either here would be
an upward import or a circle (docs/ARCHITECTURE.md). So those stand-ins are made by name
when a file first imports them (:data:`LAZY`, :class:`LazyStandIns`), as the scheduler
registry loads a scheduler; ``torchx.specs.builders`` etc. as attributes load them too.

Written from TorchX's documented API (names, signatures, return types), not its code.
"""

from __future__ import annotations

import ast
import importlib
import importlib.abc
import importlib.machinery
import inspect
import os
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from xrun.schedulers.api import get_scheduler, scheduler_names

# What the stand-ins here add to compat.py's STAND_INS (refusal messages list them all).
MORE_STAND_INS = (
    "torchx.specs.file_linter",
    "torchx.specs.finder",
    "torchx.specs.builders",
    "torchx.schedulers",
    "torchx.runner",
    "torchx.runner.api",
    "torchx.schedulers.api",
    "torchx.components.metrics",
    "torchx.util",
    "torchx.util.types",
    "torchx.util.entrypoints",
    "torchx.version",
    "torchx.tracker.backend",
    "torchx.tracker.backend.fsspec",
)
# Loaded by name on first import (see the module's docstring): stand-in -> (module, names).
_FINDER = (
    "get_component",
    "get_components",
    "get_builtin_source",
    "_Component",
    "ComponentNotFoundException",
    "ComponentValidationException",
)
_BUILDERS = ("materialize_appdef", "parse_args", "make_app_handle", "parse_mounts")
_UTIL_TYPES = (
    "to_list",
    "to_dict",
    "is_bool",
    "is_primitive",
    "decode_optional",
    "decode_from_string",
    "decode",
    "get_argparse_param_type",
    "none_throws",
)
_FSSPEC = ("FsspecTracker", "create", "TrackerBase", "TrackerArtifact", "TrackerSource", "Lineage")
# A stand-in's names: listed, or None for all its source module's public names (__all__).
LAZY: dict[str, tuple[str, tuple[str, ...] | None]] = {
    "torchx.runner": ("xrun.runner", ("Runner", "get_runner")),
    "torchx.runner.api": ("xrun.runner", ("Runner", "get_runner")),
    "torchx.specs.finder": ("xrun.torchx.finder", _FINDER),
    "torchx.specs.builders": ("xrun.torchx.finder", _BUILDERS),
    "torchx.schedulers.api": ("xrun.torchx.extras", None),
    "torchx.components.metrics": ("xrun.components.metrics", ("tensorboard",)),
    "torchx.util": ("xrun.torchx.extras", ()),
    "torchx.util.types": ("xrun.torchx.util_types", _UTIL_TYPES),
    "torchx.util.entrypoints": ("xrun.torchx.extras", ("load",)),
    "torchx.version": ("xrun.torchx.extras", ("__version__", "TORCHX_IMAGE", "load")),
    "torchx.tracker.backend": ("xrun.tracker.fsspec_backend", ()),
    "torchx.tracker.backend.fsspec": ("xrun.tracker.fsspec_backend", _FSSPEC),
}
# The lazy stand-ins that are packages (hold submodules).
_LAZY_PACKAGES = ("torchx.runner", "torchx.util", "torchx.tracker.backend")
# torchx.specs's own names that live in a lazy submodule (TorchX's specs re-exports them).
_SPECS_FROM_BUILDERS = ("materialize_appdef",)
# xrun run's default scheduler (TorchX's get_default_scheduler_name is local_cwd's too).
DEFAULT_SCHEDULER = "local_cwd"


# --------------------------------------------------------------------------- components.dist
def get_role_name(script: str | None, m: str | None) -> str:
    """TorchX's role name of a dist component: the script's file name without its last
    extension, else the module's last part; ValueError without either."""
    if script:
        return os.path.splitext(os.path.basename(script.rstrip("/")))[0]
    if m:
        return m.rpartition(".")[2]
    raise ValueError("failed to compute role_name: give a script or a module (m)")


# --------------------------------------------------------------------------- specs.file_linter
@dataclass
class LinterMessage:
    name: str
    description: str
    line: int
    char: int
    severity: str = "error"


def _annotation_names(node: ast.expr | None) -> str:
    return "" if node is None else ast.unparse(node)


def validate(path: str, component_function: str) -> list[LinterMessage]:
    """Static checks of a component function in the file ``path`` (the file is parsed, not
    run): it exists, every parameter is annotated, and it is annotated to return an AppDef."""
    with open(path, encoding="utf-8") as f:
        source = f.read()
    try:
        tree = ast.parse(source, path)
    except SyntaxError as e:
        return [
            LinterMessage("TorchxFunctionValidator", f"syntax error: {e.msg}", e.lineno or 0, 0)
        ]
    fns = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == component_function]
    if not fns:
        return [
            LinterMessage(
                "TorchxFunctionValidator",
                f"Function {component_function} not found in {path}",
                0,
                0,
            )
        ]
    fn = fns[-1]
    out = []
    a = fn.args
    for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]:
        if arg is not None and arg.annotation is None:
            out.append(
                LinterMessage(
                    "TorchxFunctionArgsValidator",
                    f"Arg {arg.arg} missing type annotation",
                    arg.lineno,
                    arg.col_offset,
                )
            )
    returns = _annotation_names(fn.returns)
    if returns.rpartition(".")[2] != "AppDef":
        said = f"is annotated to return {returns}" if returns else "has no return annotation"
        out.append(
            LinterMessage(
                "TorchxReturnValidator",
                f"Function {component_function} {said}; a component returns specs.AppDef",
                fn.lineno,
                fn.col_offset,
            )
        )
    return out


def get_fn_docstring(fn: Callable[..., object]) -> tuple[str, dict[str, str]]:
    """(the description, {parameter: its description}) from ``fn``'s docstring; a parameter
    without one is described by its name, as TorchX does."""
    import docstring_parser  # benchmark 5: ~20 ms; only when a file asks for it

    doc = docstring_parser.parse(inspect.getdoc(fn) or "")
    desc = "\n\n".join(d for d in (doc.short_description, doc.long_description) if d)
    args = {p.arg_name.lstrip("*"): p.description or "" for p in doc.params}
    for name in inspect.signature(fn).parameters:
        args[name] = args.get(name) or f" {name}"
    return desc or f"{getattr(fn, '__name__', 'component')} TIP: add a docstring", args


# --------------------------------------------------------------------------- schedulers
SchedulerFactory = Callable[..., Any]


def _factory(name: str) -> SchedulerFactory:
    def create(session_name: str, **kwargs: Any) -> Any:
        return get_scheduler(name, session_name, **kwargs)

    create.__name__ = f"create_{name}_scheduler"
    return create


def get_scheduler_factories() -> dict[str, SchedulerFactory]:
    """Every scheduler xrun has (builtins, then plugins) -> its factory; a scheduler's module
    is imported when its factory is first called."""
    return {name: _factory(name) for name in scheduler_names()}


def get_default_scheduler_name() -> str:
    return DEFAULT_SCHEDULER


# --------------------------------------------------------------------------- the modules
def _module(name: str, attrs: Mapping[str, Any], package: bool = False) -> types.ModuleType:
    mod = types.ModuleType(name, f"xrun's stand-in for TorchX's {name}")
    mod.__dict__.update(attrs)
    mod.__xrun_stand_in__ = True  # type: ignore[attr-defined]
    if package:
        mod.__path__ = []
    return mod


def add_stand_ins(mods: dict[str, types.ModuleType]) -> dict[str, types.ModuleType]:
    """``mods`` (compat.py's stand-ins) with the ones here added, each also an attribute
    of its parent module, and ``get_role_name`` in ``torchx.components.dist``."""
    new = {
        "torchx.specs.file_linter": _module(
            "torchx.specs.file_linter",
            {
                "validate": validate,
                "get_fn_docstring": get_fn_docstring,
                "LinterMessage": LinterMessage,
            },
        ),
        "torchx.schedulers": _module(
            "torchx.schedulers",
            {
                "get_scheduler_factories": get_scheduler_factories,
                "get_default_scheduler_name": get_default_scheduler_name,
                "SchedulerFactory": SchedulerFactory,
            },
            package=True,
        ),
    }
    out = {**mods, **new}
    for name, mod in new.items():
        parent, _, leaf = name.rpartition(".")
        if parent in out:
            setattr(out[parent], leaf, mod)
    specs_mod = out.get("torchx.specs")
    if specs_mod is not None:
        setattr(specs_mod, "__getattr__", _lazy_specs_attr)  # noqa: B010 - PEP 562, on an instance
    dist = out.get("torchx.components.dist")
    if dist is not None:
        dist.get_role_name = get_role_name  # type: ignore[attr-defined]
    return out


def _lazy_specs_attr(name: str) -> Any:
    """``torchx.specs.builders`` (or ``.finder``, ``.materialize_appdef``) without importing
    the submodule first, as TorchX's ``torchx.specs`` offers them."""
    if f"torchx.specs.{name}" in LAZY:
        return importlib.import_module(f"torchx.specs.{name}")
    if name in _SPECS_FROM_BUILDERS:
        return getattr(importlib.import_module("torchx.specs.builders"), name)
    raise AttributeError(f"xrun's stand-in for torchx.specs has no attribute {name!r}")


class LazyStandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes a :data:`LAZY` stand-in when a file imports it (before the refusal finder)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in LAZY:
            return None
        is_package = fullname in _LAZY_PACKAGES
        return importlib.machinery.ModuleSpec(fullname, self, is_package=is_package)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        source, names = LAZY[spec.name]
        real = importlib.import_module(source)  # by name: see the module's docstring
        mod = _module(
            spec.name, {n: getattr(real, n) for n in (real.__all__ if names is None else names)}
        )
        if spec.submodule_search_locations is not None:
            mod.__path__ = []
        return mod

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: create_module made it whole."""
