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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from xrun.config import Config
from xrun.config import load as load_config
from xrun.errors import UsageError
from xrun.specs import AppDef, AppHandle, AppStatus, macros, make_app_handle

if TYPE_CHECKING:
    from xrun.schedulers.api import AppDryRunInfo, ListAppResponse, Scheduler, Stream
    from xrun.schedulers.sweeps import SweepBackend
    from xrun.sweep import Sweep, SweepPlan
    from xrun.sweep_status import SweepStatus


class Runner:
    """Submits AppDefs (or components) to schedulers and answers about the apps by handle."""

    def __init__(
        self,
        session_name: str = "default",
        config: Config | None = None,
        scheduler_params: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        """``config``: None reads ``.xrunconfig`` from the cwd and home on first use;
        ``scheduler_params``: extra keyword arguments per scheduler's ``create_scheduler``."""
        self.session_name = session_name
        self._config = config
        self._params = {k: dict(v) for k, v in (scheduler_params or {}).items()}
        self._schedulers: dict[tuple[str, str], Scheduler[Any]] = {}

    # ------------------------------------------------------------------ plumbing
    @property
    def config(self) -> Config:
        if self._config is None:
            self._config = load_config()
        return self._config

    def scheduler(self, name: str, session: str | None = None) -> Scheduler[Any]:
        """The (cached) scheduler ``name`` for ``session`` (default: this runner's)."""
        from xrun.schedulers.api import get_scheduler

        key = (name, session or self.session_name)
        if key not in self._schedulers:
            self._schedulers[key] = get_scheduler(name, key[1], **self._params.get(name, {}))
        return self._schedulers[key]

    def _for_handle(self, handle: str) -> tuple[Scheduler[Any], str]:
        h = AppHandle.parse(handle)
        return self.scheduler(h.scheduler, h.session), h.app_id

    def run_cfg(self, scheduler: str, cfg: Mapping[str, object] | None) -> dict[str, object]:
        """The config files' run options for ``scheduler`` under the explicit ``cfg``."""
        from xrun.config import resolve_run_options

        sched = self.scheduler(scheduler)
        defaults = self.config.scheduler_defaults(scheduler)
        opts = sched.run_opts()
        merged: dict[str, object] = dict(resolve_run_options(opts, defaults, scheduler))
        merged.update(opts.canonical(cfg or {}, scheduler))  # mail-user and mail_user: one key
        return merged

    # ------------------------------------------------------------------ submitting
    def component_app(self, component: str, args: Sequence[str]) -> AppDef:
        """Call a component with CLI-style ``args`` (its config-file defaults applied)."""
        from xrun.component import call_component, get_component

        comp = get_component(component)
        return call_component(comp, args, self.config.component_defaults(comp.name))

    def with_job_env(self, app: AppDef, scheduler: str, parent_run_id: str | None = None) -> AppDef:
        """A copy of ``app`` whose roles' env tells the replicas their job (``TORCHX_JOB_ID``,
        the tracking variables: see :mod:`xrun.tracking`); ``app`` itself is untouched, so the
        YAML ``--dryrun`` prints runs again on any scheduler."""
        import copy

        from xrun.tracking import job_env, run_id

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
        parent_run_id: str | None = None,
    ) -> AppDryRunInfo[Any]:
        """The scheduler's request for ``app``, not executed (print it to see what would run)."""
        job = self.with_job_env(app, scheduler, parent_run_id)
        return self.scheduler(scheduler).submit_dryrun(job, self.run_cfg(scheduler, cfg))

    def dryrun_component(
        self,
        component: str,
        args: Sequence[str],
        scheduler: str,
        cfg: Mapping[str, object] | None = None,
    ) -> AppDryRunInfo[Any]:
        return self.dryrun(self.component_app(component, args), scheduler, cfg)

    def schedule(self, dryrun_info: AppDryRunInfo[Any]) -> str:
        """Execute a request from :meth:`dryrun`; returns the app handle."""
        if not dryrun_info.scheduler:
            raise UsageError("this AppDryRunInfo has no scheduler; get it from Runner.dryrun")
        app_id = self.scheduler(dryrun_info.scheduler).schedule(dryrun_info)
        return make_app_handle(dryrun_info.scheduler, self.session_name, app_id)

    def run(
        self,
        app: AppDef,
        scheduler: str,
        cfg: Mapping[str, object] | None = None,
        workspace: str | None = None,
        parent_run_id: str | None = None,
    ) -> str:
        """Submit ``app``; returns its handle ``scheduler://session/app_id`` at once."""
        sched = self.scheduler(scheduler)
        job = self.with_job_env(app, scheduler, parent_run_id)
        app_id = sched.submit(job, self.run_cfg(scheduler, cfg), workspace=workspace)
        return make_app_handle(scheduler, self.session_name, app_id)

    def run_component(
        self,
        component: str,
        args: Sequence[str],
        scheduler: str,
        cfg: Mapping[str, object] | None = None,
        workspace: str | None = None,
    ) -> str:
        return self.run(self.component_app(component, args), scheduler, cfg, workspace)

    # ------------------------------------------------------------------ watching
    def status(self, handle: str) -> AppStatus | None:
        """The app's status, or None when its scheduler does not know it."""
        sched, app_id = self._for_handle(handle)
        return _to_status(sched.describe(app_id))

    def wait(self, handle: str, timeout: float | None = None) -> AppStatus | None:
        """Block until the app ends (or ``timeout`` seconds pass); None when unknown."""
        sched, app_id = self._for_handle(handle)
        return _to_status(sched.wait(app_id, timeout))

    def describe(self, handle: str) -> AppDef | None:
        """The app as the scheduler knows it (name = app id), or None when unknown."""
        sched, app_id = self._for_handle(handle)
        resp = sched.describe(app_id)
        return None if resp is None else AppDef(name=app_id, roles=list(resp.roles))

    def log_lines(
        self,
        handle: str,
        role: str,
        k: int = 0,
        regex: str | None = None,
        since: float | None = None,
        until: float | None = None,
        should_tail: bool = False,
        streams: Stream | None = None,
    ) -> Iterable[str]:
        """Replica ``k`` of ``role``'s log lines; ``should_tail`` follows until the app ends."""
        sched, app_id = self._for_handle(handle)
        return sched.log_iter(app_id, role, k, regex, since, until, should_tail, streams)

    def cancel(self, handle: str) -> None:
        """Stop the app (it ends CANCELLED); AppNotFoundError when unknown."""
        sched, app_id = self._for_handle(handle)
        sched.cancel(app_id)

    def list(self, scheduler: str) -> list[ListAppResponse]:
        """The apps ``scheduler`` knows in this session."""
        return self.scheduler(scheduler).list()

    # ------------------------------------------------------------------ sweeps
    def sweep_backend(self, scheduler: str, session: str | None = None) -> SweepBackend:
        """How ``scheduler`` runs sweeps: its own way (``sweep_backend()``: Slurm's one job
        array), else each trial a normal app (:class:`~xrun.schedulers.trials.TrialsBackend`)."""
        sched = self.scheduler(scheduler, session)
        own = getattr(sched, "sweep_backend", None)
        if own is not None:
            backend: SweepBackend = own()
            return backend
        from xrun.schedulers.trials import TrialsBackend

        return TrialsBackend(sched)

    def sweep_plan(self, component: str, args: Sequence[str], sweep: Sweep) -> SweepPlan:
        """The trials of ``component`` called with ``args`` (``{{name}}`` placeholders)."""
        from xrun.component import call_component, get_component
        from xrun.sweep import plan_from_args

        comp = get_component(component)
        defaults = self.config.component_defaults(comp.name)
        return plan_from_args(lambda a: call_component(comp, a, defaults), args, sweep)

    def run_sweep(
        self,
        app: AppDef | SweepPlan,
        sweep: Sweep | None,
        scheduler: str,
        cfg: Mapping[str, object] | None = None,
        workspace: str | None = None,
    ) -> str:
        """Submit a sweep; returns its handle at once. ``app``: an AppDef whose strings hold
        ``{{name}}`` placeholders, each trial of ``sweep`` filling in its values (or a plan
        from :meth:`sweep_plan`, ``sweep`` None)."""
        from xrun.sweep import SweepPlan, plan_from_app

        if isinstance(app, SweepPlan):
            plan = app
        elif sweep is None:
            raise UsageError("run_sweep: give the Sweep (the trials) for this AppDef")
        else:
            plan = plan_from_app(app, sweep)
        backend = self.sweep_backend(scheduler)
        plan = self.with_sweep_job_env(plan, scheduler)
        sweep_id = backend.submit(plan, self.run_cfg(scheduler, cfg), workspace)
        return make_app_handle(scheduler, self.session_name, sweep_id)

    def with_sweep_job_env(self, plan: SweepPlan, scheduler: str) -> SweepPlan:
        """``plan`` with every trial's roles told their job, as :meth:`with_job_env` does for
        an app (each trial is a job of its own, a child run of the sweep: the backend adds the
        sweep's handle as ``TORCHX_PARENT_RUN_ID`` once it has one)."""
        import dataclasses

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
        workspace: str | None = None,
    ) -> str:
        return self.run_sweep(
            self.sweep_plan(component, args, sweep), None, scheduler, cfg, workspace
        )

    def _sweep(self, handle: str) -> tuple[SweepBackend, str]:
        h = AppHandle.parse(handle)
        return self.sweep_backend(h.scheduler, h.session), h.app_id

    def sweep_status(self, handle: str) -> SweepStatus | None:
        """Every trial's state; None when ``handle`` is no sweep of this user's."""
        backend, sweep_id = self._sweep(handle)
        return backend.status(sweep_id)

    def wait_sweep(self, handle: str, timeout: float | None = None) -> SweepStatus | None:
        """Block until every trial has ended (or ``timeout`` seconds pass)."""
        backend, sweep_id = self._sweep(handle)
        return backend.wait(sweep_id, timeout)

    def cancel_sweep(self, handle: str, trial: int | None = None) -> None:
        """Cancel every trial, or only ``trial``; they end CANCELLED."""
        backend, sweep_id = self._sweep(handle)
        backend.cancel(sweep_id, trial)

    def sweep_log_lines(
        self,
        handle: str,
        trial: int,
        role: str,
        k: int = 0,
        regex: str | None = None,
        should_tail: bool = False,
        streams: Stream | None = None,
    ) -> Iterable[str]:
        """Replica ``k`` of ``role`` in trial ``trial``: its log lines."""
        backend, sweep_id = self._sweep(handle)
        return backend.log_iter(sweep_id, trial, role, k, regex, should_tail, streams)

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        for sched in self._schedulers.values():
            sched.close()
        self._schedulers.clear()

    def __enter__(self) -> Runner:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _to_status(resp: Any) -> AppStatus | None:
    if resp is None:
        return None
    return AppStatus(
        state=resp.state,
        num_restarts=resp.num_restarts,
        msg=resp.msg,
        structured_error_msg=resp.structured_error_msg,
        ui_url=resp.ui_url,
        roles=list(resp.roles_statuses),
    )


def get_runner(session_name: str = "default", **kwargs: Any) -> Runner:
    """A :class:`Runner` (use it as a context manager to close its schedulers)."""
    return Runner(session_name, **kwargs)
