"""``xrun run --sweep``: a grid of trials under one handle (``xrun run`` hands over a run with
``--sweep``/``--sweep-file``/``--max-parallel``). Every other command takes the sweep's handle,
or a trial's ``HANDLE/TRIAL``, like an app's (:mod:`xrun.sweeps.handles`).
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

from xrun.cli.common import progress
from xrun.cli.run_args import (
    DEFAULT_SCHEDULER,
    REQUEST_MARKER,
    RunOptions,
    load_app,
    parse_cfg,
    resolve_component,
    workspace_arg,
)
from xrun.component import HelpRequested, format_help, get_component
from xrun.errors import AppNotFoundError, UsageError
from xrun.runner import Runner
from xrun.specs import AppHandle, AppState, appdef_to_yaml
from xrun.sweeps.backend import describe_parallel
from xrun.sweeps.plan import plan_from_app, sweep_from_cli
from xrun.sweeps.status import LIVE

if TYPE_CHECKING:
    from xrun.sweeps.backend import SweepBackend
    from xrun.sweeps.plan import SweepPlan
    from xrun.sweeps.status import SweepStatus


def cmd_run_sweep(ns: RunOptions, component: str | None, comp_args: list[str]) -> int:
    sweep = sweep_from_cli(ns.sweep, ns.sweep_file, ns.max_parallel)
    if ns.log:
        raise UsageError(
            "--log streams one app's replicas; a sweep has many trials: follow them all with "
            "xrun log -f HANDLE, one with xrun log -f HANDLE/TRIAL (--wait shows the sweep's "
            "progress)"
        )
    cfg = parse_cfg(ns.cfg)
    with Runner() as runner:
        component = resolve_component(runner, component, comp_args)
        try:
            if component.endswith((".yaml", ".yml")):
                plan = plan_from_app(load_app(runner, component, comp_args), sweep)
            else:
                plan = runner.sweep_plan(component, comp_args, sweep)
        except HelpRequested:
            print(format_help(get_component(component)), end="")
            return 0
        scheduler = ns.scheduler or runner.config.default_scheduler() or DEFAULT_SCHEDULER
        backend = runner.sweep_backend(scheduler)
        workspace = workspace_arg(runner, scheduler, ns.workspace)
        if ns.dryrun:
            ws = backend.sched.open_workspace(workspace)  # as Runner.run_sweep opens it
            request = backend.dryrun(plan, runner.run_cfg(scheduler, cfg), ws)
            print_dryrun(plan, scheduler, backend, request)
            return 0
        handle = runner.run_sweep(plan, None, scheduler, cfg, workspace=workspace)
        print(handle, flush=True)
        k, why = backend.parallel(plan)
        progress(f"submitted sweep {handle}: {len(plan)} trial(s), {_parallel(k, why)}")
        if not ns.wait:
            return 0
        try:
            st = backend.wait(AppHandle.parse(handle).app_id, on_change=_Progress())
        except KeyboardInterrupt:
            progress(f"interrupted: cancelling every trial of {handle}")
            runner.cancel(handle)
            return 130
        if st is None:
            raise AppNotFoundError(f"sweep {handle} vanished while it ran")
        progress(f"sweep {handle} ended {st.state.name}: {st.summary()}")
        return 0 if st.state == AppState.SUCCEEDED else 1


def _parallel(k: int | None, why: str) -> str:
    return describe_parallel(k, why)


class _Progress:
    """``--wait``'s progress line, when the counts change (at most one a second until the end:
    a 1,000-trial sweep must not print 2,000 lines)."""

    def __init__(self, every_s: float = 1.0) -> None:
        self.every_s = every_s
        self.last = 0.0

    def __call__(self, st: SweepStatus) -> None:
        now = time.monotonic()
        if now - self.last < self.every_s and not st.is_terminal():
            return
        self.last = now
        counts = st.counts()
        done = sum(n for s, n in counts.items() if s not in LIVE)
        failed = counts.get(AppState.FAILED, 0)
        running = counts.get(AppState.RUNNING, 0)
        waiting = sum(counts.get(s, 0) for s in (AppState.PENDING, AppState.SUBMITTED))
        progress(
            f"sweep {st.handle}: {done}/{len(st.trials)} done ({failed} failed), "
            f"{running} running, {waiting} pending"
        )


def print_dryrun(plan: SweepPlan, scheduler: str, backend: SweepBackend, request: str) -> None:
    """The trial table, the AppDef every trial runs (YAML), then the scheduler's request."""
    k, why = backend.parallel(plan)
    over = ", ".join(plan.params)
    out = [f"# Sweep {plan.name!r}: {len(plan)} trial(s) over {over}; {_parallel(k, why)}."]
    widths = [max([len(c), *(len(t.get(c, "")) for t in plan.trials)]) for c in plan.params]
    idx_w = max(len("trial"), len(str(len(plan) - 1)))
    cells = ["trial".rjust(idx_w), *(c.ljust(w) for c, w in zip(plan.params, widths, strict=True))]
    out.append("# " + "  ".join(cells).rstrip())
    for i, t in enumerate(plan.trials):
        row = [
            str(i).rjust(idx_w),
            *(t.get(c, "").ljust(w) for c, w in zip(plan.params, widths, strict=True)),
        ]
        out.append("# " + "  ".join(row).rstrip())
    if plan.template is not None:
        out.append(
            "# AppDef of every trial ({{NAME}}: the trial's value; its workers also get "
            "XRUN_SWEEP_<NAME>, XRUN_TRIAL_INDEX, XRUN_SWEEP_SIZE). Save the YAML part as "
            f"FILE.yaml and run it with: xrun run -s {scheduler} --sweep ... FILE.yaml"
        )
        yaml_text = appdef_to_yaml(plan.template)
    else:
        out.append(
            f"# AppDef of trial 0 (the component is called per trial: {plan.why_no_template})"
        )
        yaml_text = appdef_to_yaml(plan.app(0))
    text = "\n".join(out) + "\n" + yaml_text + f"{REQUEST_MARKER} {scheduler} request ----\n"
    sys.stdout.write(text + (request if request.endswith("\n") else request + "\n"))
    sys.stdout.flush()
