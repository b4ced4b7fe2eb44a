"""``xrun run``: build the AppDef, then dry-run or submit it (and wait, streaming logs).

stdout carries exactly one thing: the app handle, printed as soon as the app is submitted (or
the dry-run text with ``--dryrun``), so ``h=$(xrun run ...)`` works while progress and logs go
to stderr. On local_cwd, ``run`` always waits and streams (the job lives on this machine).
Options: :mod:`xrun.cli.run_args`; a run with ``--sweep`` goes on in :mod:`xrun.cli.run_sweep`.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from xrun.cli.common import progress
from xrun.cli.run_args import (
    DEFAULT_SCHEDULER,
    REQUEST_MARKER,
    RunOptions,
    add_run_options,
    is_spec_file,
    is_sweep,
    load_app,
    parse_cfg,
    resolve_component,
    workspace_arg,
)
from xrun.component import HelpRequested, format_help, get_component
from xrun.runner import Runner
from xrun.specs import AppDef, AppState, AppStatus, appdef_to_yaml

if TYPE_CHECKING:
    import argparse  # importing it costs start-up time; only --help and mistakes need it

# Schedulers whose jobs run on this machine: `run` waits and streams their logs by default.
_WAITING_SCHEDULERS = {"local_cwd"}
# TorchX's name for "what started this app" (its CLI's run sets it to cli_run).
CONTEXT_ENV = "TORCHX_CONTEXT_NAME"
# After the app ends, how long its log readers may take to drain.
_LOG_DRAIN_S = 30.0


def main(opts: RunOptions, component: str | None, comp_args: list[str]) -> int:
    """``xrun run``, its own options parsed (:mod:`xrun.cli.run_args`): the exit code."""
    # As TorchX's `run` does: the schedulers that pass the CLI's environment on (local_cwd,
    # slurm) hand it to the workers, so code that asks where it was started from works alike.
    os.environ.setdefault(CONTEXT_ENV, "cli_run")
    if is_sweep(opts):
        from xrun.cli import run_sweep  # benchmark 5: a plain dry run skips the sweep CLI

        return run_sweep.cmd_run_sweep(opts, component, comp_args)
    return cmd_run(opts, component, comp_args)


def add_arguments(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``run``'s options for argparse (``xrun run --help`` and the messages for mistakes)."""
    run = sub.add_parser(
        "run",
        help="run a component or a saved AppDef YAML",
        allow_abbrev=False,
        usage="xrun run [-s SCHEDULER] [-cfg K=V,...] [--dryrun] [--wait] [--log] "
        "[--workspace DIR] [--parent_run_id ID] [COMPONENT|SPEC.yaml] [component args ...]",
        description="COMPONENT is a builtin (dist.ddp; see `xrun builtins`), FILE.py:FUNCTION "
        "(TorchX component files too) or a plugin; its own options follow it (`xrun run "
        "dist.ddp --help`). Without one, [cli:run] component in .xrunconfig is run.",
    )
    add_run_options(run)


def cmd_run(ns: RunOptions, component: str | None, comp_args: list[str]) -> int:
    cfg = parse_cfg(ns.cfg)
    if "{{" in "".join(comp_args):
        # benchmark 5: only a command line with a placeholder loads the sweep plan
        from xrun.sweeps.plan import reject_placeholders

        reject_placeholders(comp_args, "component argument")
    with Runner() as runner:
        component = resolve_component(runner, component, comp_args)
        try:
            app = load_app(runner, component, comp_args)
        except HelpRequested:
            print(format_help(get_component(component)), end="")
            return 0
        if is_spec_file(component):
            from xrun.sweeps.plan import reject_app_placeholders  # benchmark 5: as above

            reject_app_placeholders(app, component)
        scheduler = ns.scheduler or runner.config.default_scheduler() or DEFAULT_SCHEDULER
        workspace = workspace_arg(runner, scheduler, ns.workspace)
        if ns.dryrun:
            info = runner.dryrun(
                app, scheduler, cfg, workspace=workspace, parent_run_id=ns.parent_run_id
            )
            _print_dryrun(app, scheduler, str(info))
            return 0
        handle = runner.run(
            app, scheduler, cfg, workspace=workspace, parent_run_id=ns.parent_run_id
        )
        print(handle, flush=True)
        progress(f"submitted {handle}")
        stream = ns.log or scheduler in _WAITING_SCHEDULERS
        if not (stream or ns.wait):
            return 0
        try:
            status = _watch(runner, handle, app, stream)
        except KeyboardInterrupt:
            progress(f"interrupted: cancelling {handle}")
            runner.cancel(handle)
            return 130
        state = status.state if status is not None else None
        # the root cause on the last line, where the terminal shows it (issue #24)
        lines = status.structured_error_msg.splitlines() if status is not None else []
        why = lines[0][:300] if lines else ""
        end = f": {why}" if why and state == AppState.FAILED else ""
        progress(f"{handle} ended {state.name if state else 'UNKNOWN'}{end}")
        return 0 if state == AppState.SUCCEEDED else 1


def _print_dryrun(app: AppDef, scheduler: str, request: str) -> None:
    out = sys.stdout
    out.write(
        f"# AppDef: save the YAML part as FILE.yaml and run it with: "
        f"xrun run -s {scheduler} FILE.yaml\n"
    )
    out.write(appdef_to_yaml(app))
    out.write(f"{REQUEST_MARKER} {scheduler} request ----\n")
    out.write(request if request.endswith("\n") else request + "\n")
    out.flush()


def _watch(runner: Runner, handle: str, app: AppDef, stream: bool) -> AppStatus | None:
    """Wait for the app; with ``stream``, print every replica's log lines to stderr meanwhile."""

    from xrun.cli.logprint import LogPrinter, app_targets  # benchmark 5: a dry run prints none

    printer: LogPrinter | None = None
    if stream:
        targets = app_targets(handle, {r.name: r.num_replicas for r in app.roles})
        printer = LogPrinter(runner, targets, out=sys.stderr, follow=True, always_prefix=True)
        printer.start()
    status = runner.wait(handle)
    if printer is not None:
        # The tails end when the app does; the bound only guards against a scheduler whose
        # log_iter keeps waiting after the end (the job's result must still be reported).
        printer.join(timeout=_LOG_DRAIN_S)
    return status if isinstance(status, AppStatus) else None
