"""The ``xrun`` argument parser (argparse), built only when a command needs it: each command's
module adds its own subparser (``add_arguments``).

``xrun run`` parses its few options by hand (:func:`xrun.cli.cmd_run.parse_run_options`) and
comes here only for ``--help`` or a mistake: building these parsers costs more start-up time
than the rest of a dry run (benchmark 5).
"""

from __future__ import annotations

from xrun import __version__
from xrun.cli import (
    cmd_builtins,
    cmd_cancel,
    cmd_configure,
    cmd_describe,
    cmd_list,
    cmd_log,
    cmd_run,
    cmd_runopts,
    cmd_stacks,
    cmd_status,
    cmd_tracker,
)
from xrun.cli.common import PROG
from xrun.cli.parser_base import Parser

# In `xrun --help`'s order.
_MODULES = (
    cmd_run,
    cmd_builtins,
    cmd_status,
    cmd_cancel,
    cmd_describe,
    cmd_log,
    cmd_stacks,
    cmd_list,
    cmd_runopts,
    cmd_configure,
    cmd_tracker,
)


def build_parser() -> Parser:
    p = Parser(prog=PROG, description="Launch distributed PyTorch jobs.", allow_abbrev=False)
    p.add_argument("--version", action="version", version=_version())
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for module in _MODULES:
        module.add_arguments(sub)
    return p


def _version() -> str:
    return f"xrun {__version__}"
