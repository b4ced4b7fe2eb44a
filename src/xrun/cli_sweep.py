"""The CLI's sweep parts: ``xrun run --sweep``, and status/log/cancel/describe/list of a sweep.

``xrun run`` hands a run with ``--sweep``/``--sweep-file``/``--max-parallel`` to
:func:`cmd_run_sweep`. The other commands ask :func:`find_sweep` first (one ``stat`` in the
sweep store): a sweep's handle is ``SCHEDULER://SESSION/ID``, a trial ``HANDLE/TRIAL``, a
replica of a trial ``HANDLE/TRIAL/ROLE/REPLICA``.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from xrun import sweep_store
from xrun.errors import AppNotFoundError, UsageError
from xrun.specs import AppHandle, AppState

if TYPE_CHECKING:
    from xrun.cli_run import RunOptions
    from xrun.runner import Runner
    from xrun.schedulers.api import ListAppResponse, Stream
    from xrun.schedulers.sweeps import SweepBackend
    from xrun.sweep import SweepPlan
    from xrun.sweep_status import SweepStatus

TRIAL_FORM = "SCHEDULER://SESSION/SWEEP_ID/TRIAL[/ROLE[/REPLICA[,REPLICA...]]]"


def _progress(msg: str) -> None:
    print(f"xrun: {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- run
def cmd_run_sweep(ns: RunOptions, component: str | None, comp_args: list[str]) -> int:
    from xrun.cli_run import DEFAULT_SCHEDULER, load_app, parse_cfg, resolve_component
    from xrun.component import HelpRequested, format_help, get_component
    from xrun.runner import Runner
    from xrun.sweep import plan_from_app, sweep_from_cli

    sweep = sweep_from_cli(ns.sweep, ns.sweep_file, ns.max_parallel)
    if ns.log:
        raise UsageError(
            "--log streams one app's replicas; a sweep has many trials: follow one with "
            "xrun log -f HANDLE/TRIAL (--wait shows the sweep's progress)"
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
        if ns.dryrun:
            request = backend.dryrun(plan, runner.run_cfg(scheduler, cfg))
            print_dryrun(plan, scheduler, backend, request)
            return 0
        handle = runner.run_sweep(plan, None, scheduler, cfg, workspace=ns.workspace)
        print(handle, flush=True)
        k, why = backend.parallel(plan)
        _progress(f"submitted sweep {handle}: {len(plan)} trial(s), {_parallel(k, why)}")
        if not ns.wait:
            return 0
        try:
            st = backend.wait(AppHandle.parse(handle).app_id, on_change=_Progress())
        except KeyboardInterrupt:
            _progress(f"interrupted: cancelling every trial of {handle}")
            runner.cancel_sweep(handle)
            return 130
        if st is None:
            raise AppNotFoundError(f"sweep {handle} vanished while it ran")
        _progress(f"sweep {handle} ended {st.state.name}: {st.summary()}")
        return 0 if st.state == AppState.SUCCEEDED else 1


def _parallel(k: int | None, why: str) -> str:
    from xrun.schedulers.sweeps import describe_parallel

    return describe_parallel(k, why)


class _Progress:
    """``--wait``'s progress line, when the counts change (at most one a second until the end:
    a 1,000-trial sweep must not print 2,000 lines)."""

    def __init__(self, every_s: float = 1.0) -> None:
        self.every_s = every_s
        self.last = 0.0

    def __call__(self, st: SweepStatus) -> None:
        import time

        now = time.monotonic()
        if now - self.last < self.every_s and not st.is_terminal():
            return
        self.last = now
        counts = st.counts()
        done = sum(n for s, n in counts.items() if s not in _LIVE_STATES)
        failed = counts.get(AppState.FAILED, 0)
        running = counts.get(AppState.RUNNING, 0)
        waiting = sum(counts.get(s, 0) for s in (AppState.PENDING, AppState.SUBMITTED))
        _progress(
            f"sweep {st.handle}: {done}/{len(st.trials)} done ({failed} failed), "
            f"{running} running, {waiting} pending"
        )


_LIVE_STATES = (AppState.UNSUBMITTED, AppState.SUBMITTED, AppState.PENDING, AppState.RUNNING)


def print_dryrun(plan: SweepPlan, scheduler: str, backend: SweepBackend, request: str) -> None:
    """The trial table, the AppDef every trial runs (YAML), then the scheduler's request."""
    from xrun.cli_run import REQUEST_MARKER
    from xrun.specs import appdef_to_yaml

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


# --------------------------------------------------------------------------- finding a sweep
def find_sweep(target: str) -> tuple[str, list[str]] | None:
    """(the sweep's handle, the rest of the path) when ``target`` starts with a sweep's
    handle (``SCHEDULER://SESSION/ID[/...]``); None otherwise."""
    scheme, sep, rest = target.strip().partition("://")
    parts = rest.split("/")
    if not sep or len(parts) < 2 or sweep_store.find(scheme, parts[1]) is None:
        return None
    handle = str(AppHandle.parse(f"{scheme}://{parts[0]}/{parts[1]}"))
    return handle, parts[2:]


def _trial(handle: str, text: str) -> int:
    if not text.isdigit():
        raise UsageError(f"{handle}/{text}: trial {text!r} is not a number; expected {TRIAL_FORM}")
    return int(text)


def _status(runner: Runner, handle: str) -> SweepStatus:
    st = runner.sweep_status(handle)
    if st is None:
        raise AppNotFoundError(f"sweep {handle} not found")
    return st


