"""``xrun log HANDLE[/ROLE[/REPLICA,...]]``: an app's (or a trial's, ``SWEEP/TRIAL/...``)
replicas' lines, each prefixed ``role/replica``; a sweep's: every trial's, prefixed
``TRIAL/role/replica``. ``-f`` follows until the app (every trial) ends."""

from __future__ import annotations

import argparse
import sys

from xrun.cli.common import not_found, progress
from xrun.cli.logprint import LogPrinter, LogTarget, app_targets, log_targets
from xrun.errors import UsageError
from xrun.runner import Runner
from xrun.schedulers.api import Stream
from xrun.sweeps.handles import Target
from xrun.sweeps.status import LIVE

_FORM = (
    "HANDLE[/ROLE[/REPLICA[,REPLICA...]]] (a trial: SWEEP_HANDLE/TRIAL[/ROLE[/REPLICA,...]]), "
    "e.g. local_cwd://default/app-1/trainer/0,1"
)


def add_arguments(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    lg = sub.add_parser("log", help="print an app's logs (a sweep's: every trial's)")
    lg.add_argument(
        "target",
        metavar="HANDLE[/ROLE[/REPLICA[,REPLICA...]]]",
        help="an app, a sweep (every trial), or a trial: SWEEP_HANDLE/TRIAL[/ROLE[/REPLICA...]]",
    )
    lg.add_argument(
        "-f",
        "--follow",
        "-t",
        "--tail",
        dest="follow",
        action="store_true",
        help="follow until the app ends (-t/--tail: TorchX's spelling)",
    )
    lg.add_argument("--regex", help="only lines matching this regular expression")
    lg.add_argument(
        "--streams",
        choices=("stdout", "stderr", "combined"),
        help="which stream (default: the scheduler's combined log)",
    )


def main(ns: argparse.Namespace) -> int:
    with Runner() as runner:
        target = runner.target(ns.target, max_rest=2)
        if target.kind == "sweep":
            targets = _sweep_targets(runner, target, ns.follow)
        else:
            targets = _targets(runner, target, ns.target, ns.follow)
        printer = LogPrinter(
            runner,
            targets,
            out=sys.stdout,
            follow=ns.follow,
            regex=ns.regex,
            streams=Stream(ns.streams) if ns.streams else None,
            always_prefix=target.kind == "sweep",
        )
        printer.run()
    return 0


def _targets(runner: Runner, target: Target, text: str, follow: bool) -> list[LogTarget]:
    """An app's or a trial's replicas, as ``ROLE`` and ``REPLICA,...`` narrow them."""
    handle = str(target)
    role = target.rest[0] if target.rest and target.rest[0] else None
    replicas = _replica_ids(text, target.rest[1]) if len(target.rest) > 1 else None
    roles = runner.roles(target)
    if roles is None:
        raise not_found(handle)
    what = f"trial {handle}" if target.kind == "trial" else f"app {handle}"
    if target.kind == "trial" and not follow:
        _say_if_not_run(runner, target)
    pairs = log_targets(what, roles, role, replicas)
    return [LogTarget(handle, r, k, f"{r}/{k}") for r, k in pairs]


def _sweep_targets(runner: Runner, target: Target, follow: bool) -> list[LogTarget]:
    """Every replica of every trial (trials that never ran have no lines; ``-f`` waits for
    them), labelled ``TRIAL/role/replica``."""
    backend = runner.sweep_backend(target.handle.scheduler, target.handle.session)
    sweep_id = target.handle.app_id
    st = backend.status(sweep_id)
    if st is None:
        raise not_found(str(target))
    out: list[LogTarget] = []
    for i in range(len(st.trials)):
        roles = backend.roles(sweep_id, i)
        out += app_targets(f"{target.handle}/{i}", roles, prefix=f"{i}/")
    if not follow:
        waiting = [t for t in st.trials if t.started is None]
        if waiting:
            progress(f"{len(waiting)} trial(s) of {target} have not run; -f waits for them")
    return out


def _say_if_not_run(runner: Runner, target: Target) -> None:
    backend = runner.sweep_backend(target.handle.scheduler, target.handle.session)
    assert target.trial is not None  # a trial's target
    t = backend.trial(target.handle.app_id, target.trial)
    if t is not None and t.started is None:
        how = "; -f waits for it" if t.state in LIVE else ""
        progress(f"trial {target.trial} of {target.handle} has not run ({t.state.name}){how}")


def _replica_ids(target: str, text: str) -> list[int]:
    try:
        ids = [int(x) for x in text.split(",")]
    except ValueError:
        raise UsageError(
            f"log target {target!r}: replicas {text!r} must be numbers like 0 or 0,2; "
            f"expected {_FORM}"
        ) from None
    if any(r < 0 for r in ids):
        raise UsageError(f"log target {target!r}: replica ids must be >= 0")
    return ids
