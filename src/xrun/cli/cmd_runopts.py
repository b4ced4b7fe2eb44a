"""``xrun runopts [SCHEDULER]``: each scheduler's typed run options."""

from __future__ import annotations

import argparse

from xrun.errors import UsageError
from xrun.schedulers.api import get_scheduler, scheduler_names


def add_arguments(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ro = sub.add_parser("runopts", help="show the run options of the schedulers")
    ro.add_argument("scheduler", nargs="?", help="only this scheduler")


def main(ns: argparse.Namespace) -> int:
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
