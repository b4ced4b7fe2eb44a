"""The small pieces of TorchX 0.7.0's API that xrun has no own name for, behind the stand-ins
``torchx.schedulers.api``, ``torchx.version`` and ``torchx.util.entrypoints`` (see
:data:`xrun.torchx.stand_ins.LAZY`), written from TorchX's documented contract.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

from xrun.components import DEFAULT_IMAGE
from xrun.schedulers import api
from xrun.schedulers.api import (
    AppDef,
    AppDryRunInfo,
    AppState,
    DescribeAppResponse,
    ListAppResponse,
    Role,
    RoleStatus,
    Scheduler,
    Stream,
    runopts,
)
from xrun.specs import Resource

__version__ = "0.7.0"  # the TorchX whose API the stand-ins follow
# TorchX's image for its components; xrun's components default to xrun's.
TORCHX_IMAGE = DEFAULT_IMAGE
DAYS_IN_2_WEEKS = 14
NONE = "<NONE>"
# TorchX's "no resource given" (every field -1): a scheduler reads it as "use the default".
NULL_RESOURCE = Resource(cpu=-1, gpu=-1, memMB=-1)


def filter_regex(regex: str, data: Iterable[str]) -> Iterable[str]:
    """The items of ``data`` that ``regex`` matches anywhere (``re.search``), lazily."""
    pattern = re.compile(regex)
    return (item for item in data if pattern.search(item))


def split_lines(text: str) -> list[str]:
    """``text``'s lines, each keeping its ``\\n`` (the last one may have none). Only ``\\n``
    ends a line (``str.splitlines`` would also split on ``\\r``, ``\\x0b``, ...)."""
    parts = text.split("\n")
    out = [p + "\n" for p in parts[:-1]]
    return out + [parts[-1]] if parts[-1] else out


def split_lines_iterator(chunks: Iterable[str]) -> Iterator[str]:
    """Each chunk's :func:`split_lines`, one line at a time."""
    for chunk in chunks:
        yield from split_lines(chunk)


def load(group: str, name: str, default: Any = None) -> Any:
    """TorchX's ``entrypoints.load``: the entry point ``name`` of ``group`` loaded (a
    function is returned as it is), else ``default``; with no default, KeyError."""
    from importlib.metadata import entry_points

    for ep in entry_points(group=group):
        if ep.name == name:
            return ep.load()
    if default is None:
        raise KeyError(f"entrypoint {group}:{name} not found")
    return default


# What torchx.schedulers.api holds (its stand-in takes exactly these: stand_ins.LAZY), xrun's
# own classes under TorchX's names where they differ.
__all__ = [
    "AppDef",
    "AppDryRunInfo",
    "AppState",
    "DescribeAppResponse",
    "ListAppResponse",
    "Role",
    "RoleStatus",
    "Scheduler",
    "Stream",
    "runopts",
    "WorkspaceMixin",
    "filter_regex",
    "split_lines",
    "split_lines_iterator",
    "DAYS_IN_2_WEEKS",
    "NONE",
    "NULL_RESOURCE",
]
WorkspaceMixin = api.WorkspaceBuilder
