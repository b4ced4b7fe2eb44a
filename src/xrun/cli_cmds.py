"""``xrun`` commands other than ``run``: builtins, status, log, cancel, list, describe, runopts.

Each ``cmd_<name>(ns)`` returns the exit code. An unknown handle raises AppNotFoundError (the
CLI prints it, exit 1); a malformed one is a UsageError (exit 2).
"""

from __future__ import annotations

import argparse
import sys

from xrun import cli_sweep
from xrun.errors import AppNotFoundError, UsageError
from xrun.runner import Runner
from xrun.specs import AppHandle


def cmd_builtins(ns: argparse.Namespace) -> int:
    from xrun.component import get_component, list_components

    if ns.print_name:
        import inspect

        comp = get_component(ns.print_name)
        module = inspect.getmodule(comp.fn)
        # The whole module: a component usually needs its module's imports and helpers to run.
        source = inspect.getsource(module if module is not None else comp.fn)
        package = (module.__package__ or "") if module is not None else ""
        sys.stdout.write(absolute_imports(source, package))
        return 0
    problems: list[str] = []
    comps = list_components(problems)
    for problem in problems:
        print(f"xrun: warning: {problem}", file=sys.stderr)
    width = max((len(n) for n in comps), default=0)
    print(f"Found {len(comps)} components (`xrun run NAME --help` shows one's options):")
    for name, comp in comps.items():
        print(f"  {name.ljust(width)}  {comp.summary()}")
    return 0


def absolute_imports(source: str, package: str) -> str:
    """``source`` with its relative imports made absolute (``from . import X`` in package ``p``
    -> ``from p import X``): a printed template runs from wherever the user saves it."""
    if not package:
        return source
    import re

    def absolute(m: re.Match[str]) -> str:
        dots, rest = m.group(1), m.group(2)
        base = package.rsplit(".", len(dots) - 1)[0] if len(dots) > 1 else package
        return f"from {base}{'.' + rest if rest else ''} import"

    return re.sub(r"^from (\.+)([\w.]*) import", absolute, source, flags=re.M)


def _not_found(handle: str) -> AppNotFoundError:
    return AppNotFoundError(f"app {handle} not found (finished long ago, or another session?)")


def cmd_status(ns: argparse.Namespace) -> int:
    sweep = cli_sweep.find_sweep(ns.handle)
    if sweep is not None:
        return cli_sweep.cmd_status(ns, *sweep)
    if ns.sort or ns.desc:
        raise UsageError(f"--sort/--desc order a sweep's trials; {ns.handle} is no sweep")
    with Runner() as runner:
        status = runner.status(ns.handle)
        if status is None:
            raise _not_found(ns.handle)
        print(f"Handle: {ns.handle}")
        print(status.format())
    return 0


def cmd_cancel(ns: argparse.Namespace) -> int:
    sweep = cli_sweep.find_sweep(ns.handle)
    if sweep is not None:
        return cli_sweep.cmd_cancel(ns, *sweep)
    with Runner() as runner:
        runner.cancel(ns.handle)
    print(f"xrun: cancelled {ns.handle}", file=sys.stderr)
    return 0


def cmd_describe(ns: argparse.Namespace) -> int:
    from xrun.specs import appdef_to_yaml

    sweep = cli_sweep.find_sweep(ns.handle)
    if sweep is not None:
        return cli_sweep.cmd_describe(ns, *sweep)
    with Runner() as runner:
        app = runner.describe(ns.handle)
        status = runner.status(ns.handle)
        if app is None or status is None:
            raise _not_found(ns.handle)
        sys.stdout.write(appdef_to_yaml(app))
        print("# status")
        for line in status.format().splitlines():
            print(f"# {line}")
    return 0


def cmd_list(ns: argparse.Namespace) -> int:
    from xrun.specs import make_app_handle

    with Runner() as runner:
        scheduler = ns.scheduler or runner.config.default_scheduler() or "local_cwd"
        apps = runner.list(scheduler)
        sweeps, owned = cli_sweep.list_sweeps(runner, scheduler)
        for a in apps:
            if cli_sweep.is_trial(a, owned):
                continue  # shown as part of its sweep's line
            handle = a.app_handle or make_app_handle(scheduler, runner.session_name, a.app_id)
            print(f"{handle}\t{a.state.name}\t{a.name}")
        for line in sweeps:
            print(line)
    return 0


