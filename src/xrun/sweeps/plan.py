"""Sweeps: one command runs a grid of trials, each trial a whole AppDef.

::

    xrun run -s slurm --sweep lr=0.1,0.01 --sweep wd=0,1e-4 dist.ddp -j 2x4 --script train.py \\
        -- --lr {{lr}} --wd {{wd}}

A :class:`Sweep` is the grid: the cartesian product of its ``params`` (in the order given, the
last varying fastest), times its explicit ``trials`` (``--sweep-file``) when it has both. A
trial is a mapping name -> value (text). ``{{name}}`` in the component's arguments (or in a
saved AppDef's strings) is replaced by the trial's value, and every worker gets
``XRUN_SWEEP_<NAME>``, ``XRUN_TRIAL_INDEX`` and ``XRUN_SWEEP_SIZE`` (names in
:mod:`xrun.contract`).

A :class:`SweepPlan` is what a scheduler runs: the trial table plus either ONE template AppDef
with ``{{name}}`` placeholders (every trial is the template with its values filled in) or one
AppDef per trial. :func:`plan_from_args` prefers the template: calling a component costs ~0.5 ms,
so 10,000 calls would not fit a one-second dry run, and a Slurm job array needs one command for
all its tasks. The component is called once with a unique plain word in place of each
placeholder; the template is used only when those words come out verbatim in the AppDef and
two real calls (the first and the last trial) agree with it, and every value that reaches the
command line is plain text (so no component would quote one value differently from another).
Otherwise the component is called once per trial.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from xrun.contract import SWEEP_ENV_PREFIX, SWEEP_SIZE_ENV, TRIAL_INDEX_ENV
from xrun.errors import UsageError
from xrun.limits import capped_int, is_digits, shown
from xrun.specs import AppDef, appdef_from_dict, appdef_to_dict
from xrun.specs.fields import check_size, read_text

PARAM_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
PLACEHOLDER_RE = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
SWEEP_FORM = "--sweep NAME=V1,V2,... (e.g. --sweep lr=0.1,0.01; NAME: letters, digits, '_')"
FILE_FORM = "a YAML list with one mapping per trial, e.g. [{lr: 0.1, wd: 0}, {lr: 0.01, wd: 0}]"
# The most trials one sweep may have: a grid grows as the product of its value lists, and every
# trial is a row of the table, an entry of the request and (local_cwd, docker) an app. Slurm's
# own MaxArraySize defaults to 1,001.
MAX_TRIALS = 10_000
# Values that no component quotes or escapes (shlex.quote leaves them as they are): only these
# may take the one-template path when they reach a command line.
_PLAIN_RE = re.compile(r"[\w@%+=:,./-]+", re.ASCII)


def env_name(param: str) -> str:
    """The worker env var that carries ``param``'s value: ``XRUN_SWEEP_<PARAM>``."""
    return SWEEP_ENV_PREFIX + param.upper()


def trial_env(values: Mapping[str, str], index: int, size: int) -> dict[str, str]:
    """What every worker of trial ``index`` gets in its environment."""
    env = {env_name(k): v for k, v in values.items()}
    env[TRIAL_INDEX_ENV] = str(index)
    env[SWEEP_SIZE_ENV] = str(size)
    return env


