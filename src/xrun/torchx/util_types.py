"""``torchx.util.types``'s helpers, written from TorchX 0.7.0's documented contract (each one's
docstring there states its inputs and outputs); tests/core/test_torchx_stand_ins.py replays
the calls recorded from the real TorchX (tests/fixtures/torchx/stand-ins-0.7.0.json).

They parse a component's CLI strings: ``to_list("a, b")``, ``to_dict("FOO=v1,v2;BAR=v3")``,
``decode("k=1", dict[str, int])``; ``none_throws`` unwraps an Optional.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from typing import Any, TypeVar

_PRIMITIVES = (int, str, float)
_DELIMS = (",", ";")
_T = TypeVar("_T")


def to_list(arg: str) -> list[str]:
    """``"a, b"`` -> ``["a", "b"]`` (items stripped); blank -> ``[]``."""
    if not arg.strip():
        return []
    return [item.strip() for item in arg.split(",")]


def _unquote(value: str) -> str:
    return "" if value in ('""', "''") else value


def to_dict(arg: str) -> dict[str, str]:
    """``KEY=VALUE`` pairs separated by ``,`` or ``;``; a value may itself hold those
    delimiters: the LAST delimiter before the next ``=`` ends it (``FOO=v1,v2,BAR=v3`` ->
    ``{"FOO": "v1,v2", "BAR": "v3"}``). ``''`` or ``""`` is the empty value; ``""`` -> ``{}``.
    ValueError when there is no pair, or a pair's value or key is missing."""
    if not arg:
        return {}
    chunks = [c.strip() for c in arg.split("=") if c.strip()]
    if len(chunks) < 2:
        raise ValueError(f"`{arg}` does not have at least one `key=value` pair")
    out: dict[str, str] = {}
    key = chunks[0]
    for middle in chunks[1:-1]:  # each is "<value of key><delim><next key>"
        cut = max(middle.rfind(d) for d in _DELIMS)
        if cut <= 0 or cut == len(middle) - 1:
            raise ValueError(
                f"`{middle}` cannot be split into `val<delim>key` with delims={list(_DELIMS)}"
            )
        out[key] = _unquote(middle[:cut].strip())
        key = middle[cut + 1 :].strip()
    out[key] = _unquote(chunks[-1])
    return out


def is_bool(param_type: Any) -> bool:
    return param_type is bool


def is_primitive(param_type: Any) -> bool:
    """int, str or float."""
    return param_type in _PRIMITIVES


def decode_optional(param_type: Any) -> Any:
    """``Optional[X]`` -> ``X``; any other type (a wider Union included) as given."""
    if typing.get_origin(param_type) is not typing.Union:
        return param_type
    args = typing.get_args(param_type)
    if len(args) == 2 and args[1] is type(None):
        return args[0]
    return param_type


def decode_from_string(encoded_value: str, annotation: Any) -> dict[Any, Any] | list[Any] | None:
    """A ``dict[K, V]`` or ``list[X]`` (X primitive) from its CLI string; ``""`` -> None."""
    if not encoded_value:
        return None
    origin = typing.get_origin(annotation)
    if origin is dict:
        key_type, value_type = typing.get_args(annotation)
        return {key_type(k): value_type(v) for k, v in to_dict(encoded_value).items()}
    if origin is list:
        (item_type,) = typing.get_args(annotation)
        if not is_primitive(item_type):
            raise ValueError("List types support only primitives: int, str, float")
        return [item_type(v) for v in to_list(encoded_value)]
    raise ValueError("Unknown")


def decode(encoded_value: Any, annotation: Any) -> Any:
    """A component argument as its annotation's type: bool from ``"true"`` (any case), a dict
    or list from its string; a primitive, or a value that is no string, as given."""
    if encoded_value is None:
        return None
    if is_bool(annotation):
        return encoded_value and encoded_value.lower() == "true"
    if isinstance(encoded_value, str) and not is_primitive(annotation):
        return decode_from_string(encoded_value, annotation)
    return encoded_value


def get_argparse_param_type(parameter: inspect.Parameter) -> Callable[[str], object]:
    """argparse's ``type=``: the annotation when it is int, str or float, else str."""
    annotation = parameter.annotation
    return annotation if is_primitive(annotation) else str


def none_throws(optional: _T | None, message: str = "Unexpected `None`") -> _T:
    """``optional`` itself, or AssertionError(``message``) when it is None."""
    if optional is None:
        raise AssertionError(message)
    return optional
