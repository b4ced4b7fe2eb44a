"""``xrun log HANDLE[/ROLE[/REPLICA,...]]``: an app's (or a trial's, ``SWEEP/TRIAL/...``)
replicas' lines, each prefixed ``role/replica``; a sweep's: every trial's, prefixed
``TRIAL/role/replica``. ``-f`` follows until the app (every trial) ends."""

from __future__ import annotations

import argparse
import sys

from xrun.cli.common import not_found, progress
from xrun.cli.logprint import LogPrinter, LogTarget, log_targets
from xrun.errors import UsageError
from xrun.runner import Runner
from xrun.schedulers.api import Stream

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
        role = target.rest[0] if target.rest and target.rest[0] else None
        replicas = _replica_ids(ns.target, target.rest[1]) if len(target.rest) > 1 else None
        found = target.log_parts(ns.follow)  # an app or a trial: itself; a sweep: every trial
        if found is None:
            raise not_found(str(target))
        parts, notes = found
        for note in notes:
            progress(note)
        targets = [
            LogTarget(handle, r, k, f"{prefix}{r}/{k}")
            for handle, what, roles, prefix in parts
            for r, k in log_targets(what, roles, role, replicas)
        ]
        printer = LogPrinter(
            runner,
            targets,
            out=sys.stdout,
            follow=ns.follow,
            regex=ns.regex,
            streams=Stream(ns.streams) if ns.streams else None,
            always_prefix=any(prefix for _, _, _, prefix in parts),  # a sweep's name the trial
        )
        printer.run()
    return 0


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