def cmd_status(ns: argparse.Namespace, handle: str, rest: list[str]) -> int:
    from xrun.runner import Runner

    if len(rest) > 1:
        raise UsageError(f"{ns.handle!r}: expected the sweep's handle or HANDLE/TRIAL")
    with Runner() as runner:
        st = _status(runner, handle)
        _add_metrics(st, ns)
        if rest:
            i = _trial(handle, rest[0])
            if not 0 <= i < len(st.trials):
                raise UsageError(f"sweep {handle} has trials 0..{len(st.trials) - 1}; no trial {i}")
            st.trials = [st.trials[i]]
        print(f"Handle: {handle}")
        print(st.format())
    return 0


def _add_metrics(st: SweepStatus, ns: argparse.Namespace) -> None:
    """The trials' tracked numeric metadata as columns, sorted by ``--sort KEY`` (#25)."""
    from xrun.tracker.sweep_metrics import sort_trials, trial_metrics

    st.metrics = trial_metrics(st.handle, st.trials)
    if getattr(ns, "sort", None):
        st.trials = sort_trials(st.trials, st.metrics, st.params, ns.sort, ns.desc)


def cmd_cancel(ns: argparse.Namespace, handle: str, rest: list[str]) -> int:
    from xrun.runner import Runner

    if len(rest) > 1:
        raise UsageError(f"{ns.handle!r}: expected the sweep's handle or HANDLE/TRIAL")
    trial = _trial(handle, rest[0]) if rest else None
    with Runner() as runner:
        runner.cancel_sweep(handle, trial)
    what = f"trial {trial} of {handle}" if trial is not None else f"every trial of {handle}"
    print(f"xrun: cancelled {what}", file=sys.stderr)
    return 0


def cmd_describe(ns: argparse.Namespace, handle: str, rest: list[str]) -> int:
    from xrun.runner import Runner
    from xrun.specs import appdef_to_yaml

    with Runner() as runner:
        st = _status(runner, handle)
        h = AppHandle.parse(handle)
        plan = runner.sweep_backend(h.scheduler, h.session).plan(h.app_id)
        app = plan.template if plan.template is not None else plan.app(0)
        sys.stdout.write(appdef_to_yaml(app))
        print("# status")
        for line in st.format().splitlines():
            print(f"# {line}")
    return 0


class _TrialLogs:
    """What :class:`~xrun.cli_logs.LogPrinter` needs of a runner, for one trial's replicas."""

    def __init__(self, runner: Runner, handle: str, trial: int) -> None:
        self.runner, self.handle, self.trial = runner, handle, trial

    def log_lines(
        self,
        handle: str,
        role: str,
        k: int = 0,
        regex: str | None = None,
        should_tail: bool = False,
        streams: Stream | None = None,
        **_: Any,
    ) -> Any:
        return self.runner.sweep_log_lines(
            self.handle, self.trial, role, k, regex, should_tail, streams
        )


def cmd_log(ns: argparse.Namespace, handle: str, rest: list[str]) -> int:
    from xrun.cli_logs import LogPrinter, log_targets
    from xrun.runner import Runner
    from xrun.schedulers.api import Stream

    if not rest or not rest[0] or len(rest) > 3:
        raise UsageError(
            f"{ns.target!r}: a sweep's logs are per trial; expected {TRIAL_FORM} "
            "(`xrun status HANDLE` lists the trials)"
        )
    trial = _trial(handle, rest[0])
    role = rest[1] if len(rest) > 1 and rest[1] else None
    replicas = _replica_ids(ns.target, rest[2]) if len(rest) > 2 else None
    with Runner() as runner:
        h = AppHandle.parse(handle)
        backend = runner.sweep_backend(h.scheduler, h.session)
        roles = backend.roles(h.app_id, trial)
        targets = log_targets(f"{handle}/{trial}", roles, role, replicas)
        st = backend.status(h.app_id)
        t = st.trials[trial] if st is not None else None
        if t is not None and t.started is None and not ns.follow:
            how = "; -f waits for it" if t.state in _LIVE_STATES else ""
            _progress(f"trial {trial} of {handle} has not run ({t.state.name}){how}")
        printer = LogPrinter(
            _TrialLogs(runner, handle, trial),  # type: ignore[arg-type]
            handle,
            targets,
            out=sys.stdout,
            follow=ns.follow,
            regex=ns.regex,
            streams=Stream(ns.streams) if ns.streams else None,
        )
        printer.run()
    return 0


def _replica_ids(target: str, text: str) -> list[int]:
    try:
        ids = [int(x) for x in text.split(",")]
    except ValueError:
        raise UsageError(
            f"log target {target!r}: replicas {text!r} must be numbers like 0 or 0,2; "
            f"expected {TRIAL_FORM}"
        ) from None
    if any(r < 0 for r in ids):
        raise UsageError(f"log target {target!r}: replica ids must be >= 0")
    return ids


# --------------------------------------------------------------------------- list
def list_sweeps(runner: Runner, scheduler: str) -> tuple[list[str], set[str]]:
    """(one line per sweep: handle, state, counts by state, name; the ids of the apps or jobs
    that are its trials, which ``list`` leaves out)."""
    lines: list[str] = []
    owned: set[str] = set()
    for st in runner.sweep_backend(scheduler).list():
        sweep_id = AppHandle.parse(st.handle).app_id
        owned.add(sweep_id)
        owned.update(t.app_id for t in st.trials if t.app_id)
        counts = ",".join(f"{s.name}={n}" for s, n in st.counts().items())
        lines.append(f"{st.handle}\t{st.state.name}\t{st.name} (sweep: {counts})")
    return lines, owned


def is_trial(app: ListAppResponse, owned: set[str]) -> bool:
    """An app (or Slurm array task, ``ID_INDEX``) that is a trial of a listed sweep."""
    return app.app_id in owned or app.app_id.split("_", 1)[0] in owned
