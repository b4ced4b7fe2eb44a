"""``xrun status HANDLE``: an app's state, per-replica host, exit code and error; a sweep's
table of trials; a trial's (``SWEEP/TRIAL``) own app status."""

from __future__ import annotations

import argparse

from xrun.cli.common import not_found
from xrun.runner import Runner

HANDLE_HELP = "SCHEDULER://SESSION/APP_ID, a sweep's handle, or a trial's SWEEP_HANDLE/TRIAL"


def add_arguments(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    c = sub.add_parser("status", help="show an app's status (a sweep's: a table of its trials)")
    c.add_argument("handle", metavar="HANDLE", help=HANDLE_HELP)


def main(ns: argparse.Namespace) -> int:
    with Runner() as runner:
        target = runner.target(ns.handle)
        status = runner.status(ns.handle)
        if status is None:
            raise not_found(str(target))
        print(f"Handle: {target}")
        print(status.format())
    return 0
