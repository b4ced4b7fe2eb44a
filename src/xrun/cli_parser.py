"""The ``xrun`` argument parsers (argparse), built only when a command needs them.

``xrun run`` parses its few options by hand (:func:`xrun.cli_run.parse_run_options`) and comes
here only for ``--help`` or a mistake, because building these parsers costs more start-up time
than the rest of a dry run; ``cli_run`` owns those options (:func:`~xrun.cli_run.add_run_arguments`).
"""

from __future__ import annotations

import argparse
from typing import NoReturn

from xrun.cli_run import add_run_arguments
from xrun.errors import UsageError

PROG = "xrun"


class Parser(argparse.ArgumentParser):
    """argparse whose mistakes are UsageErrors: one line on stderr, exit 2."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def build_parser() -> Parser:
    p = Parser(prog=PROG, description="Launch distributed PyTorch jobs.", allow_abbrev=False)
    p.add_argument("--version", action="version", version=_version())
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)

    run = sub.add_parser(
        "run",
        help="run a component or a saved AppDef YAML",
        allow_abbrev=False,
        usage="xrun run [-s SCHEDULER] [-cfg K=V,...] [--dryrun] [--wait] [--log] "
        "[--workspace DIR] [--parent_run_id ID] [COMPONENT|SPEC.yaml] [component args ...]",
        description="COMPONENT is a builtin (dist.ddp; see `xrun builtins`), FILE.py:FUNCTION "
        "(TorchX component files too) or a plugin; its own options follow it (`xrun run "
        "dist.ddp --help`). Without one, [cli:run] component in .xrunconfig is run.",
    )
    add_run_arguments(run)

    b = sub.add_parser("builtins", help="list the builtin and plugin components")
    b.add_argument(
        "--print",
        dest="print_name",
        metavar="NAME",
        help="print a component's source, as a template for your own",
    )

    for name, helptext in (
        ("status", "show an app's status (a sweep's: a table of its trials)"),
        ("cancel", "stop an app (it ends CANCELLED); a sweep: every trial, or HANDLE/TRIAL"),
        ("describe", "show an app's roles (YAML) and status"),
    ):
        c = sub.add_parser(name, help=helptext)
        c.add_argument(
            "handle", metavar="HANDLE", help="SCHEDULER://SESSION/APP_ID (a sweep's: [/TRIAL])"
        )
        if name == "status":  # a sweep's trials, by what they tracked (docs/tracking.md)
            c.add_argument("--sort", metavar="KEY", help="a sweep: order trials by this metric")
            c.add_argument("--desc", action="store_true", help="with --sort: largest first")

    lg = sub.add_parser("log", help="print an app's logs")
    lg.add_argument(
        "target",
        metavar="HANDLE[/ROLE[/REPLICA[,REPLICA...]]]",
        help="a sweep's trial: HANDLE/TRIAL[/ROLE[/REPLICA[,REPLICA...]]]",
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

    ls = sub.add_parser("list", help="list the apps a scheduler knows")
    ls.add_argument("-s", "--scheduler", help="default local_cwd")

    ro = sub.add_parser("runopts", help="show the run options of the schedulers")
    ro.add_argument("scheduler", nargs="?", help="only this scheduler")

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
    from xrun.cli_tracker import add_tracker_arguments

    add_tracker_arguments(
        sub.add_parser("tracker", help="query experiment tracking: list jobs, metadata, artifacts"),
        Parser,
    )
    return p


def _version() -> str:
    from xrun import __version__

    return f"xrun {__version__}"
