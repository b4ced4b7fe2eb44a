"""``xrun configure``: write ``./.xrunconfig`` listing every scheduler's run options."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import textwrap

from xrun.config import CLI_RUN, FILENAME, current_dir
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
    names = _scheduler_names(ns.schedulers)
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
    target = os.path.join(current_dir(), FILENAME)
    _write(target, text, ns.force)
    print(f"xrun: wrote {target}", file=sys.stderr)
    return 0


def _scheduler_names(value: str | None) -> list[str]:
    """``-s S1,S2`` as a list; [] without -s. An -s that names nothing ('' or ',') is a
    mistake (a script's empty variable), not "all of them"."""
    if value is None:
        return []
    names = [n.strip() for n in value.split(",") if n.strip()]
    if not names:
        raise UsageError(
            f"-s {value!r} names no scheduler; expected S1,S2 (e.g. local_cwd,slurm), or leave "
            "-s out for all"
        )
    return names


def _write(target: str, text: str, force: bool) -> None:
    """Write ``target`` whole or not at all (an existing file is never half-written), leaving
    no temporary file behind; every failure is a UsageError naming the file and the cause."""
    # lexists: a dangling symlink is something the user made, kept unless --force.
    if os.path.lexists(target) and not force:
        raise UsageError(
            f"{target} exists already; pass --force to replace it, or --print to see the template"
        )
    if os.path.isdir(target):  # os.replace would fail; --force never deletes a directory
        raise UsageError(f"{target} is a directory; move it away, or use --print")
    tmp = f"{target}.tmp.{os.getpid()}"
    try:
        with open(tmp, "x", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, target)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise UsageError(f"cannot write {target}: {e.strerror or e}") from None


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
