"""A component's parameters and the command line that calls it: the supported annotations
(:class:`ArgType`), :func:`analyze` (a function -> a :class:`Component`), argv -> a call
(:func:`call_component`) and ``--help`` (:func:`format_help`).

Each parameter ``p`` is an option ``--p`` (also ``-p`` when
its name is one letter; ``--some-name`` works for ``--some_name``), required when it has no
default; ``*args`` takes every argument after the component's own options (or after ``--``).
Supported annotations: ``str``, ``int``, ``float``, ``bool`` (true/false/1/0/yes/no; a bare
``--flag`` is true), ``Optional[X]``/``X | None``, ``list[str|int|float]`` (``a,b,c``) and
``dict[str, str]`` (``k=v,k2=v2``; an item without ``=`` continues the previous value, so
``CUDA_VISIBLE_DEVICES=0,1`` works). The parameter docs come from the Google-style docstring
(docstring-parser is imported only to print ``--help``: it costs ~20 ms). ``--help`` prints
them; so does ``-h`` unless the component has a parameter ``h`` (``dist.ddp``: the named
resource, TorchX's convention).
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from xrun.errors import UsageError
from xrun.limits import shown
from xrun.specs import AppDef

_TRUE = {"true", "1", "yes"}
_FALSE = {"false", "0", "no"}
_SUPPORTED = "str, int, float, bool, Optional[X], list[str|int|float], dict[str, str]"


# --------------------------------------------------------------------------- parameter types
@dataclass(frozen=True)
class ArgType:
    """How one annotation reads a command-line string: ``name`` for help, ``convert`` for value."""

    name: str
    scalar: type | None = None  # str/int/float/bool, or the element type of a list
    container: str = ""  # "", "list" or "dict"
    optional: bool = False

    def convert(self, text: str) -> Any:
        """``text`` as this type; UsageError (without the option name; callers add it)."""
        if self.container == "list":
            assert self.scalar is not None
            return [_scalar(self.scalar, item.strip()) for item in text.split(",") if item.strip()]
        if self.container == "dict":
            return _parse_dict(text)
        assert self.scalar is not None
        return _scalar(self.scalar, text)


def _scalar(type_: type, text: str) -> Any:
    if type_ is str:
        return text
    if type_ is bool:
        low = text.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise UsageError(f"{text!r} is not a bool; expected true/false, 1/0 or yes/no")
    if not text.isascii():  # int()/float() read '٢' and '１': xrun takes ASCII digits only
        raise UsageError(f"{shown(text)} is not a valid {type_.__name__}: use ASCII digits (0-9)")
    try:
        return type_(text.strip())
    except ValueError:
        raise UsageError(f"{shown(text)} is not a valid {type_.__name__}") from None


def _parse_dict(text: str) -> dict[str, str]:
    """``k=v,k2=v2`` or ``k=v;k2=v2`` (TorchX splits on both). An item without ``=`` continues
    the previous value, delimiter included, so ``CUDA_VISIBLE_DEVICES=0,1`` stays one value."""
    out: dict[str, str] = {}
    last: str | None = None
    parts = re.split(r"([,;])", text)  # items at even indexes, their delimiters between
    for i in range(0, len(parts), 2):
        item = parts[i]
        key, sep, value = item.partition("=")
        if sep and key.strip():
            last = key.strip()
            out[last] = value
        elif last is not None:
            out[last] += parts[i - 1] + item  # a value that itself contains , or ;
        elif item.strip():
            raise UsageError(f"{item!r} is not KEY=VALUE; expected k=v,k2=v2 (or k=v;k2=v2)")
    return out


def _arg_type(annotation: Any, where: str) -> ArgType:
    """The :class:`ArgType` for an annotation, or UsageError naming the unsupported type."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            inner = _arg_type(rest[0], where)
            return ArgType(f"{inner.name} | None", inner.scalar, inner.container, optional=True)
    if annotation in (str, int, float, bool):
        return ArgType(annotation.__name__, annotation)
    if origin is list and len(args) == 1 and args[0] in (str, int, float):
        return ArgType(f"list[{args[0].__name__}]", args[0], "list")
    if origin is dict and args == (str, str):
        return ArgType("dict[str, str]", str, "dict")
    shown = getattr(annotation, "__name__", None) if not args else None
    raise UsageError(f"{where}: unsupported type {shown or annotation!r}; supported: {_SUPPORTED}")


@dataclass
class Param:
    name: str
    type: ArgType
    default: Any = inspect.Parameter.empty
    varargs: bool = False

    @property
    def required(self) -> bool:
        return not self.varargs and self.default is inspect.Parameter.empty

    def flags(self) -> list[str]:
        out = [f"--{self.name}"]
        if "_" in self.name:
            out.append(f"--{self.name.replace('_', '-')}")
        if len(self.name) == 1:
            out.insert(0, f"-{self.name}")
        return out