# --------------------------------------------------------------------------- the spec
@dataclass
class Sweep:
    """The grid of trials (see the module doc). ``max_parallel``: at most this many trials at
    once (None: the scheduler's default, see ``xrun run --dryrun``)."""

    params: dict[str, list[str]] = field(default_factory=dict)
    trials: list[dict[str, str]] = field(default_factory=list)
    max_parallel: int | None = None

    def names(self) -> list[str]:
        """The parameters, as the trial table's columns (the file's first, then the grid's)."""
        first = list(self.trials[0]) if self.trials else []
        return first + [n for n in self.params if n not in first]

    def validate(self) -> None:
        """UsageError naming the bad value: names, empty lists, trials with different keys."""
        if not self.params and not self.trials:
            raise UsageError(f"a sweep needs at least one {SWEEP_FORM} or --sweep-file FILE")
        for name, values in self.params.items():
            _check_name(name, f"--sweep {name}=...")
            if not values:
                raise UsageError(f"--sweep {name}= has no values; expected {SWEEP_FORM}")
        if self.trials:
            keys = list(self.trials[0])
            for i, trial in enumerate(self.trials):
                if set(trial) != set(keys):
                    raise UsageError(
                        f"sweep file: trial {i} has keys {sorted(trial)} but trial 0 has "
                        f"{sorted(keys)}; every trial needs the same names"
                    )
            for name in keys:
                _check_name(name, f"sweep file key {name!r}")
                if name in self.params:
                    raise UsageError(
                        f"{name!r} is both in the sweep file and in --sweep {name}=...; "
                        "give each name once"
                    )
        seen: dict[str, str] = {}
        for name in self.names():
            other = seen.setdefault(env_name(name), name)
            if other != name:
                raise UsageError(
                    f"sweep names {other!r} and {name!r} both become {env_name(name)}; "
                    "rename one (names are upper-cased for the env)"
                )
        if self.max_parallel is not None and self.max_parallel < 1:
            raise UsageError(f"--max-parallel {self.max_parallel} must be an integer >= 1")
        self._check_size()

    def _check_size(self) -> None:
        lengths = [len(self.trials)] if self.trials else []
        lengths += [len(v) for v in self.params.values()]
        size = 1
        for n in lengths:
            size *= n
            if size > MAX_TRIALS:  # checked as it grows: the product itself may be huge
                shape = " x ".join(map(str, lengths))
                raise UsageError(
                    f"the sweep has more than {MAX_TRIALS:,} trials ({shape}); the limit is "
                    f"{MAX_TRIALS:,}: sweep fewer values, or split the sweep"
                )

    def expand(self) -> list[dict[str, str]]:
        """Every trial, in order: file trials (outer) x the grid (the last --sweep fastest)."""
        self.validate()
        grid = [
            dict(zip(self.params, combo, strict=True))
            for combo in itertools.product(*self.params.values())
        ]
        base = self.trials or [{}]
        return [{**t, **g} for t in base for g in grid]


def _check_name(name: str, where: str) -> None:
    if not PARAM_RE.fullmatch(name):
        raise UsageError(
            f"{where}: {name!r} is not a valid sweep name; use letters, digits and '_' "
            f"(not starting with a digit): {SWEEP_FORM}"
        )


def parse_sweep_flag(text: str) -> tuple[str, list[str]]:
    """``lr=0.1,0.01`` -> ``("lr", ["0.1", "0.01"])``."""
    name, eq, rest = text.partition("=")
    name = name.strip()
    if not eq or not name:
        raise UsageError(f"--sweep {text!r} is malformed; expected {SWEEP_FORM}")
    _check_name(name, f"--sweep {text!r}")
    if not rest.strip():
        raise UsageError(f"--sweep {text!r} has no values; expected {SWEEP_FORM}")
    values = [v.strip() for v in rest.split(",")]
    if any(not v for v in values):
        raise UsageError(
            f"--sweep {text!r} has an empty value; expected {SWEEP_FORM} (a value with a "
            "comma or an empty value goes in a --sweep-file)"
        )
    return name, values


def parse_sweep_flags(flags: Sequence[str]) -> dict[str, list[str]]:
    params: dict[str, list[str]] = {}
    for text in flags:
        name, values = parse_sweep_flag(text)
        if name in params:
            raise UsageError(f"--sweep {name}=... is given twice; give each name once")
        params[name] = values
    return params


def _scalar_text(value: object, where: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return str(value)
    raise UsageError(
        f"{where}: {value!r} is not a plain value (text or a number); expected {FILE_FORM}"
    )


def _unique_keys_loader(yaml: Any) -> Any:
    """PyYAML's SafeLoader, refusing a mapping that names a key twice: ``{lr: 1, lr: 2}``
    would silently keep the last value (YAML says keys are unique; PyYAML does not check)."""

    class UniqueKeys(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[object] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                if not isinstance(key, (str, int, float, bool)):
                    continue  # unhashable: the base class says so
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} appears twice in one mapping", key_node.start_mark
                    )
                seen.add(key)
            return super().construct_mapping(node, deep)

    return UniqueKeys


def load_sweep_file(path: str) -> list[dict[str, str]]:
    """The trials of a ``--sweep-file`` (YAML or JSON): a list of mappings name -> value."""
    import yaml  # benchmark 9: a sweep from --sweep flags reads no YAML

    text = read_text(path, "--sweep-file")
    try:
        data = yaml.load(text, Loader=_unique_keys_loader(yaml))  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as e:
        first = str(e).splitlines()[0] if str(e) else "invalid YAML"
        raise UsageError(f"--sweep-file {path!r} is not valid YAML ({first})") from None
    except (ValueError, RecursionError) as e:  # an int past 4,300 digits; nesting too deep
        why = str(e).split(";")[0] or "nested too deeply"
        raise UsageError(f"--sweep-file {path!r}: a value in it cannot be read ({why})") from None
    check_size(data, f"--sweep-file {path!r}")
    if not isinstance(data, list) or not data:
        raise UsageError(f"--sweep-file {path!r}: expected {FILE_FORM}")
    trials = []
    for i, item in enumerate(data):
        where = f"--sweep-file {path!r}: trial {i}"
        if not isinstance(item, dict) or not item:
            raise UsageError(f"{where} is not a mapping of names to values; expected {FILE_FORM}")
        trials.append({str(k): _scalar_text(v, f"{where}, {k}") for k, v in item.items()})
    return trials


