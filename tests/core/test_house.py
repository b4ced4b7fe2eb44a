"""The house rules, checked on the source itself: no import circles, siblings imported
relatively, the core absolutely, and no module over 600 lines."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.paths import REPO

MAX_LINES = 600
# Where each part of the one package `xrun` lives in the checkout.
PACKAGES = {
    "xrun": REPO / "src" / "xrun",
    "xrun.components": REPO / "components",
    "xrun.schedulers": REPO / "schedulers",
    "xrun.runtime": REPO / "runtime",
}
SUBPACKAGES = ("xrun.components", "xrun.schedulers", "xrun.runtime")


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (``xrun.runtime.agent``)."""
    out: dict[str, Path] = {}
    for pkg, root in PACKAGES.items():
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root).with_suffix("")
            if pkg == "xrun" and rel.parts[0] in ("components", "schedulers", "runtime"):
                continue  # the symlinks in src/xrun lead to the three folders above
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([pkg, *parts])] = path
    return out


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _imports(name: str) -> Iterator[tuple[str, int, bool]]:
    """(imported module, line, relative?) for every import in module ``name``, lazy ones too:
    an import inside a function is still a dependency."""
    tree = ast.parse(MODULES[name].read_text())
    package = name if _is_package(name) else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno, False
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            for alias in node.names:
                # `from pkg import submodule` imports the submodule.
                sub = f"{target}.{alias.name}"
                yield (sub if sub in MODULES else target), node.lineno, bool(node.level)


def _graph() -> dict[str, set[str]]:
    return {
        name: {t for t, _, _ in _imports(name) if t in MODULES and t != name} for name in MODULES
    }


def test_no_import_circles() -> None:
    graph = _graph()
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)
    assert not cycles, "import circles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def _subpackage(name: str) -> str | None:
    return next((p for p in SUBPACKAGES if name == p or name.startswith(p + ".")), None)


@pytest.mark.parametrize("part", ["xrun", *SUBPACKAGES])
def test_siblings_relative_core_absolute(part: str) -> None:
    bad: list[str] = []
    for name in MODULES:
        if (_subpackage(name) or "xrun") != part:
            continue
        own = _subpackage(name)
        for target, line, relative in _imports(name):
            if target not in MODULES:
                continue
            where = f"{MODULES[name].relative_to(REPO)}:{line} imports {target}"
            if own is not None and not relative and _subpackage(target) == own:
                bad.append(f"{where}: a sibling, import it relatively")
            if relative and _subpackage(target) is None:
                bad.append(f"{where}: the core, import it as xrun.…")
    assert not bad, "\n".join(dict.fromkeys(bad))


def _python_files() -> list[Path]:
    others = [p for r in ("tests", "benchmarks", "examples") for p in (REPO / r).rglob("*.py")]
    return sorted({*MODULES.values(), *others})


@pytest.mark.parametrize("path", _python_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_module_over_600_lines(path: Path) -> None:
    n = len(path.read_text().splitlines())
    assert n <= MAX_LINES, f"{path.relative_to(REPO)} has {n} lines; split it by job"
