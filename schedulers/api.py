"""What every scheduler implements, and the registry that finds them.

A scheduler turns an :class:`~xrun.specs.AppDef` into a *request value*
(:meth:`Scheduler.submit_dryrun` -> :class:`AppDryRunInfo`) and only
:meth:`Scheduler.schedule` executes it. ``--dryrun`` prints the value; tests check it without the
backend.
"""

from __future__ import annotations

import abc
import difflib
import enum
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from xrun.contract import RESTARTS_IN_PLACE
from xrun.errors import UsageError
from xrun.limits import check_duration, shown
from xrun.specs import AppDef, AppState, Role, RoleStatus

if TYPE_CHECKING:
    from .stacks import NodeStacks

T = TypeVar("T")
CfgVal = str | int | float | bool | list[str] | dict[str, str] | None


@dataclass
class AppDryRunInfo(Generic[T]):
    """A scheduler's request for one app, not yet executed. ``str()`` is what --dryrun prints."""

    request: T
    fmt: Callable[[T], str]
    app: AppDef | None = None
    cfg: Mapping[str, CfgVal] = field(default_factory=dict)
    scheduler: str = ""

    def __str__(self) -> str:
        return self.fmt(self.request)


# --------------------------------------------------------------------------- run options
@dataclass
class runopt:  # noqa: N801 - TorchX's name
    name: str
    type_: type
    help: str
    default: CfgVal = None
    required: bool = False
    aliases: tuple[str, ...] = ()  # other spellings accepted (TorchX's, e.g. mail-user)
    # A number of seconds: 0 to MAX_DURATION_S (a day), like every duration xrun takes.
    seconds: bool = False


_TYPE_NAMES: dict[type, str] = {
    str: "str",
    int: "int",
    float: "float",
    bool: "bool",
    list: "list[str]",
    dict: "dict[str, str]",
}


def type_name(type_: type) -> str:
    """How a run option's type is shown (``xrun runopts``, ``xrun configure``)."""
    return _TYPE_NAMES.get(type_, type_.__name__)


_TRUE = {"true", "1", "yes", "y", "on"}
_FALSE = {"false", "0", "no", "n", "off"}


class _NotConvertible(Exception):
    """A converter's "this value is not a valid one of my type" (the caller names the option)."""


def _to_bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    s = str(value).strip().lower()
    if s in _TRUE:
        return True
    if s in _FALSE:
        return False
    raise _NotConvertible


