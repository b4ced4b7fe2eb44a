"""What every scheduler implements, and the registry that finds them.

A scheduler turns an :class:`~xrun.specs.AppDef` into a *request value*
(:meth:`Scheduler.submit_dryrun` -> :class:`AppDryRunInfo`) and only
:meth:`Scheduler.schedule` executes it. ``--dryrun`` prints the value; tests check it without the
backend.
"""

from __future__ import annotations

import abc
import enum
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from xrun.contract import RESTARTS_IN_PLACE, SCHEDULER_ALIASES
from xrun.errors import UsageError
from xrun.record import Value
from xrun.specs import AppDef, AppState, AppStatus, Role, RoleStatus

# A scheduler's run options (plugins import these from here, as from TorchX's api).
from .options import CfgVal as CfgVal
from .options import option as option
from .options import runopt as runopt
from .options import runopts as runopts
from .options import type_name as type_name

if TYPE_CHECKING:
    from xrun.sweeps.backend import SweepBackend

    from .stacks import NodeStacks
    from .workspace import Workspace

T = TypeVar("T")


@dataclass
class AppDryRunInfo(Generic[T]):
    """A scheduler's request for one app, not yet executed. ``str()`` is what --dryrun prints."""

    request: T
    fmt: Callable[[T], str]
    app: AppDef | None = None
    # The resolved run options: the scheduler's options dataclass (a plugin's: a dict).
    cfg: Any = field(default_factory=dict)
    scheduler: str = ""

    def __str__(self) -> str:
        return self.fmt(self.request)

    # TorchX's names for the same fields: code written for TorchX reads them (e.g. a runner's
    # dry run's ``info._app.roles``).
    @property
    def _app(self) -> AppDef | None:
        return self.app

    @property
    def _scheduler(self) -> str:
        return self.scheduler

    @property
    def _cfg(self) -> Any:
        return self.cfg


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

    def app_status(self) -> AppStatus:
        """What the Python API and ``xrun status`` show of it."""
        return AppStatus(
            state=self.state,
            num_restarts=self.num_restarts,
            msg=self.msg,
            structured_error_msg=self.structured_error_msg,
            ui_url=self.ui_url,
            roles=list(self.roles_statuses),
        )


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


class LogQuery(Value):
    """Which lines of one replica's log: made once at the edge (the CLI, ``Runner.log_lines``,
    TorchX's ``log_iter``), carried as one value through runner, sweeps and schedulers.

    ``since``/``until``: epoch seconds (schedulers whose files carry no timestamps ignore
    them); ``follow``: keep reading until the app ends; ``streams``: None is the scheduler's
    combined log. A plain value class: a dataclass costs every local run (benchmarks 1 and 5)
    ~0.5 ms to make.
    """

    role: str
    k: int = 0
    regex: str | None = None
    since: float | None = None
    until: float | None = None
    follow: bool = False
    streams: Stream | None = None

    def stream_names(self) -> list[str]:
        """The files' stream names: ``["stdout"]``, ``["stderr"]`` or both."""
        return {Stream.STDOUT: ["stdout"], Stream.STDERR: ["stderr"]}.get(
            self.streams or Stream.COMBINED, ["stdout", "stderr"]
        )

    def filter(self, lines: Iterable[str]) -> Iterator[str]:
        """``lines`` that match ``regex``."""
        return filter_regex(self.regex, lines)