@dataclass
class Component:
    """A component function and its parsed signature."""

    name: str
    fn: Callable[..., Any]
    params: list[Param] = field(default_factory=list)

    @property
    def varargs(self) -> Param | None:
        return next((p for p in self.params if p.varargs), None)

    def option(self, name: str) -> Param | None:
        return next((p for p in self.params if not p.varargs and p.name == name), None)

    def summary(self) -> str:
        doc = inspect.getdoc(self.fn) or ""
        return doc.strip().splitlines()[0] if doc.strip() else ""


def analyze(name: str, fn: Callable[..., Any]) -> Component:
    """Read ``fn``'s signature; UsageError for what the CLI cannot turn into options."""
    where = f"component {name}"
    try:
        hints = typing.get_type_hints(fn)
    except Exception as e:  # NameError for a typo'd string annotation, etc.
        raise UsageError(f"{where}: cannot resolve its type annotations ({e})") from None
    params: list[Param] = []
    for p in inspect.signature(fn).parameters.values():
        pwhere = f"{where}: parameter {p.name!r}"
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            raise UsageError(f"{pwhere}: **kwargs is not supported; declare each option")
        if p.name not in hints:
            raise UsageError(f"{pwhere} has no type annotation; annotate it ({_SUPPORTED})")
        atype = _arg_type(hints[p.name], pwhere)
        if p.kind is inspect.Parameter.VAR_POSITIONAL:
            if atype.container or atype.optional:
                raise UsageError(f"{pwhere}: *args must be annotated with a scalar type")
            params.append(Param(p.name, atype, varargs=True))
        else:
            params.append(Param(p.name, atype, p.default))
    return Component(name, fn, params)


# --------------------------------------------------------------------------- argv -> call
class HelpRequested(Exception):
    """``--help`` was given: the caller prints :func:`format_help` and exits 0."""


@dataclass
class ParsedArgs:
    options: dict[str, str] = field(default_factory=dict)
    varargs: list[str] = field(default_factory=list)


def _lookup(comp: Component) -> dict[str, Param]:
    table: dict[str, Param] = {}
    for p in comp.params:
        if not p.varargs:
            for f in p.flags():
                table[f] = p
    return table


