"""``xrun configure``: write ``./.xrunconfig`` listing every scheduler's run options."""

from __future__ import annotations

import argparse
import os
import sys
import textwrap

from xrun.config import CLI_RUN, FILENAME
from xrun.errors import UsageError
from xrun.schedulers.api import get_scheduler, scheduler_names
from xrun.schedulers.options import CfgVal, runopts, type_name


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


def _shown(value: CfgVal) -> str:
    """A run option's default as written in the file (lists with ';', dicts as K:V;K2:V2)."""
    if value is None:
        return ""
    if isinstance(value, list):
        return ";".join(value)
    if isinstance(value, dict):
        return ";".join(f"{k}:{v}" for k, v in value.items())
    return str(value)


def render_template(schedulers: list[tuple[str, runopts]]) -> str:
    """The ``.xrunconfig`` that ``xrun configure`` writes: per scheduler, every run option with
    its help and default, commented out (uncomment a line to set it)."""
    out = [
        "# .xrunconfig (written by `xrun configure`): every run option with its default,",
        "# commented out. Uncomment a line and change its value to make it your default; the",
        "# command line (-cfg k=v) still wins. Lists use ';' (a;b), dicts K:V;K2:V2.",
        "",
        f"[{CLI_RUN}]",
        "# the scheduler of `xrun run` without -s",
        "# scheduler = local_cwd",
        "# the component of `xrun run` without one, e.g. dist.ddp",
        "# component =",
    ]
    for name, opts in schedulers:
        out += ["", f"[{name}]"]
        for o in opts:
            tname = type_name(o.type_)
            also = f"; also spelled {', '.join(o.aliases)}" if o.aliases else ""
            need = "REQUIRED, " if o.required else ""
            out += textwrap.wrap(
                f"{o.help} ({need}{tname}{also})",
                width=96,
                initial_indent="# ",
                subsequent_indent="#   ",
            )
            out.append(f"# {o.name} = {_shown(o.default)}".rstrip())
    return "\n".join(out) + "\n"
