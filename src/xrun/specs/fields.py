"""Field-by-field checks of plain data read from a file (a saved AppDef's YAML, a sweep file).

YAML gives any type anywhere: ``roles: 5``, ``num_replicas: "abc"``, ``resource: {cpu: many}``.
Each check here takes the value and where it is (``spec.yaml: roles[0].num_replicas``) and
returns it typed, or raises :class:`~xrun.errors.UsageError` naming that field, the value and the
expected form. Standard library only.
"""

from __future__ import annotations

import datetime
from typing import Any

from xrun.errors import UsageError
from xrun.limits import MAX_FILE_BYTES, shown

# The most values (scalars, lists and mappings, each counted where it appears) a file's data
# may hold. YAML aliases make a 1 KiB file a tree of billions of nodes (the "billion laughs"):
# counted as a tree, such a file is refused at the limit instead of expanded.
MAX_NODES = 100_000
# The largest file xrun reads as a spec or a sweep file (a /dev/zero or a huge log named by
# mistake must not be read whole into memory).

# What YAML may make of a plain word: `args: [1, true, 2024-01-01]` are the strings of them.
_SCALARS = (str, int, float, bool, datetime.date)


def type_name(value: object) -> str:
    """What YAML made of a value, in YAML's words."""
    if value is None:
        return "null"
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a mapping",
    }.get(type(value), type(value).__name__)


def fail(where: str, value: object, expected: str) -> UsageError:
    return UsageError(f"{where}: expected {expected}, got {type_name(value)} {shown(value)}")


def as_int(value: object, where: str, lo: int | None = None, hi: int | None = None) -> int:
    """An integer (not a boolean: YAML reads ``yes`` as true) within ``lo..hi``."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise fail(where, value, "an integer")
    if lo is not None and value < lo:
        raise UsageError(f"{where}: {shown(value)} is invalid; expected an integer >= {lo}")
    if hi is not None and value > hi:
        raise UsageError(f"{where}: {shown(value)} is over the limit of {hi:,}")
    return value


def as_str(value: object, where: str) -> str:
    """A scalar as text (``name: 123`` is the name "123"); lists, mappings and null refused."""
    if not isinstance(value, _SCALARS):
        raise fail(where, value, "a string")
    return value if isinstance(value, str) else str(value)


def as_list(value: object, where: str) -> list[Any]:
    """A list; null is the empty list (``args:`` with nothing after it)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise fail(where, value, "a list")
    return value


def as_map(value: object, where: str) -> dict[Any, Any]:
    """A mapping; null is the empty mapping."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise fail(where, value, "a mapping")
    return value


def as_str_list(value: object, where: str) -> list[str]:
    return [as_str(v, f"{where}[{i}]") for i, v in enumerate(as_list(value, where))]


def as_str_map(value: object, where: str) -> dict[str, str]:
    return {
        as_str(k, f"{where} key"): as_str(v, f"{where}.{k}")
        for k, v in as_map(value, where).items()
    }


def check_size(data: object, source: str, limit: int = MAX_NODES) -> None:
    """UsageError once ``data`` holds more than ``limit`` values counted as a tree (a shared
    alias counts every time it appears); stops counting at the limit."""
    stack = [data]
    seen = 0
    while stack:
        item = stack.pop()
        seen += 1
        if seen > limit:
            raise UsageError(
                f"{source}: more than {limit:,} values (YAML aliases count each time they are "
                "used); a spec this large is a mistake: write the values out, fewer of them"
            )
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def read_text(path: str, what: str) -> str:
    """A UTF-8 text file of at most :data:`MAX_FILE_BYTES`; UsageError naming the path and what
    is wrong (missing, a directory, too large, binary)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise UsageError(f"cannot read {what} {path!r}: {e.strerror or e}") from None
    if len(data) > MAX_FILE_BYTES:
        raise UsageError(
            f"{what} {path!r} is larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB; is it the "
            "right file?"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(
            f"{what} {path!r} is not UTF-8 text (byte {e.start}); is it the right file?"
        ) from None
    if "\0" in text:
        raise UsageError(f"{what} {path!r} holds NUL bytes: it is binary, not YAML text")
    return text