def _to_int(value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    # ASCII digits, and few enough of them for int() (Python reads at most 4,300).
    if isinstance(value, str) and re.fullmatch(r"[+-]?[0-9]{1,4000}", value.strip()):
        return int(value)
    raise _NotConvertible


def _to_float(value: object) -> float:
    """A finite number: no run option means anything by NaN or an infinity."""
    out = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        out = float(value) if abs(value) < 1e308 else None
    elif isinstance(value, str):
        try:
            out = float(value)
        except ValueError:
            pass
    if out is None or not math.isfinite(out):
        raise _NotConvertible
    return out


def _to_str(value: object) -> str:
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    raise _NotConvertible


def _to_list(value: object) -> list[str]:
    """A list, or a string split on ``;`` (on ``,`` when it has no ``;``), blanks dropped."""
    if isinstance(value, list):
        return [str(v) for v in value]
    if isinstance(value, str):
        return [v for v in (s.strip() for s in value.split(";" if ";" in value else ",")) if v]
    raise _NotConvertible


def _to_dict(value: object) -> dict[str, str]:
    """A dict, or a string ``K1:V1;K2:V2`` (every item needs a key and a ``:``)."""
    if isinstance(value, dict):
        return {str(k): str(v) for k, v in value.items()}
    if isinstance(value, str):
        out: dict[str, str] = {}
        for item in filter(None, (s.strip() for s in value.split(";"))):
            k, sep, v = item.partition(":")
            if not sep or not k:
                raise _NotConvertible
            out[k] = v
        return out
    raise _NotConvertible


# One converter per run option type: a value of any other type, or one its converter refuses,
# is a UsageError that names the option.
_CONVERTERS: dict[type, Callable[[object], CfgVal]] = {
    bool: _to_bool,
    int: _to_int,
    float: _to_float,
    str: _to_str,
    list: _to_list,
    dict: _to_dict,
}


def _convert(opt: runopt, value: object) -> CfgVal:
    """Convert a config value (often a string from the CLI or a config file) to the option's
    type; a duration must be 0 to a day."""
    if value is None:
        return None
    converter = _CONVERTERS.get(opt.type_)
    if converter is not None:
        try:
            out = converter(value)
        except _NotConvertible:
            pass
        else:
            if opt.seconds:
                check_duration(out, f"run option {opt.name}")  # type: ignore[arg-type]
            return out
    expected = _TYPE_NAMES.get(opt.type_, opt.type_.__name__)
    if opt.type_ is float:
        expected = "finite float"
    raise UsageError(f"run option {opt.name}={shown(value)} is not a valid {expected}")


class runopts:  # noqa: N801 - TorchX's name
    """A scheduler's typed, self-describing run options (``xrun runopts S`` prints them)."""

    def __init__(self) -> None:
        self._opts: dict[str, runopt] = {}
        self._aliases: dict[str, str] = {}

    def add(
        self,
        name: str,
        type_: type,
        help: str,
        default: CfgVal = None,
        required: bool = False,
        aliases: tuple[str, ...] = (),
        seconds: bool = False,
    ) -> None:
        self._opts[name] = runopt(name, type_, help, default, required, aliases, seconds)
        self._aliases.update(dict.fromkeys(aliases, name))

    def __iter__(self) -> Iterator[runopt]:
        return iter(self._opts.values())

    def __contains__(self, name: object) -> bool:
        return name in self._opts or name in self._aliases

    def get(self, name: str) -> runopt | None:
        """The option called ``name`` or one of its aliases."""
        return self._opts.get(self._aliases.get(name, name))

    def canonical(self, cfg: Mapping[str, object], scheduler: str = "") -> dict[str, object]:
        """``cfg`` with aliases replaced by the option's name; UsageError for an unknown key or
        an option given under two spellings."""
        out: dict[str, object] = {}
        for key, value in cfg.items():
            opt = self.get(key)
            if opt is None:
                close = difflib.get_close_matches(key, [*self._opts, *self._aliases], n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                valid = ", ".join(self._opts) or "none"
                raise UsageError(
                    f"unknown run option {key!r} for scheduler {scheduler or '?'}{hint}; valid: {valid}"
                )
            if opt.name in out:
                raise UsageError(
                    f"run option {opt.name!r} is given twice (also as {key!r}); give it once"
                )
            out[opt.name] = value
        return out

    def resolve(self, cfg: Mapping[str, object], scheduler: str = "") -> dict[str, CfgVal]:
        """Fill defaults, convert values to their types, reject unknown or missing keys."""
        cfg = self.canonical(cfg, scheduler)
        out: dict[str, CfgVal] = {}
        for opt in self._opts.values():
            if opt.name in cfg and cfg[opt.name] is not None:
                out[opt.name] = _convert(opt, cfg[opt.name])
            elif opt.required:
                raise UsageError(
                    f"run option {opt.name!r} is required for scheduler {scheduler or '?'}: "
                    f"pass -cfg {opt.name}=VALUE ({opt.help})"
                )
            else:
                out[opt.name] = opt.default
        return out

    def __str__(self) -> str:
        lines = []
        for o in self._opts.values():
            tname = type_name(o.type_)
            req = "required" if o.required else f"default: {o.default!r}"
            also = f", also {', '.join(o.aliases)}" if o.aliases else ""
            lines.append(f"    {o.name} ({tname}, {req}{also})\n        {o.help}")
        return "\n".join(lines)


# --------------------------------------------------------------------------- responses
@dataclass
class DescribeAppResponse:
    app_id: str
    state: AppState = AppState.UNKNOWN
    num_restarts: int = 0
    msg: str = ""
    structured_error_msg: str = ""
    ui_url: str | None = None
    roles_statuses: list[RoleStatus] = field(default_factory=list)
    roles: list[Role] = field(default_factory=list)


@dataclass
class ListAppResponse:
    app_id: str
    state: AppState
    name: str = ""
    app_handle: str = ""


class Stream(str, enum.Enum):
    STDOUT = "stdout"
    STDERR = "stderr"
    COMBINED = "combined"


# --------------------------------------------------------------------------- the interface
class Scheduler(abc.ABC, Generic[T]):
    """Base of every scheduler. Subclasses set ``backend`` and implement the abstract methods."""

    backend: str = ""

    def __init__(self, session_name: str) -> None:
        self.session_name = session_name

    @abc.abstractmethod
    def run_opts(self) -> runopts: ...

    def submit_dryrun(self, app: AppDef, cfg: Mapping[str, object]) -> AppDryRunInfo[T]:
        resolved = self.run_opts().resolve(cfg, self.backend)
        app.validate()
        self._validate(app, resolved)
        info = self._submit_dryrun(app, resolved)
        info.app = app
        info.cfg = resolved
        info.scheduler = self.backend
        return info

    def _validate(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> None:
        """Scheduler-specific checks of the app (raise UsageError)."""

    @abc.abstractmethod
    def _submit_dryrun(self, app: AppDef, cfg: dict[str, CfgVal]) -> AppDryRunInfo[T]: ...

    @abc.abstractmethod
    def schedule(self, dryrun_info: AppDryRunInfo[T]) -> str:
        """Execute the request; return the app id."""

    def build_workspace(self, app: AppDef, workspace: str, cfg: Mapping[str, object]) -> None:
        """Make ``workspace`` (a local dir) available to the app, e.g. build an image.

        The default does nothing: schedulers that run in the cwd need no copy.
        """

    def submit(self, app: AppDef, cfg: Mapping[str, object], workspace: str | None = None) -> str:
        if workspace:
            self.build_workspace(app, workspace, cfg)
        return self.schedule(self.submit_dryrun(app, cfg))

    @abc.abstractmethod
    def describe(self, app_id: str) -> DescribeAppResponse | None:
        """The app's status, or None when the scheduler does not know it."""

    def log_iter(
        self,
        app_id: str,
        role_name: str,
        k: int = 0,
        regex: str | None = None,
        since: float | None = None,
        until: float | None = None,
        should_tail: bool = False,
        streams: Stream | None = None,
    ) -> Iterable[str]:
        raise UsageError(f"scheduler {self.backend} does not support logs")

    def stacks(self, app_id: str, timeout: float = 10.0) -> Sequence[NodeStacks]:
        """Every replica's runtime agent's answer to a stack request (``schedulers.stacks``:
        a list of ``NodeStacks``), waiting up to ``timeout`` s."""
        raise UsageError(f"scheduler {self.backend} cannot collect stacks")

    @abc.abstractmethod
    def cancel(self, app_id: str) -> None:
        """Stop the app; it ends CANCELLED. Unknown app -> AppNotFoundError."""

    @abc.abstractmethod
    def list(self) -> list[ListAppResponse]: ...

    def wait(self, app_id: str, timeout: float | None = None) -> DescribeAppResponse | None:
        """Block until the app is terminal (or ``timeout`` passes); None when unknown.

        The default polls :meth:`describe` with backoff; schedulers that can be told
        (a child process, a blocking API) override it.
        """
        import time

        from xrun.specs import is_terminal

        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.05
        while True:
            resp = self.describe(app_id)
            if resp is None or is_terminal(resp.state):
                return resp
            if deadline is not None and time.monotonic() >= deadline:
                return resp
            time.sleep(delay)
            delay = min(delay * 1.5, 1.0)

    def exists(self, app_id: str) -> bool:
        return self.describe(app_id) is not None

    def close(self) -> None:
        """Release clients/connections."""


def replicas_role_may_lose(role: Role) -> int:
    """How many of ``role``'s replicas may fail before the app fails (gang semantics relaxed
    for elastic roles): down to ``max(min_replicas, 1)`` survivors; 0 for a fixed-size role."""
    floor = role.min_replicas if role.min_replicas is not None else role.num_replicas
    return role.num_replicas - max(floor, 1)


def scheduler_retries(role: Role) -> int:
    """How many times a scheduler itself runs a failed replica of ``role`` again.

    ``max_retries`` counts the retries of the *job*, whoever makes them: total attempts
    ``max_retries + 1``. A role whose runtime agents restart the workers in place (the dist
    components mark it, see :data:`xrun.contract.RESTARTS_IN_PLACE`) already spends them, so
    the scheduler adds none; any other role's retries are the scheduler's (TorchX's meaning).
    """
    return 0 if role.metadata.get(RESTARTS_IN_PLACE) else role.max_retries


def filter_regex(regex: str | None, lines: Iterable[str]) -> Iterator[str]:
    """Lines matching ``regex`` (all lines when None); a bad pattern is a UsageError."""
    if not regex:
        yield from lines
        return
    try:
        pattern = re.compile(regex)
    except re.error as e:
        raise UsageError(f"--regex {regex!r} is not a valid regular expression: {e}") from None
    for line in lines:
        if pattern.search(line):
            yield line


# --------------------------------------------------------------------------- registry
# Builtins by dotted path (imported on first use), with what to install when the import fails.
_BUILTINS: dict[str, tuple[str, str]] = {
    "local_cwd": ("xrun.schedulers.local_cwd", ""),
    "slurm": ("xrun.schedulers.slurm", ""),
    "docker": ("xrun.schedulers.docker", "pip install 'xrun[docker]'"),
}

SchedulerFactory = Callable[..., Scheduler[Any]]


def _plugin_entry_points() -> dict[str, Any]:
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group="xrun.schedulers")}


def scheduler_names() -> list[str]:
    """Builtins first, then plugins (a plugin never replaces a builtin)."""
    plugins = [n for n in _plugin_entry_points() if n not in _BUILTINS]
    return list(_BUILTINS) + sorted(plugins)


def get_scheduler_factory(name: str) -> SchedulerFactory:
    import importlib

    if name in _BUILTINS:
        module_name, hint = _BUILTINS[name]
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            extra = f"; {hint}" if hint else ""
            raise UsageError(f"scheduler {name!r} cannot be loaded ({e}){extra}") from None
        factory: SchedulerFactory = module.create_scheduler
        return factory
    eps = _plugin_entry_points()
    if name in eps:
        try:
            loaded: SchedulerFactory = eps[name].load()
        except Exception as e:  # a broken plugin must not look like a missing one
            raise UsageError(f"scheduler plugin {name!r} failed to load: {e}") from None
        return loaded
    names = scheduler_names()
    close = difflib.get_close_matches(name, names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise UsageError(f"unknown scheduler {name!r}{hint}; available: {', '.join(names)}")


def get_scheduler(name: str, session_name: str = "default", **kwargs: Any) -> Scheduler[Any]:
    return get_scheduler_factory(name)(session_name, **kwargs)