# --------------------------------------------------------------------------- the interface
class Scheduler(abc.ABC, Generic[T]):
    """Base of every scheduler. Subclasses set ``backend`` and implement the abstract methods."""

    backend: str = ""

    def __init__(self, session_name: str) -> None:
        self.session_name = session_name

    @abc.abstractmethod
    def run_opts(self) -> runopts[Any]:
        """The run options; the builtins' ``runopts(TheirOptions)`` (a dataclass)."""

    def open_workspace(self, given: Workspace | str | None) -> Workspace | None:
        """``--workspace`` ``given`` opened for this scheduler's jobs: the one value that
        :meth:`submit_dryrun` puts in the request and :meth:`submit` makes available. The
        Runner calls it once (a caller that passes a string to submit_dryrun or submit gets
        it called there); None: no workspace.

        The default, for TorchX's plugins, which know no workspace: None (their jobs run what
        their images or their cwd hold). The builtins open it (``schedulers/workspace.py``),
        or say why they run none (local_cwd)."""
        return None

    def submit_dryrun(
        self, app: AppDef, cfg: Mapping[str, object], workspace: Workspace | str | None = None
    ) -> AppDryRunInfo[T]:
        """The request for ``app``, with ``workspace`` (see :meth:`open_workspace`) in it; a
        dry run makes nothing, builds nothing."""
        ws = self.open_workspace(workspace)
        opts = self._checked(app, cfg)
        # TorchX's plugins take (app, cfg): they open no workspace, so they are given none.
        info = self._submit_dryrun(app, opts) if ws is None else self._submit_dryrun(app, opts, ws)
        return self._stamped(info, app, opts)

    def _checked(self, app: AppDef, cfg: Mapping[str, object]) -> Any:
        """``cfg`` resolved (see below), and ``app`` checked against it: UsageError."""
        opts = self.run_opts().resolve(cfg, self.backend)
        app.validate()
        self._validate(app, opts)
        return opts

    def _stamped(self, info: AppDryRunInfo[T], app: AppDef, opts: Any) -> AppDryRunInfo[T]:
        """``info`` with what it was made from: the app, the resolved options, the scheduler."""
        info.app = app
        info.cfg = opts
        info.scheduler = self.backend
        return info

    # ``cfg`` below is what ``run_opts().resolve`` made: the scheduler's options dataclass (a
    # subclass names it in its signature), or a plugin's dict of TorchX-style run options.
    def _validate(self, app: AppDef, cfg: Any) -> None:
        """Scheduler-specific checks of the app (raise UsageError)."""

    @abc.abstractmethod
    def _submit_dryrun(
        self, app: AppDef, cfg: Any, workspace: Workspace | None = None
    ) -> AppDryRunInfo[T]:
        """The request; ``workspace``: what :meth:`open_workspace` opened (given only to a
        scheduler that opens one)."""

    @abc.abstractmethod
    def schedule(self, dryrun_info: AppDryRunInfo[T]) -> str:
        """Execute the request; return the app id."""

    def submit(
        self, app: AppDef, cfg: Mapping[str, object], workspace: Workspace | str | None = None
    ) -> str:
        """Execute the request :meth:`submit_dryrun` makes with the same arguments."""
        return self.schedule(self.submit_dryrun(app, cfg, workspace))

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
        """TorchX's signature; xrun's schedulers implement :meth:`logs`."""
        return self.logs(app_id, LogQuery(role_name, k, regex, since, until, should_tail, streams))

    def logs(self, app_id: str, query: LogQuery) -> Iterable[str]:
        """The lines of one replica's log that ``query`` asks for."""
        raise UsageError(f"scheduler {self.backend} does not support logs")

    def sweep_backend(self) -> SweepBackend | None:
        """How this scheduler runs a sweep as one request of its own (Slurm: one job array).
        None, the default: :mod:`xrun.sweeps` runs each trial as an ordinary app of this
        scheduler, at most K at once (:class:`xrun.sweeps.trials.TrialsBackend`)."""
        return None

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


class WorkspaceBuilder(abc.ABC):
    """A scheduler that builds the workspace into what its jobs run declares it by this base
    (docker: an image on each role's image); TorchX's ``WorkspaceMixin``. Its :meth:`submit`
    builds before it schedules, a sweep of trials builds once for every trial
    (``xrun.sweeps.trials``), and the CLI makes the cwd its workspace when none is given. A dry
    run never builds: it shows the workspace that submit would build."""

    def open_workspace(self, given: Workspace | str | None) -> Workspace | None:
        """What it builds, opened (see :meth:`Scheduler.open_workspace`); None: none, the
        role images run unchanged."""
        from .workspace import as_workspace

        return as_workspace(given)

    @abc.abstractmethod
    def build_workspace(self, roles: Iterable[Role], workspace: Workspace, cfg: Any) -> None:
        """Build ``workspace`` into each distinct image of ``roles`` once, and point each role
        at its result. ``cfg``: the resolved run options (``AppDryRunInfo.cfg``)."""


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

    name = SCHEDULER_ALIASES.get(name, name)  # TorchX's local_docker is docker
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
    import difflib  # benchmark 5: only a misspelt name needs it

    close = difflib.get_close_matches(name, names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise UsageError(f"unknown scheduler {name!r}{hint}; available: {', '.join(names)}")


def get_scheduler(name: str, session_name: str = "default", **kwargs: Any) -> Scheduler[Any]:
    return get_scheduler_factory(name)(session_name, **kwargs)