def parse_argv(comp: Component, argv: Sequence[str]) -> ParsedArgs:
    """Split argv into raw option strings and ``*args`` (values are converted later)."""
    table = _lookup(comp)
    help_flags = {"--help"} | ({"-h"} if "-h" not in table else set())
    out = ParsedArgs()
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            out.varargs.extend(argv[i + 1 :])
            break
        if tok in help_flags:
            raise HelpRequested()
        if not tok.startswith("-") or tok == "-" or _is_number(tok):
            out.varargs.extend(argv[i:])
            break
        flag, eq, value = tok.partition("=")
        param = table.get(flag)
        if param is None:
            import difflib  # benchmark 5: only a misspelt name needs it

            close = difflib.get_close_matches(flag, list(table), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            tail = " or put it after `--` to pass it to *args" if comp.varargs else ""
            raise UsageError(f"{comp.name}: unknown option {flag}{hint}; see --help{tail}")
        if not eq:
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            bare_flag = (
                param.type.scalar is bool
                and not param.type.container
                and (nxt is None or _is_option(nxt, table, help_flags))
            )
            if bare_flag:
                value = "true"
            elif nxt is None:
                raise UsageError(f"{comp.name}: option {flag} needs a value ({param.type.name})")
            else:
                value = nxt
                i += 1
        _store(comp, out, param, flag, value)
        i += 1
    if out.varargs and comp.varargs is None:
        raise UsageError(
            f"{comp.name}: unexpected argument {out.varargs[0]!r}; it takes no positional "
            "arguments (options only, see --help)"
        )
    return out


def _store(comp: Component, out: ParsedArgs, param: Param, flag: str, value: str) -> None:
    """Record one option's raw value. A list option may repeat (the values add up); any other
    given twice is a mistake TorchX refuses too, not "the last one wins"."""
    if param.name not in out.options:
        out.options[param.name] = value
    elif param.type.container == "list":
        out.options[param.name] += "," + value
    else:
        first = out.options[param.name]
        raise UsageError(
            f"{comp.name}: option {flag} is given twice ({shown(first)}, then {shown(value)}); give it "
            "once (only list options may repeat)"
        )


def _is_option(tok: str, table: dict[str, Param], help_flags: set[str]) -> bool:
    """Is ``tok`` the next option (so a bool flag before it stands alone)? Only a known flag,
    ``--`` or help: ``--flag -x`` with an unknown ``-x`` reads ``-x`` as the flag's value, whose
    conversion error then names the flag."""
    return tok == "--" or tok in help_flags or tok.partition("=")[0] in table


def _is_number(tok: str) -> bool:
    try:
        float(tok)
    except ValueError:
        return False
    return True


def convert_value(comp: Component, param: Param, raw: str, source: str) -> Any:
    """Convert one raw string, re-raising with ``source`` (an option or a config key) named."""
    try:
        return param.type.convert(raw)
    except UsageError as e:
        raise UsageError(f"{comp.name}: {source}={shown(raw)}: {e}") from None


def call_component(
    comp: Component,
    argv: Sequence[str],
    defaults: Mapping[str, tuple[str, str]] | None = None,
) -> AppDef:
    """Build the AppDef: component defaults < ``defaults`` < ``argv``.

    ``defaults`` maps a parameter name to ``(raw value, where it came from)`` (a config file
    section), so a bad value there is reported with its file.
    """
    parsed = parse_argv(comp, argv)
    kwargs: dict[str, Any] = {}
    for pname, (raw, source) in (defaults or {}).items():
        param = comp.option(pname)
        if param is None:
            valid = ", ".join(p.name for p in comp.params if not p.varargs)
            raise UsageError(f"{source}: {comp.name} has no parameter {pname!r}; valid: {valid}")
        kwargs[pname] = convert_value(comp, param, raw, source)
    for pname, raw in parsed.options.items():
        param = comp.option(pname)
        assert param is not None
        kwargs[pname] = convert_value(comp, param, raw, f"--{pname}")
    missing = [p for p in comp.params if p.required and p.name not in kwargs]
    if missing:
        flags = ", ".join(f"--{p.name} {p.type.name.upper()}" for p in missing)
        raise UsageError(f"{comp.name}: missing required argument(s) {flags}; see --help")
    args: list[Any] = []
    var = comp.varargs
    if var is not None:
        args = [convert_value(comp, var, a, f"*{var.name}") for a in parsed.varargs]
    try:
        app = comp.fn(*args, **kwargs)
    except ValueError as e:  # TorchX's components report a bad argument so: one line, exit 2
        msg = str(e)  # named once: xrun's own components already name themselves
        raise UsageError(
            msg if msg.startswith(f"{comp.name}: ") else f"{comp.name}: {msg}"
        ) from None
    except SystemExit as e:  # as while loading: the component's exit is not xrun's
        raise UsageError(
            f"component {comp.name} called sys.exit({shown(e.code)}) instead of returning an AppDef"
        ) from None
    except (KeyboardInterrupt, UsageError):
        raise
    except BaseException as e:  # the component's own failure: one line naming it
        raise UsageError(f"component {comp.name} failed: {type(e).__name__}: {e}") from None
    if not isinstance(app, AppDef) and type(app).__module__.startswith("torchx."):
        from xrun.torchx.compat import from_torchx  # benchmark 5: TorchX files only

        app = from_torchx(app)
    if not isinstance(app, AppDef):
        raise UsageError(f"component {comp.name} returned {type(app).__name__}, expected AppDef")
    return app


def format_help(comp: Component) -> str:
    """``--help`` text: the docstring's description and every parameter's doc and default."""
    import docstring_parser  # benchmark 5: ~20 ms, for --help only

    doc = docstring_parser.parse(inspect.getdoc(comp.fn) or "")
    param_docs = {p.arg_name.lstrip("*"): (p.description or "") for p in doc.params}
    usage = [f"usage: xrun run [xrun options] {comp.name} [options]"]
    usage += [f"{p.flags()[0]} {p.name.upper()}" for p in comp.params if p.required]
    usage += [f"[{p.name} ...]" for p in comp.params if p.varargs]
    lines = [" ".join(usage), ""]
    desc = "\n\n".join(d for d in (doc.short_description, doc.long_description) if d)
    if desc:
        lines += [desc, ""]
    lines.append("arguments:")
    for p in comp.params:
        if p.varargs:
            head = f"  {p.name} ... ({p.type.name})"
            tail = "(everything after the options, or after `--`)"
        else:
            is_flag = p.type.scalar is bool and not p.type.container
            value = f"[{p.name.upper()}]" if is_flag else p.name.upper()
            head = f"  {', '.join(p.flags())} {value} ({p.type.name})"
            tail = "(required)" if p.required else f"(default: {p.default!r})"
        text = " ".join(param_docs.get(p.name, "").split())
        lines.append(head)
        lines.append(f"        {text} {tail}" if text else f"        {tail}")
    return "\n".join(lines) + "\n"