def sweep_from_cli(
    flags: Sequence[str], sweep_file: str | None, max_parallel: str | int | None
) -> Sweep:
    """The :class:`Sweep` of ``xrun run``'s ``--sweep``/``--sweep-file``/``--max-parallel``."""
    k: int | None = None
    if max_parallel is not None:
        text = str(max_parallel).strip()
        # Beyond MAX_TRIALS a bound changes nothing: capped, never a huge int.
        k = capped_int(text, MAX_TRIALS) if is_digits(text) else 0
        if k < 1:
            raise UsageError(
                f"--max-parallel {shown(max_parallel)} is invalid; expected an integer >= 1"
            )
    trials = load_sweep_file(sweep_file) if sweep_file else []
    sweep = Sweep(params=parse_sweep_flags(flags), trials=trials, max_parallel=k)
    sweep.validate()
    return sweep


# --------------------------------------------------------------------------- placeholders
def placeholders(text: str) -> list[str]:
    """The names of the ``{{name}}`` placeholders in ``text``."""
    return PLACEHOLDER_RE.findall(text) if "{{" in text else []


def substitute(text: str, values: Mapping[str, str]) -> str:
    """``text`` with each ``{{name}}`` of ``values`` replaced (other text left alone)."""
    if "{{" not in text:
        return text
    return PLACEHOLDER_RE.sub(lambda m: values.get(m.group(1), m.group(0)), text)


def reject_placeholders(texts: Sequence[str], where: str) -> None:
    """No sweep: a ``{{name}}`` would reach the job as it is, which is never what was meant."""
    for text in texts:
        found = placeholders(text)
        if found:
            raise UsageError(
                f"{where} {text!r} has the sweep placeholder {{{{{found[0]}}}}} but no sweep is "
                f"given; add --sweep {found[0]}=V1,V2,... (or a --sweep-file)"
            )


def reject_app_placeholders(app: AppDef, source: str) -> None:
    """:func:`reject_placeholders` for a saved AppDef (every string in it)."""
    reject_placeholders(_strings(appdef_to_dict(app)), f"{source}: the string")


def check_placeholders(texts: Sequence[str], names: Sequence[str], where: str) -> set[str]:
    """The names used; UsageError for a placeholder that names no sweep parameter."""
    used: set[str] = set()
    for text in texts:
        for name in placeholders(text):
            if name not in names:
                raise UsageError(
                    f"{where} {text!r}: unknown placeholder {{{{{name}}}}}; the sweep's names "
                    f"are {', '.join(names)} (add --sweep {name}=V1,V2,...)"
                )
            used.add(name)
    return used


def _map_strings(obj: Any, fn: Callable[[str], str]) -> Any:
    if isinstance(obj, str):
        return fn(obj)
    if isinstance(obj, list):
        return [_map_strings(x, fn) for x in obj]
    if isinstance(obj, dict):
        return {_map_strings(k, fn): _map_strings(v, fn) for k, v in obj.items()}
    return obj


def _strings(obj: Any) -> list[str]:
    """Every string in a JSON-like tree (keys included)."""
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, list):
        return [s for x in obj for s in _strings(x)]
    if isinstance(obj, dict):
        return [s for k, v in obj.items() for s in (*_strings(k), *_strings(v))]
    return []


def fill(template: AppDef, values: Mapping[str, str]) -> AppDef:
    """The template with ``values`` in its placeholders (every string of the AppDef)."""
    data = _map_strings(appdef_to_dict(template), lambda s: substitute(s, values))
    return appdef_from_dict(data, "sweep trial")


