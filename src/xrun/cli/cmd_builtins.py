"""``xrun builtins``: list the builtin and plugin components, or print one's source."""

from __future__ import annotations

import argparse
import inspect
import re
import sys

from xrun.component import get_component, list_components


def add_arguments(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    b = sub.add_parser("builtins", help="list the builtin and plugin components")
    b.add_argument(
        "--print",
        dest="print_name",
        metavar="NAME",
        help="print a component's source, as a template for your own",
    )


def main(ns: argparse.Namespace) -> int:
    if ns.print_name:
        comp = get_component(ns.print_name)
        module = inspect.getmodule(comp.fn)
        # The whole module: a component usually needs its module's imports and helpers to run.
        source = inspect.getsource(module if module is not None else comp.fn)
        package = (module.__package__ or "") if module is not None else ""
        sys.stdout.write(absolute_imports(source, package))
        return 0
    problems: list[str] = []
    comps = list_components(problems)
    for problem in problems:
        print(f"xrun: warning: {problem}", file=sys.stderr)
    width = max((len(n) for n in comps), default=0)
    print(f"Found {len(comps)} components (`xrun run NAME --help` shows one's options):")
    for name, comp in comps.items():
        print(f"  {name.ljust(width)}  {comp.summary()}")
    return 0


def absolute_imports(source: str, package: str) -> str:
    """``source`` with its relative imports made absolute (``from . import X`` in package ``p``
    -> ``from p import X``): a printed template runs from wherever the user saves it."""
    if not package:
        return source

    def absolute(m: re.Match[str]) -> str:
        dots, rest = m.group(1), m.group(2)
        base = package.rsplit(".", len(dots) - 1)[0] if len(dots) > 1 else package
        return f"from {base}{'.' + rest if rest else ''} import"

    return re.sub(r"^from (\.+)([\w.]*) import", absolute, source, flags=re.M)
