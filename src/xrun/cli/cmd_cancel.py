"""``xrun cancel HANDLE``: stop an app, one trial of a sweep, or every trial; they end
CANCELLED.

Exit codes: 0 cancelled; 3 it had already ended (the line names its state, so a script can
tell "I stopped it" from "it was over": ``cancel`` of an ended app used to print "cancelled");
1 unknown handle, or what would not stop.
"""

from __future__ import annotations

import argparse
import sys

from xrun.cli.common import HANDLE_HELP, not_found
from xrun.runner import Runner
from xrun.specs import AppState, AppStatus
from xrun.sweeps.status import LIVE, SweepStatus

# `xrun cancel` of an app, trial or sweep that had already ended (docs/cli.md, Exit codes).
ALREADY_ENDED = 3


def add_arguments(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    c = sub.add_parser(
        "cancel", help="stop an app (it ends CANCELLED); a sweep: every trial, or HANDLE/TRIAL"
    )
    c.add_argument("handle", metavar="HANDLE", help=HANDLE_HELP)


def main(ns: argparse.Namespace) -> int:
    with Runner() as runner:
        target = runner.target(ns.handle)
        before = runner.status(target)
        if before is None:
            raise not_found(str(target))
        # UNKNOWN is not "ended": its replicas may still run (`cancel` stops them).
        if before.is_terminal() and before.state != AppState.UNKNOWN:
            print(
                f"xrun: {target} had already ended {before.state.name}; nothing to cancel",
                file=sys.stderr,
            )
            return ALREADY_ENDED
        runner.cancel(target, missing_ok=False)
        after = runner.status(target)
    if after is not None and after.is_terminal() and not _cancelled(before, after):
        # It ended by itself between the look and the cancel (a sweep: every live trial
        # did): the cancel stopped nothing, and saying "cancelled" would be the old lie.
        print(
            f"xrun: {target} ended {after.state.name} before the cancel reached it",
            file=sys.stderr,
        )
        return ALREADY_ENDED
    print(f"xrun: cancelled {target.what()}", file=sys.stderr)
    return 0


def _cancelled(before: AppStatus | SweepStatus, after: AppStatus | SweepStatus) -> bool:
    """Whether the cancel ended something: the app is CANCELLED, or (a sweep) a trial that was
    live before is CANCELLED now (the sweep's own state may be FAILED from an earlier trial)."""
    if isinstance(before, SweepStatus) and isinstance(after, SweepStatus):
        return any(
            b.state in LIVE and a.state == AppState.CANCELLED
            for b, a in zip(before.trials, after.trials, strict=False)
        )
    return after.state == AppState.CANCELLED
