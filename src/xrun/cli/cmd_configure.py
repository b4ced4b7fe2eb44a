"""``xrun configure``: write ``./.xrunconfig`` listing every scheduler's run options."""

from __future__ import annotations

import argparse
import os
import sys

from xrun.config import FILENAME, render_template
from xrun.errors import UsageError
from xrun.schedulers.api import get_scheduler, scheduler_names


def add_arguments(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cf = sub.add_parser(
        "configure",
        help="write a .xrunconfig listing every scheduler's run options (commented out)",
        description="Writes ./.xrunconfig: a section per scheduler with each run option, its "
        "help and its default, commented out; uncomment what you want to change. An existing "
        "file is left alone unless --force.",
    )
    cf.add_argument(
        "-s",
        "--schedulers",
        metavar="S1,S2",
        help="only these schedulers (comma-separated); default: all",
    )
    cf.add_argument("--print", action="store_true", help="print it to stdout instead")
    cf.add_argument("--force", action="store_true", help="replace an existing .xrunconfig")


def main(ns: argparse.Namespace) -> int:
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
