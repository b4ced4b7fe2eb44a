"""The Python API: launch and watch jobs from a script or notebook, as the CLI does.

::

    from xrun.runner import get_runner

    with get_runner() as runner:
        handle = runner.run_component("dist.ddp", ["--script", "train.py", "-j", "1x2"],
                                      scheduler="local_cwd")
        print(runner.wait(handle))          # AppStatus(state=SUCCEEDED, ...)
        for line in runner.log_lines(handle, "train", k=0):
            print(line, end="")

The runner applies ``.xrunconfig`` (see :mod:`xrun.config`): run-option defaults for the
scheduler and argument defaults for the component; explicit arguments win. Schedulers are
created on first use through :func:`xrun.schedulers.api.get_scheduler`, one per (scheduler,
session), and closed by :meth:`Runner.close`.

The signatures, parameter names, defaults and return values are TorchX 0.7.0's
(``torchx.runner.api``), so code written for TorchX's runner runs unchanged;
``tests/core/test_runner_parity.py`` holds them against a recording of TorchX. xrun's own
extra parameters are keyword-only.
"""

from __future__ import annotations

import copy
import dataclasses
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

from xrun.component import Component, call_component, get_component
from xrun.config import Config
from xrun.config import load as load_config
from xrun.errors import UsageError
from xrun.schedulers.api import LogQuery, get_scheduler, scheduler_names
from xrun.schedulers.options import resolve_run_options
from xrun.specs import AppDef, AppStatus, macros, make_app_handle
from xrun.sweeps.handles import Target, backend_for, resolve
from xrun.tracker.submit import job_env, run_id

if TYPE_CHECKING:
    import datetime

    from xrun.schedulers.api import (
        AppDryRunInfo,
        ListAppResponse,
        Scheduler,
        Stream,
        runopts,
    )
    from xrun.schedulers.stacks import AppStacks
    from xrun.schedulers.workspace import Workspace
    from xrun.sweeps.backend import SweepBackend
    from xrun.sweeps.plan import Sweep, SweepPlan
    from xrun.sweeps.status import SweepStatus


# A scheduler factory, as TorchX's ``SchedulerFactory``: (session name, **params) -> Scheduler.
SchedulerFactory = Callable[..., "Scheduler[Any]"]

# The session the CLI and get_runner() share, so `xrun list` shows the apps a script started.
DEFAULT_SESSION = "default"


