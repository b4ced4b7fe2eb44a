"""The house rules, checked on the source itself: the layers (the ground, then the runtime,
which imports the ground only, up to the CLI on top; nothing imports upward), no import
circles, siblings imported relatively, the core absolutely, and no module over 600 lines.

Every import counts, a function-level one too: it is still a dependency. Imports under
``if TYPE_CHECKING:`` do not: they never run (a base class may name, in an annotation, the
type that a layer above implements)."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
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


def _type_only(tree: ast.Module) -> set[int]:
    """The ids of the nodes inside ``if TYPE_CHECKING:`` blocks."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in (
            "TYPE_CHECKING",
            "typing.TYPE_CHECKING",
        ):
            out.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return out


def _imports(name: str) -> Iterator[tuple[str, int, bool]]:
    """(imported module, line, relative?) for every import in module ``name`` that runs, lazy
    ones too: an import inside a function is still a dependency."""
    tree = ast.parse(MODULES[name].read_text())
    package = name if _is_package(name) else name.rpartition(".")[0]
    type_only = _type_only(tree)
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
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


# The layers, lowest first: a module imports its own layer and those below, never one above.
# A module's layer is that of the longest package listed that holds it, or the module itself
# when listed; the bare ``xrun`` (the package's __init__) is ground and no prefix of anything,
# so a new module that nobody placed is in no layer and `test_every_module_has_a_layer` fails.
#
# The ground is flat modules any layer may use. The runtime (the agent in each replica) sits
# right above it, alone: it imports the ground only, which keeps it free of the launcher side
# (and of torch). The sweep *data* (the plan, its status, its records, the backend interface)
# sits with the specs, so that a scheduler can run a sweep its own way (Slurm's job array in
# schedulers/slurm/); running the trials as apps of any scheduler sits above the schedulers.
GROUND = (
    "xrun",
    "xrun.errors",
    "xrun.contract",
    "xrun.limits",
    "xrun.record",
    "xrun.noderange",
    "xrun.xdg",
    "xrun.procs",
    "xrun.attempt_env",
)
LAYERS: dict[str, tuple[str, ...]] = {
    "ground": GROUND,
    "runtime": ("xrun.runtime",),
    "specs": (
        "xrun.specs",
        "xrun.config",
        "xrun.yaml_writer",
        "xrun.tracker",
        "xrun.sweeps.plan",
        "xrun.sweeps.status",
        "xrun.sweeps.records",
        "xrun.sweeps.backend",
    ),
    "schedulers/components": (
        "xrun.schedulers",
        "xrun.components",
        "xrun.component",
        "xrun.torchx",
    ),
    "runner/sweeps": ("xrun.runner", "xrun.sweeps", "xrun.calls"),
    "cli": ("xrun.cli", "xrun.__main__"),
}
_RANK = {prefix: rank for rank, prefixes in enumerate(LAYERS.values()) for prefix in prefixes}
_LAYER_NAMES = list(LAYERS)


def layer_of(name: str) -> int:
    """The rank of module ``name``'s layer (0: the ground); KeyError for an unlisted module."""
    if name in _RANK:
        return _RANK[name]
    parts = name.split(".")
    for n in range(len(parts) - 1, 1, -1):  # packages, longest first; never the bare "xrun"
        prefix = ".".join(parts[:n])
        if prefix in _RANK:
            return _RANK[prefix]
    raise KeyError(name)


def modules_without_layer(names: Iterable[str]) -> list[str]:
    out = []
    for name in names:
        try:
            layer_of(name)
        except KeyError:
            out.append(name)
    return out


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """``a (layer) imports b (higher layer)`` for every upward import in ``graph``."""
    bad = []
    for name, targets in sorted(graph.items()):
        for target in sorted(targets):
            if layer_of(target) > layer_of(name):
                bad.append(
                    f"{name} ({_LAYER_NAMES[layer_of(name)]}) imports {target} "
                    f"({_LAYER_NAMES[layer_of(target)]})"
                )
    return bad


def test_every_module_has_a_layer() -> None:
    missing = modules_without_layer(MODULES)
    assert not missing, f"modules in no layer (add them to LAYERS): {missing}"


def test_a_module_on_no_layer_is_caught() -> None:
    """The rule itself: a module that nobody placed (flat in src/xrun, or a new package) is in
    no layer; the package's own name is no catch-all for it."""
    assert modules_without_layer(["xrun.stray", "xrun.newpkg.api", "xrun.specs.api"]) == [
        "xrun.stray",
        "xrun.newpkg.api",
    ]
    with pytest.raises(KeyError):
        layer_of("xrun.stray")
    assert layer_of("xrun") == 0  # the package itself is ground, and only itself


