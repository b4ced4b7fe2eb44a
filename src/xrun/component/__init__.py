"""Components: typed functions returning an AppDef, found by name (:mod:`.finder`: builtins,
``file.py:fn``, plugins) and called from argv (:mod:`.argv`: the parameter types, argv -> a
call, ``--help``). Import the names from here: ``from xrun.component import get_component``.

Finding and calling sit a layer above the specs (a TorchX component file loads with the TorchX
stand-ins of :mod:`xrun.torchx`), as TorchX's ``specs/finder.py`` and ``specs/builders.py``
would if they had xrun's floors."""

from xrun.component.argv import (
    ArgType,
    Component,
    HelpRequested,
    Param,
    ParsedArgs,
    analyze,
    call_component,
    convert_value,
    format_help,
    parse_argv,
)
from xrun.component.finder import (
    BUILTIN_PACKAGE,
    PLUGIN_GROUP,
    get_component,
    list_components,
)

__all__ = [
    "BUILTIN_PACKAGE",
    "PLUGIN_GROUP",
    "ArgType",
    "Component",
    "HelpRequested",
    "Param",
    "ParsedArgs",
    "analyze",
    "call_component",
    "convert_value",
    "format_help",
    "get_component",
    "list_components",
    "parse_argv",
]