def cmd_runopts(ns: argparse.Namespace) -> int:
    from xrun.schedulers.api import get_scheduler, scheduler_names

    names = [ns.scheduler] if ns.scheduler else scheduler_names()
    for name in names:
        try:
            opts = get_scheduler(name).run_opts()
        except UsageError as e:
            if ns.scheduler:
                raise
            # Listing all: one scheduler that cannot load (missing extra) must not hide the rest.
            print(f"{name}:\n    (unavailable: {e})")
            continue
        print(f"{name}:\n{opts}" if str(opts) else f"{name}:\n    (no run options)")
    return 0


# --------------------------------------------------------------------------- log
def parse_log_target(target: str) -> tuple[str, str | None, list[int] | None]:
    """``HANDLE[/ROLE[/REPLICA[,REPLICA...]]]`` -> (handle, role, replica ids)."""
    form = "SCHEDULER://SESSION/APP_ID[/ROLE[/REPLICA[,REPLICA...]]], e.g. local_cwd://default/app-1/trainer/0,1"
    scheme, sep, rest = target.partition("://")
    parts = rest.split("/")
    if not sep or len(parts) < 2 or len(parts) > 4:
        raise UsageError(f"log target {target!r} is malformed; expected {form}")
    handle = str(AppHandle.parse(f"{scheme}://{parts[0]}/{parts[1]}"))
    role = parts[2] if len(parts) > 2 and parts[2] else None
    replicas: list[int] | None = None
    if len(parts) == 4:
        try:
            replicas = [int(x) for x in parts[3].split(",")]
        except ValueError:
            raise UsageError(
                f"log target {target!r}: replicas {parts[3]!r} must be numbers like 0 or 0,2; "
                f"expected {form}"
            ) from None
        if any(r < 0 for r in replicas):
            raise UsageError(f"log target {target!r}: replica ids must be >= 0")
    return handle, role, replicas


def cmd_log(ns: argparse.Namespace) -> int:
    from xrun.cli_logs import LogPrinter, log_targets
    from xrun.schedulers.api import Stream

    sweep = cli_sweep.find_sweep(ns.target)
    if sweep is not None:
        return cli_sweep.cmd_log(ns, *sweep)
    handle, role, replicas = parse_log_target(ns.target)
    with Runner() as runner:
        app = runner.describe(handle)
        if app is None:
            raise _not_found(handle)
        roles = {r.name: r.num_replicas for r in app.roles}
        targets = log_targets(f"app {handle}", roles, role, replicas)
        printer = LogPrinter(
            runner,
            handle,
            targets,
            out=sys.stdout,
            follow=ns.follow,
            regex=ns.regex,
            streams=Stream(ns.streams) if ns.streams else None,
        )
        printer.run()
    return 0


# --------------------------------------------------------------------------- configure
def cmd_configure(ns: argparse.Namespace) -> int:
    from xrun.config import FILENAME, render_template
    from xrun.schedulers.api import get_scheduler, scheduler_names

    names = [n.strip() for n in ns.schedulers.split(",") if n.strip()] if ns.schedulers else []
    found = []
    for name in names or scheduler_names():
        try:
            found.append((name, get_scheduler(name).run_opts()))
        except UsageError as e:
            if names:  # asked for by name: say why not
                raise
            print(f"xrun: warning: {name} left out: {e}", file=sys.stderr)
    text = render_template(found)
    if ns.print:
        sys.stdout.write(text)
        return 0
    import os

    if os.path.exists(FILENAME) and not ns.force:
        raise UsageError(
            f"{os.path.abspath(FILENAME)} exists already; pass --force to replace it, or "
            "--print to see the template"
        )
    tmp = f"{FILENAME}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, FILENAME)  # whole or not at all: an existing file is never half-written
    print(f"xrun: wrote {os.path.abspath(FILENAME)}", file=sys.stderr)
    return 0
