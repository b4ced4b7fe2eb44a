"""``xrun run``: build the AppDef, then dry-run it or submit it (and wait, streaming logs).

stdout carries exactly one thing: the app handle, printed as soon as the app is submitted (or
the dry-run text with ``--dryrun``), so ``h=$(xrun run ...)`` works while progress and logs go
to stderr. On local_cwd, ``run`` always waits and streams (the job lives on this machine).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from xrun.errors import UsageError
from xrun.specs import AppDef, AppState

if TYPE_CHECKING:
    from xrun.cli import RunOptions
    from xrun.runner import Runner

DEFAULT_SCHEDULER = "local_cwd"
# Schedulers whose jobs run on this machine: `run` waits and streams their logs by default.
_WAITING_SCHEDULERS = {"local_cwd"}
_CFG_FORM = "-cfg key=value,key2=value2 (a list value uses ';': -cfg mounts=a;b)"
# Starts the scheduler-request part of --dryrun's output (everything above it is the YAML).
REQUEST_MARKER = "# ----"
# After the app ends, how long its log readers may take to drain.
_LOG_DRAIN_S = 30.0


def parse_cfg(texts: list[str]) -> dict[str, str]:
    """``-cfg`` strings -> raw run options. An item without ``=`` continues the previous value."""
    out: dict[str, str] = {}
    for text in texts:
        last: str | None = None
        for item in text.split(","):
            key, sep, value = item.partition("=")
            if not item.strip():
                continue
            if sep and key.strip():
                last = key.strip()
                out[last] = value.strip()
            elif last is not None:
                out[last] += "," + item
            else:
                raise UsageError(f"-cfg {text!r}: {item!r} is not KEY=VALUE; expected {_CFG_FORM}")
    return out


def _is_spec_file(component: str) -> bool:
    return component.endswith((".yaml", ".yml"))


def load_app(runner: Runner, component: str, comp_args: list[str]) -> AppDef:
    """The AppDef from a saved YAML spec or from calling the component with its arguments."""
    if _is_spec_file(component):
        from xrun.specs import appdef_from_yaml

        if comp_args:
            raise UsageError(
                f"{component} is a saved AppDef and takes no arguments (got {comp_args[0]!r}); "
                "edit the file instead"
            )
        try:
            with open(component, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise UsageError(f"cannot read spec {component!r}: {e.strerror}") from None
        return appdef_from_yaml(text, source=component)
    return runner.component_app(component, comp_args)


def cmd_run(ns: RunOptions, component: str, comp_args: list[str]) -> int:
    from xrun.component import HelpRequested, format_help, get_component
    from xrun.runner import Runner

    cfg = parse_cfg(ns.cfg)
    with Runner() as runner:
        try:
            app = load_app(runner, component, comp_args)
        except HelpRequested:
            print(format_help(get_component(component)), end="")
            return 0
        scheduler = ns.scheduler or runner.config.default_scheduler() or DEFAULT_SCHEDULER
        if ns.dryrun:
            info = runner.dryrun(app, scheduler, cfg)
            _print_dryrun(app, scheduler, str(info))
            return 0
        handle = runner.run(app, scheduler, cfg, workspace=ns.workspace)
        print(handle, flush=True)
        _progress(f"submitted {handle}")
        stream = ns.log or scheduler in _WAITING_SCHEDULERS
        if not (stream or ns.wait):
            return 0
        try:
            state = _watch(runner, handle, app, stream)
        except KeyboardInterrupt:
            _progress(f"interrupted: cancelling {handle}")
            runner.cancel(handle)
            return 130
        _progress(f"{handle} ended {state.name if state else 'UNKNOWN'}")
        return 0 if state == AppState.SUCCEEDED else 1


def _print_dryrun(app: AppDef, scheduler: str, request: str) -> None:
    from xrun.cli_yaml import dump
    from xrun.specs import appdef_to_dict

    out = sys.stdout
    out.write(
        f"# AppDef: save the YAML part as FILE.yaml and run it with: "
        f"xrun run -s {scheduler} FILE.yaml\n"
    )
    out.write(dump(appdef_to_dict(app)))
    out.write(f"{REQUEST_MARKER} {scheduler} request ----\n")
    out.write(request if request.endswith("\n") else request + "\n")
    out.flush()


def _progress(msg: str) -> None:
    print(f"xrun: {msg}", file=sys.stderr, flush=True)


def _watch(runner: Runner, handle: str, app: AppDef, stream: bool) -> AppState | None:
    """Wait for the app; with ``stream``, print every replica's log lines to stderr meanwhile."""
    from xrun.cli_logs import LogPrinter

    printer: LogPrinter | None = None
    if stream:
        targets = [(r.name, k) for r in app.roles for k in range(r.num_replicas)]
        printer = LogPrinter(
            runner, handle, targets, out=sys.stderr, follow=True, always_prefix=True
        )
        printer.start()
    status = runner.wait(handle)
    if printer is not None:
        # The tails end when the app does; the bound only guards against a scheduler whose
        # log_iter keeps waiting after the end (the job's result must still be reported).
        printer.join(timeout=_LOG_DRAIN_S)
    return None if status is None else status.state
