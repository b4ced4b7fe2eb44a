"""``xrun cancel HANDLE``: stop an app, one trial of a sweep, or every trial; they end
CANCELLED."""

from __future__ import annotations

import argparse
import sys

from xrun.cli.cmd_status import HANDLE_HELP
from xrun.runner import Runner


def add_arguments(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    c = sub.add_parser(
        "cancel", help="stop an app (it ends CANCELLED); a sweep: every trial, or HANDLE/TRIAL"
    )
    c.add_argument("handle", metavar="HANDLE", help=HANDLE_HELP)


def main(ns: argparse.Namespace) -> int:
    with Runner() as runner:
        target = runner.target(ns.handle)
        runner.cancel(ns.handle, missing_ok=False)
    if target.kind == "sweep":
        what = f"every trial of {target}"
    elif target.kind == "trial":
        what = f"trial {target.trial} of {target.handle}"
    else:
        what = str(target)
    print(f"xrun: cancelled {what}", file=sys.stderr)
    return 0
