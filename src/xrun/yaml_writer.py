"""YAML text for plain data (an AppDef's dict) without importing pyyaml: the one YAML writer,
behind ``specs.appdef_to_yaml`` (``xrun run --dryrun``, ``xrun describe``, saved specs).

Why: ``import yaml`` costs ~30 ms, a third of the start-up budget of ``xrun run --dryrun``.
The output is block-style YAML; a string that YAML could misread is double-quoted with
escapes, so :func:`xrun.specs.appdef_from_yaml` reads it back exactly (the tests fuzz that
round trip through pyyaml).
"""

from __future__ import annotations

import re
from typing import Any

# Strings YAML reads back as the same string when written bare: they start with a letter, '_'
# or '/' (so never a number, '.inf' or an indicator) and hold no ':', '#', space or quote.
_PLAIN = re.compile(r"[A-Za-z_/][A-Za-z0-9_./@+=-]*")
# ... except the words YAML 1.1 reads as booleans or null.
_RESERVED = {"y", "n", "yes", "no", "true", "false", "on", "off", "null"}
# Characters a double-quoted YAML scalar may hold as they are: printable, and not a line break
# (YAML 1.1 also breaks lines at NEL, LS and PS) or a byte-order mark. Ranges of code points,
# checked with comparisons: compiling the equivalent regex costs ~10 ms at start-up.
_RAW_OK = (
    (0x20, 0x7E),
    (0xA0, 0x2027),
    (0x202A, 0xD7FF),
    (0xE000, 0xFEFE),
    (0xFF00, 0xFFFD),
    (0x10000, 0x10FFFF),
)
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _quote(text: str) -> str:
    out = []
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif any(lo <= ord(ch) <= hi for lo, hi in _RAW_OK):
            out.append(ch)
        elif ord(ch) <= 0xFF:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) <= 0xFFFF:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    return '"' + "".join(out) + '"'


def dump(data: Any) -> str:
    """``data`` (dicts with str keys, lists, str/int/float/bool/None) as YAML text."""
    lines: list[str] = []
    _emit(data, 0, lines)
    return "\n".join(lines) + "\n"


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value != value:
        return ".nan"
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return ".inf" if value > 0 else "-.inf"
    if isinstance(value, float):
        text = repr(value)
        # YAML 1.1 (pyyaml) reads "1e-05" as a string: its floats need a '.' before the 'e'.
        return text.replace("e", ".0e") if "e" in text and "." not in text else text
    if isinstance(value, int):
        return repr(value)
    text = str(value)
    if _PLAIN.fullmatch(text) and text.lower() not in _RESERVED:
        return text
    return _quote(text)


def _key(key: Any) -> str:
    return _scalar(str(key))


def _emit(data: Any, indent: int, lines: list[str]) -> None:
    pad = " " * indent
    if isinstance(data, dict):
        if not data:
            lines.append(pad + "{}")
            return
        for key, value in data.items():
            head = f"{pad}{_key(key)}:"
            if isinstance(value, (dict, list)) and value:
                lines.append(head)
                # A list under a key sits at the key's indent (the usual YAML style).
                _emit(value, indent if isinstance(value, list) else indent + 2, lines)
            else:
                lines.append(f"{head} {_inline(value)}")
        return
    if isinstance(data, list):
        if not data:
            lines.append(pad + "[]")
            return
        for item in data:
            if isinstance(item, (dict, list)) and item:
                sub: list[str] = []
                _emit(item, indent + 2, sub)
                # "- " replaces the first line's indent: the item's keys align after the dash.
                sub[0] = pad + "- " + sub[0][indent + 2 :]
                lines.extend(sub)
            else:
                lines.append(f"{pad}- {_inline(item)}")
        return
    lines.append(pad + _scalar(data))


def _inline(value: Any) -> str:
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list):
        return "[]"
    return _scalar(value)