class Runner:
    """Submits AppDefs (or components) to schedulers and answers about the apps by handle."""

    def __init__(
        self,
        name: str = DEFAULT_SESSION,
        scheduler_factories: Mapping[str, SchedulerFactory] | None = None,
        component_defaults: Mapping[str, Mapping[str, str]] | None = None,
        scheduler_params: Mapping[str, object] | None = None,
        *,
        config: Config | None = None,
    ) -> None:
        """``name``: the session (the middle of every handle); ``scheduler_factories``: the
        schedulers this runner may use (None: xrun's registry, builtins and plugins);
        ``component_defaults``: per component, argument defaults over the config files';
        ``scheduler_params``: keyword arguments for every scheduler's factory; ``config``:
        None reads ``.xrunconfig`` from the cwd and home on first use."""
        self.session_name = name
        self._factories = dict(scheduler_factories) if scheduler_factories is not None else None
        self._component_defaults = {k: dict(v) for k, v in (component_defaults or {}).items()}
        self._config = config
        self._params = dict(scheduler_params or {})
        self._schedulers: dict[tuple[str, str], Scheduler[Any]] = {}
        # the apps this runner submitted, by handle: describe() returns them as given (TorchX)
        self._apps: dict[str, AppDef] = {}

    def name(self) -> str:
        """The session name (TorchX's ``Runner.name()``)."""
        return self.session_name

    # ------------------------------------------------------------------ plumbing
    @property
    def config(self) -> Config:
        if self._config is None:
            self._config = load_config(schedulers=scheduler_names)
        return self._config

    def scheduler(self, name: str, session: str | None = None) -> Scheduler[Any]:
        """The (cached) scheduler ``name`` for ``session`` (default: this runner's)."""
        key = (name, session or self.session_name)
        if key not in self._schedulers:
            if self._factories is None:
                self._schedulers[key] = get_scheduler(name, key[1], **self._params)
            elif name in self._factories:
                self._schedulers[key] = self._factories[name](key[1], **self._params)
            else:
                raise UsageError(
                    f"unknown scheduler {name!r}; this runner has: {', '.join(self._factories)}"
                )
        return self._schedulers[key]

    def scheduler_backends(self) -> list[str]:
        """The scheduler names this runner may use."""
        return list(self._factories) if self._factories is not None else scheduler_names()

    def scheduler_run_opts(self, scheduler: str) -> runopts[Any]:
        """``scheduler``'s run options (``print()`` them for the table ``xrun runopts`` shows)."""
        return self.scheduler(scheduler).run_opts()

    def run_cfg(self, scheduler: str, cfg: Mapping[str, object] | None) -> dict[str, object]:
        """The config files' run options for ``scheduler`` under the explicit ``cfg``."""
        sched = self.scheduler(scheduler)
        opts = sched.run_opts()
        defaults = self.config.usable(
            self.config.scheduler_defaults(scheduler),
            lambda k: opts.get(k) is not None,
            f"{scheduler} run option",
        )
        merged: dict[str, object] = dict(resolve_run_options(opts, defaults, scheduler))
        merged.update(opts.canonical(cfg or {}, scheduler))  # mail-user and mail_user: one key
        return merged

    # ------------------------------------------------------------------ submitting
    def component_app(self, component: str, args: Sequence[str]) -> AppDef:
        """Call a component with CLI-style ``args`` (its config-file defaults applied, then the
        runner's ``component_defaults``)."""
        comp = get_component(component)
        defaults = self._component_config(comp)
        given = self._component_defaults.get(component, self._component_defaults.get(comp.name))
        where = "Runner(component_defaults=...)"
        defaults.update({k: (v, where) for k, v in (given or {}).items()})
        return call_component(comp, args, defaults)

    def _component_config(self, comp: Component) -> dict[str, tuple[str, str]]:
        """The config files' defaults for ``comp`` (a parameter it lacks that only a
        .torchxconfig names is skipped, as TorchX skips it)."""
        return self.config.usable(
            self.config.component_defaults(comp.name),
            lambda k: comp.option(k) is not None,
            f"{comp.name} parameter",
        )

    def with_job_env(self, app: AppDef, scheduler: str, parent_run_id: str | None = None) -> AppDef:
        """A copy of ``app`` whose roles' env tells the replicas their job (``TORCHX_JOB_ID``,
        the tracking variables: see :mod:`xrun.tracker.submit`); ``app`` itself is untouched, so the
        YAML ``--dryrun`` prints runs again on any scheduler."""
        out = copy.deepcopy(app)
        env = job_env(
            make_app_handle(scheduler, self.session_name, macros.app_id),
            parent_run_id,
            self.config,
            run_id(scheduler, self.session_name, macros.app_id),
        )
        for role in out.roles:
            role.env.update(env)
        return out

    def dryrun(
        self,
        app: AppDef,
        scheduler: str,
        cfg: Mapping[str, object] | None = None,
        workspace: Workspace | str | None = None,
        parent_run_id: str | None = None,
    ) -> AppDryRunInfo[Any]:
        """The scheduler's request for ``app``, not executed (print it to see what would run):
        the same request :meth:`run` executes with the same ``workspace`` (None: none; the
        scheduler's :meth:`~xrun.schedulers.api.Scheduler.open_workspace` says what it is)."""
        job = self.with_job_env(app, scheduler, parent_run_id)
        sched = self.scheduler(scheduler)
        ws = sched.open_workspace(workspace)  # once: the request carries the value
        return sched.submit_dryrun(job, self.run_cfg(scheduler, cfg), ws)

    def dryrun_component(
        self,
        component: str,
        component_args: Sequence[str],
        scheduler: str,
        cfg: Mapping[str, object] | None = None,
        workspace: Workspace | str | None = None,
        parent_run_id: str | None = None,
    ) -> AppDryRunInfo[Any]:
        app = self.component_app(component, component_args)
        return self.dryrun(app, scheduler, cfg, workspace, parent_run_id)

    def schedule(self, dryrun_info: AppDryRunInfo[Any]) -> str:
        """Execute a request from :meth:`dryrun`; returns the app handle."""
        if not dryrun_info.scheduler:
            raise UsageError("this AppDryRunInfo has no scheduler; get it from Runner.dryrun")
        app_id = self.scheduler(dryrun_info.scheduler).schedule(dryrun_info)
        handle = make_app_handle(dryrun_info.scheduler, self.session_name, app_id)
        if dryrun_info.app is not None:
            self._apps[handle] = dryrun_info.app
        return handle

    def run(
        self,
        app: AppDef,
        scheduler: str,
        cfg: Mapping[str, object] | None = None,
        workspace: Workspace | str | None = None,
        parent_run_id: str | None = None,
    ) -> str:
        """Submit ``app``; returns its handle ``scheduler://session/app_id`` at once."""
        sched = self.scheduler(scheduler)
        ws = sched.open_workspace(workspace)  # once: the request carries the value
        job = self.with_job_env(app, scheduler, parent_run_id)
        app_id = sched.submit(job, self.run_cfg(scheduler, cfg), ws)
        handle = make_app_handle(scheduler, self.session_name, app_id)
        self._apps[handle] = job
        return handle

    def run_component(
        self,
        component: str,
        component_args: Sequence[str],
        scheduler: str,
        cfg: Mapping[str, object] | None = None,
        workspace: Workspace | str | None = None,
        parent_run_id: str | None = None,
    ) -> str:
        app = self.component_app(component, component_args)
        return self.run(app, scheduler, cfg, workspace, parent_run_id)

    # ------------------------------------------------------------------ watching
    # Every verb below takes any handle: an app's, a sweep's, or a trial's (SWEEP/TRIAL); the
    # handle's target has the verb (see :mod:`xrun.sweeps.handles`).
    def target(self, handle: str, max_rest: int = 0) -> Target:
        """What ``handle`` names, with the verbs, asking this runner's schedulers."""
        return resolve(handle, self.scheduler, max_rest)

    def _target(self, handle: str | Target) -> Target:
        """A CLI command resolves its handle once (:meth:`target`) and hands the verbs the
        Target; an API caller hands them the handle's text."""
        return handle if isinstance(handle, Target) else self.target(handle)

    def status(self, app_handle: str | Target) -> AppStatus | SweepStatus | None:
        """The app's (or trial's) status; a sweep's: every trial's (a
        :class:`~xrun.sweeps.status.SweepStatus`). None when unknown."""
        return self._target(app_handle).status()

    def wait(
        self, app_handle: str | Target, wait_interval: float = 10, *, timeout: float | None = None
    ) -> AppStatus | SweepStatus | None:
        """Block until the app, trial or sweep ends (or ``timeout`` seconds pass); None when
        unknown. ``wait_interval``: the longest time between two looks at a trial (TorchX's
        poll interval); an app's scheduler is told when the app ends (local_cwd: a pidfd on
        its supervisor) or polls faster, so an app's end is seen sooner."""
        return self._target(app_handle).wait(wait_interval, timeout)

    def describe(self, app_handle: str | Target) -> AppDef | None:
        """An app this runner submitted: its AppDef as submitted (its own name, as TorchX's
        Runner gives it); any other app: as the scheduler knows it (name = app id); a trial's
        AppDef; a sweep's template AppDef (``{{NAME}}`` placeholders; trial 0's when each trial
        differs). None when unknown."""
        if isinstance(app_handle, str) and app_handle in self._apps:
            return self._apps[app_handle]
        return self._target(app_handle).describe()

    def log_lines(
        self,
        app_handle: str,
        role_name: str,
        k: int = 0,
        regex: str | None = None,
        since: datetime.datetime | float | None = None,
        until: datetime.datetime | float | None = None,
        should_tail: bool = False,
        streams: Stream | None = None,
    ) -> Iterable[str]:
        """Replica ``k`` of ``role_name``'s log lines (an app's or a trial's: ``SWEEP/TRIAL``);
        ``should_tail`` follows until it ends. ``since``/``until``: datetimes (TorchX) or epoch
        seconds."""
        query = LogQuery(role_name, k, regex, _epoch(since), _epoch(until), should_tail, streams)
        return self.logs(app_handle, query)

    def logs(self, handle: str | Target, query: LogQuery) -> Iterable[str]:
        """:meth:`log_lines` with the query as one value (a sweep's: UsageError, name a
        trial)."""
        return self._target(handle).logs(query)

    def roles(self, handle: str | Target) -> dict[str, int] | None:
        """The app's or trial's roles and their replica counts (``xrun log`` targets); None
        when unknown."""
        return self._target(handle).roles()

    def cancel(self, app_handle: str | Target, *, missing_ok: bool = True) -> None:
        """Stop the app, the trial, or every trial of the sweep (they end CANCELLED). An
        unknown handle does nothing, as in TorchX; ``missing_ok=False`` raises
        AppNotFoundError instead (``xrun cancel``: exit 1)."""
        self._target(app_handle).cancel(missing_ok)

    def stop(self, app_handle: str) -> None:
        """:meth:`cancel` (TorchX's older name; it warns as TorchX's does)."""
        warnings.warn(
            "Runner.stop is Runner.cancel's older name: call cancel",
            PendingDeprecationWarning,
            stacklevel=2,
        )
        self.cancel(app_handle)

    def stacks(self, handle: str | Target, timeout: float = 10.0) -> AppStacks:
        """Every rank's Python stack (all threads) of a running app (or trial), read by each
        node's agent (py-spy); ``xrun stacks`` prints them grouped. A sweep's: UsageError."""
        from xrun.schedulers.stacks import check_timeout  # benchmark 5: no dry run

        check_timeout(timeout)  # before the handle is looked at, as `xrun stacks` does
        return self._target(handle).stacks(timeout)

    def list(self, scheduler: str) -> list[ListAppResponse]:
        """The apps ``scheduler`` knows in this session."""
        return self.scheduler(scheduler).list()

    # ------------------------------------------------------------------ sweeps
    def sweep_backend(self, scheduler: str, session: str | None = None) -> SweepBackend:
        """How ``scheduler`` runs sweeps (see :func:`xrun.sweeps.handles.backend_for`)."""
        return backend_for(self.scheduler(scheduler, session))

    def sweep_plan(self, component: str, args: Sequence[str], sweep: Sweep) -> SweepPlan:
        """The trials of ``component`` called with ``args`` (``{{name}}`` placeholders)."""
        from xrun.sweeps.plan import plan_from_args  # benchmark 5: an app's dry run skips it

        comp = get_component(component)
        defaults = self._component_config(comp)
        return plan_from_args(lambda a: call_component(comp, a, defaults), args, sweep)

    def run_sweep(
        self,
        app: AppDef | SweepPlan,
        sweep: Sweep | None,
        scheduler: str,
        cfg: Mapping[str, object] | None = None,
        workspace: Workspace | str | None = None,
    ) -> str:
        """Submit a sweep; returns its handle at once. ``app``: an AppDef whose strings hold
        ``{{name}}`` placeholders, each trial of ``sweep`` filling in its values (or a plan
        from :meth:`sweep_plan`, ``sweep`` None)."""
        from xrun.sweeps.plan import SweepPlan, plan_from_app  # benchmark 5: see sweep_plan

        if isinstance(app, SweepPlan):
            plan = app
        elif sweep is None:
            raise UsageError("run_sweep: give the Sweep (the trials) for this AppDef")
        else:
            plan = plan_from_app(app, sweep)
        backend = self.sweep_backend(scheduler)
        ws = backend.sched.open_workspace(workspace)  # once, for every trial
        plan = self.with_sweep_job_env(plan, scheduler)
        sweep_id = backend.submit(plan, self.run_cfg(scheduler, cfg), ws)
        return make_app_handle(scheduler, self.session_name, sweep_id)

    def with_sweep_job_env(self, plan: SweepPlan, scheduler: str) -> SweepPlan:
        """``plan`` with every trial's roles told their job, as :meth:`with_job_env` does for
        an app (each trial is a job of its own, a child run of the sweep: the backend adds the
        sweep's handle as ``TORCHX_PARENT_RUN_ID`` once it has one)."""
        template = self.with_job_env(plan.template, scheduler) if plan.template else None
        apps = [self.with_job_env(a, scheduler) for a in plan.apps] if plan.apps else plan.apps
        return dataclasses.replace(plan, template=template, apps=apps)

    def run_sweep_component(
        self,
        component: str,
        args: Sequence[str],
        sweep: Sweep,
        scheduler: str,
        cfg: Mapping[str, object] | None = None,
        workspace: Workspace | str | None = None,
    ) -> str:
        return self.run_sweep(
            self.sweep_plan(component, args, sweep), None, scheduler, cfg, workspace
        )

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        for sched in self._schedulers.values():
            sched.close()
        self._schedulers.clear()

    def __enter__(self) -> Runner:
        return self

    def __exit__(
        self,
        type: type[BaseException] | None,  # noqa: A002 - TorchX's parameter names
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> Literal[False]:
        self.close()
        return False


def _epoch(t: datetime.datetime | float | None) -> float | None:
    # a datetime by its method, not isinstance: benchmark 5 (a dry run loads no datetime)
    return t if t is None or isinstance(t, int | float) else t.timestamp()


def get_runner(
    name: str | None = None,
    component_defaults: Mapping[str, Mapping[str, str]] | None = None,
    *,
    config: Config | None = None,
    **scheduler_params: Any,
) -> Runner:
    """A :class:`Runner` on every scheduler xrun has (use it as a context manager to close
    them). ``name``: the session (None: the CLI's, ``default``); ``scheduler_params``: keyword
    arguments for every scheduler's factory."""
    return Runner(
        name or DEFAULT_SESSION, None, component_defaults, scheduler_params, config=config
    )