# --------------------------------------------------------------------------- the plan
@dataclass
class SweepPlan:
    """What a scheduler runs: the trial table and the trials' AppDefs (see the module doc)."""

    name: str
    params: list[str]
    trials: list[dict[str, str]]
    template: AppDef | None = None  # every trial is fill(template, values) ...
    apps: list[AppDef] | None = None  # ... or its own AppDef
    max_parallel: int | None = None
    # Why there is no template (a Slurm array needs one), "" when there is.
    why_no_template: str = ""

    def __len__(self) -> int:
        return len(self.trials)

    def app(self, index: int) -> AppDef:
        """Trial ``index``'s AppDef, its env (``XRUN_SWEEP_*``...) in every role."""
        values = self.trials[index]
        if self.template is not None:
            app = fill(self.template, values)
        else:
            assert self.apps is not None
            app = appdef_from_dict(appdef_to_dict(self.apps[index]), "sweep trial")
        env = trial_env(values, index, len(self.trials))
        for role in app.roles:
            role.env = {**role.env, **env}
        return app

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "params": self.params,
            "trials": self.trials,
            "template": appdef_to_dict(self.template) if self.template else None,
            "apps": [appdef_to_dict(a) for a in self.apps] if self.apps is not None else None,
            "max_parallel": self.max_parallel,
        }

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> SweepPlan:
        template = data.get("template")
        apps = data.get("apps")
        return SweepPlan(
            name=str(data["name"]),
            params=list(data["params"]),
            trials=[dict(t) for t in data["trials"]],
            template=appdef_from_dict(template, "sweep template") if template else None,
            apps=[appdef_from_dict(a, "sweep trial") for a in apps] if apps is not None else None,
            max_parallel=data.get("max_parallel"),
        )


def _name_of(app: AppDef) -> str:
    return PLACEHOLDER_RE.sub(lambda m: m.group(1), app.name)


def plan_from_app(template: AppDef, sweep: Sweep) -> SweepPlan:
    """The plan for an AppDef whose strings hold ``{{name}}`` placeholders (the Python API and
    ``xrun run --sweep ... SPEC.yaml``)."""
    trials = sweep.expand()
    names = sweep.names()
    check_placeholders(_strings(appdef_to_dict(template)), names, "the AppDef's")
    template.validate()
    return SweepPlan(_name_of(template), names, trials, template, None, sweep.max_parallel)


def plan_from_args(
    make: Callable[[list[str]], AppDef], args: Sequence[str], sweep: Sweep
) -> SweepPlan:
    """The plan for a component called with ``args`` (``make(args)`` calls it)."""
    trials = sweep.expand()
    names = sweep.names()
    used = check_placeholders(list(args), names, "component argument")
    if not used:  # the values reach the workers through the env only
        return plan_from_app(make(list(args)), sweep)
    template, why = _template(make, args, trials, used)
    if template is not None:
        return SweepPlan(_name_of(template), names, trials, template, None, sweep.max_parallel)
    apps = []
    for i, values in enumerate(trials):
        try:
            apps.append(make([substitute(a, values) for a in args]))
        except UsageError as e:
            raise UsageError(f"trial {i} ({_show(values)}): {e}") from None
    plan = SweepPlan(apps[0].name, names, trials, None, apps, sweep.max_parallel)
    plan.why_no_template = why
    return plan


def _show(values: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in values.items())


def _template(
    make: Callable[[list[str]], AppDef],
    args: Sequence[str],
    trials: list[dict[str, str]],
    used: set[str],
) -> tuple[AppDef | None, str]:
    """(the template AppDef, "") or (None, why the component must be called per trial)."""
    for values in trials:
        for name in sorted(used):
            if not _PLAIN_RE.fullmatch(values[name]):
                return None, (
                    f"value {values[name]!r} of {name} is not plain text (letters, digits and "
                    "_@%+=:,./-), so the component may quote it"
                )
    token = os.urandom(4).hex()
    words = {n: f"xrun-sweep-{token}-{n}-" for n in used}
    try:
        probe = make([substitute(a, words) for a in args])
    except UsageError:
        return None, "the component reads a value itself (a placeholder in a typed option, e.g. -j)"
    back = {w: "{{" + n + "}}" for n, w in words.items()}
    pattern = re.compile("|".join(map(re.escape, back)))
    data = appdef_to_dict(probe)
    seen = {w for s in _strings(data) for w in pattern.findall(s)}
    if seen != set(back):
        return None, "the component transforms the values (they do not reach the AppDef as given)"
    data = _map_strings(data, lambda s: pattern.sub(lambda m: back[m.group(0)], s))
    if any(token in s for s in _strings(data)):
        return None, "the component transforms the values (they do not reach the AppDef as given)"
    try:
        template = appdef_from_dict(data, "sweep template")
    except UsageError:  # e.g. a placeholder in a role name, where braces are not allowed
        return None, "a value ends up where a placeholder cannot stand (e.g. a role name)"
    for values in {0: trials[0], len(trials) - 1: trials[-1]}.values():
        real = make([substitute(a, values) for a in args])
        if appdef_to_dict(real) != appdef_to_dict(fill(template, values)):
            return None, "the component builds a different app for different values"
    return template, ""