def test_layers_cli_on_top_nothing_imports_upward() -> None:
    bad = layer_violations(_graph())
    assert not bad, "imports against the layers:\n" + "\n".join(bad)


def test_the_layer_rule_catches_a_violation() -> None:
    """The rule itself: a deliberate upward import (the runner importing the CLI, a scheduler
    importing the runner) is reported, with both layers named."""
    graph = _graph()
    graph["xrun.runner"] = {*graph["xrun.runner"], "xrun.cli.cmd_run"}
    graph["xrun.schedulers.api"] = {*graph["xrun.schedulers.api"], "xrun.runner"}
    bad = layer_violations(graph)
    assert "xrun.runner (runner/sweeps) imports xrun.cli.cmd_run (cli)" in bad
    assert "xrun.schedulers.api (schedulers/components) imports xrun.runner (runner/sweeps)" in bad


@pytest.mark.parametrize(
    "target",
    ["xrun.specs", "xrun.specs.api", "xrun.config", "xrun.tracker.api", "xrun.schedulers.api"],
)
def test_the_runtime_may_import_the_ground_only(target: str) -> None:
    """The rule itself: the runtime importing anything above the ground (the specs, the
    config, the tracker, a scheduler) is reported; the ground is not."""
    graph = {"xrun.runtime.agent": {target, "xrun.contract", "xrun.errors", "xrun"}}
    bad = layer_violations(graph)
    assert len(bad) == 1 and bad[0].startswith(f"xrun.runtime.agent (runtime) imports {target} (")
    assert not layer_violations({"xrun.runtime.agent": set(GROUND)})
    # and the ground imports nothing above itself, the runtime included
    assert layer_violations({"xrun.contract": {"xrun.runtime.config"}}) == [
        "xrun.contract (ground) imports xrun.runtime.config (runtime)"
    ]


def test_sweeps_are_one_package() -> None:
    """Everything about sweeps lives in xrun.sweeps, except what a scheduler does its own way
    (Slurm's job array) and the CLI's ``run --sweep``."""
    stray = [
        str(path.relative_to(REPO))
        for name, path in MODULES.items()
        if "sweep" in name.rpartition(".")[2] or "trial" in name.rpartition(".")[2]
        if not name.startswith(("xrun.sweeps", "xrun.schedulers.slurm", "xrun.cli.run_sweep"))
    ]
    assert not stray, f"sweep modules outside xrun.sweeps: {stray}"


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


def _contract_names() -> dict[str, str]:
    """xrun.contract's string constants (``NAME = "value"``): the names that cross a process."""
    tree = ast.parse(MODULES["xrun.contract"].read_text())
    return {
        node.targets[0].id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    }


# Modules that cannot import xrun.contract keep a copy under the contract's own NAME, checked
# equal below: local_cwd's supervisor runs as a script (`python -S supervisor.py`, no xrun).
_COPIES = {"xrun.schedulers.local_cwd.supervisor": {"EXIT_RECORD_ENV"}}


def test_names_that_cross_a_process_are_written_once() -> None:
    """A name both sides of a process boundary use (an env var, a file) is spelled only in
    xrun.contract; everything else imports it, so a rename cannot reach one side only. A string
    literal equal to one elsewhere in the package (docstrings aside) is a second home."""
    names = _contract_names()
    owned = {value: name for name, value in names.items()}
    assert {"TORCHX_JOB_ID", "XRUN_RUN_ID", "stacks.json", "XRUN_STOP_GRACE"} <= set(owned)
    bad = []
    for module, path in MODULES.items():
        if module == "xrun.contract":
            continue
        tree = ast.parse(path.read_text())
        copies = set()
        for node in tree.body:
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id in _COPIES.get(module, ())
            ):
                value = ast.literal_eval(node.value)
                if value != names[node.targets[0].id]:
                    bad.append(
                        f"{path.relative_to(REPO)}:{node.lineno}: {value!r} is not contract's"
                    )
                copies.add(id(node.value))
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value in owned
                and id(node) not in docstrings | copies
            ):
                bad.append(
                    f"{path.relative_to(REPO)}:{node.lineno} writes {node.value!r}: "
                    f"import xrun.contract.{owned[node.value]}"
                )
    assert not bad, "\n".join(bad)
