"""Finding a component by name (:func:`get_component`, :func:`list_components`):

- ``dist.ddp``: a builtin, function ``ddp`` of module ``xrun.components.dist``;
- ``path/to/file.py:fn``: function ``fn`` of a Python file;
- ``PREFIX.fn``: entry point group ``xrun.components`` maps ``PREFIX`` to a module (e.g.
  ``myteam = "myteam.components"`` gives ``myteam.train``). Plugins add prefixes; one equal to a
  builtin module (``dist``, ``utils``) is ignored, so a package cannot replace ``dist.ddp``.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from xrun.component.argv import Component, analyze
from xrun.config import current_dir
from xrun.errors import UsageError
from xrun.limits import MAX_FILE_BYTES, shown
from xrun.specs import AppDef

BUILTIN_PACKAGE = "xrun.components"
PLUGIN_GROUP = "xrun.components"


# --------------------------------------------------------------------------- discovery
def _builtin_modules() -> list[str]:
    import pkgutil  # benchmark 5: only listing the builtins needs it

    pkg = sys.modules.get(BUILTIN_PACKAGE) or __import__(BUILTIN_PACKAGE, fromlist=["_"])
    return sorted(m.name for m in pkgutil.iter_modules(pkg.__path__) if not m.name.startswith("_"))


def _plugin_modules() -> dict[str, str]:
    """Entry point prefix -> module name (group ``xrun.components``), builtins excluded."""
    from importlib.metadata import entry_points  # benchmark 5: reading entry points costs ms

    builtins = set(_builtin_modules())
    return {ep.name: ep.value for ep in entry_points(group=PLUGIN_GROUP) if ep.name not in builtins}


def _functions(module: ModuleType) -> dict[str, Callable[..., Any]]:
    """Public functions defined in ``module`` (not imported into it)."""
    return {
        n: f
        for n, f in vars(module).items()
        if inspect.isfunction(f) and not n.startswith("_") and f.__module__ == module.__name__
    }


def _components_of(module: ModuleType) -> dict[str, Callable[..., Any]]:
    """Functions whose return annotation is AppDef (helpers in a module are not components)."""
    out = {}
    for n, f in _functions(module).items():
        ret = inspect.signature(f).return_annotation
        if ret is AppDef or ret == "AppDef":
            out[n] = f
    return out


def list_components(problems: list[str] | None = None) -> dict[str, Component]:
    """Every builtin and plugin component by name (``xrun builtins``).

    A plugin module that fails to import is skipped (it must not hide the others) and its
    error appended to ``problems``.
    """
    found: dict[str, Component] = {}
    sources = [(m, f"{BUILTIN_PACKAGE}.{m}") for m in _builtin_modules()]
    sources += sorted(_plugin_modules().items())
    for prefix, module_name in sources:
        try:
            module = _import(prefix, module_name)
        except UsageError as e:
            if problems is not None:
                problems.append(str(e))
            continue
        for fn_name, fn in _components_of(module).items():
            found[f"{prefix}.{fn_name}"] = analyze(f"{prefix}.{fn_name}", fn)
    return found


def _import(prefix: str, module_name: str) -> ModuleType:
    try:
        return importlib.import_module(module_name)
    except Exception as e:  # a broken plugin must say so, not look like a missing component
        raise UsageError(
            f"component module {module_name!r} (prefix {prefix!r}) failed to import: "
            f"{type(e).__name__}: {e}"
        ) from None


def _is_file_ref(name: str) -> bool:
    path = name.rpartition(":")[0] if ":" in name else name
    return path.endswith(".py") or os.sep in path


def get_component(name: str) -> Component:
    """Find and analyze a component (builtin, ``file.py:fn`` or plugin); UsageError if bad."""
    if _is_file_ref(name):
        return _from_file(name)
    prefix, dot, fn_name = name.rpartition(".")
    if not dot or not prefix or not fn_name:
        raise UsageError(
            f"component {name!r} is not MODULE.FUNCTION (e.g. dist.ddp) or FILE.py:FUNCTION; "
            f"{_closest(name)}"
        )
    module_name = _module_for_prefix(prefix)
    if module_name is None:
        raise UsageError(f"unknown component {name!r}; {_closest(name)}")
    fn = _components_of(_import(prefix, module_name)).get(fn_name)
    if fn is None:  # missing, private, or a helper that does not return an AppDef
        raise UsageError(f"unknown component {name!r}; {_closest(name)}")
    return analyze(name, fn)


def _module_for_prefix(prefix: str) -> str | None:
    builtin = f"{BUILTIN_PACKAGE}.{prefix}"
    # find_spec without importing every builtin module: one stat per lookup.
    if "." not in prefix and not prefix.startswith("_") and importlib.util.find_spec(builtin):
        return builtin
    return _plugin_modules().get(prefix)


def _closest(name: str) -> str:
    names = list(list_components())
    import difflib  # benchmark 5: only a misspelt name needs it

    close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
    if close:
        return f"did you mean {', '.join(close)}? (`xrun builtins` lists all)"
    return "run `xrun builtins` to list the components"


def _from_file(ref: str) -> Component:
    path, colon, fn_name = ref.rpartition(":") if ":" in ref else (ref, "", "")
    if not fn_name:
        raise UsageError(
            f"component {ref!r} names a file but no function; expected FILE.py:FUNCTION"
        )
    if not os.path.isfile(path):
        raise UsageError(f"component file {path!r} does not exist (in {current_dir()})")
    if os.path.getsize(path) > MAX_FILE_BYTES:  # Python would read and compile all of it
        raise UsageError(
            f"component file {path!r} is larger than {MAX_FILE_BYTES // 2**20} MiB; is it the "
            "right file?"
        )
    from xrun.torchx.compat import scoped, torchx_imports  # benchmark 5: TorchX files only

    # A TorchX component file runs unchanged: its `import torchx...` get xrun's stand-ins while
    # it loads and while its function runs, and nowhere else (see xrun.torchx.compat).
    with torchx_imports():
        module = _load_file(path)
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        defined = ", ".join(sorted(_functions(module))) or "none"
        raise UsageError(
            f"component file {path!r} has no function {fn_name!r}; functions defined: {defined}"
        )
    return analyze(ref, scoped(fn))


def _load_file(path: str) -> ModuleType:
    mod_name = "xrun_component_" + "".join(c if c.isalnum() else "_" for c in path)
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise UsageError(f"component file {path!r} cannot be loaded as Python")
    module = importlib.util.module_from_spec(spec)
    # Registered before exec so dataclasses/typing in the file can find their own module.
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        sys.modules.pop(mod_name, None)
        raise UsageError(
            f"component file {path!r}: syntax error at line {e.lineno}: {e.msg}"
        ) from None
    except SystemExit as e:  # sys.exit() while loading: never xrun's own exit (code or silence)
        sys.modules.pop(mod_name, None)
        raise UsageError(
            f"component file {path!r} called sys.exit({shown(e.code)}) while loading; a "
            "component file defines functions, it does not exit"
        ) from None
    except KeyboardInterrupt:
        sys.modules.pop(mod_name, None)
        raise  # the user's Ctrl-C: exit 130, as anywhere
    except BaseException as e:  # the file's own failure (any class of its own), reported as such
        sys.modules.pop(mod_name, None)
        raise UsageError(
            f"component file {path!r} failed to import: {type(e).__name__}: {e}"
        ) from None
    return module
