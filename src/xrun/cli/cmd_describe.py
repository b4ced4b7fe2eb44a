"""``xrun describe HANDLE``: the roles as YAML (a sweep's: the template AppDef every trial
fills in; a trial's: its own AppDef), then the status as comments."""

from __future__ import annotations

import argparse
import sys

from xrun.cli.common import HANDLE_HELP, not_found
from xrun.runner import Runner
from xrun.specs import appdef_to_yaml


def add_arguments(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    c = sub.add_parser(
        "describe", help="show an app's roles (YAML) and status (a sweep's: its template)"
    )
    c.add_argument("handle", metavar="HANDLE", help=HANDLE_HELP)


def main(ns: argparse.Namespace) -> int:
    with Runner() as runner:
        target = runner.target(ns.handle)
        app = runner.describe(target)
        status = runner.status(target)
        if app is None or status is None:
            raise not_found(str(target))
        sys.stdout.write(appdef_to_yaml(app))
        print("# status")
        for line in status.format().splitlines():
            print(f"# {line}")
    return 0
