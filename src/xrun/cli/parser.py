"""The ``xrun`` argument parser (argparse), built only when a command needs it: each command's
module adds its own subparser (``add_arguments``).

``xrun run`` parses its few options by hand (:func:`xrun.cli.cmd_run.parse_run_options`) and
comes here only for ``--help`` or a mistake: building these parsers costs more start-up time
than the rest of a dry run (benchmark 5).
"""

from __future__ import annotations

from xrun import __version__
from xrun.cli.common import COMMANDS, PROG, command_module
from xrun.cli.parser_base import Parser


def build_parser() -> Parser:
    p = Parser(prog=PROG, description="Launch distributed PyTorch jobs.", allow_abbrev=False)
    p.add_argument("--version", action="version", version=_version())
    # read before the command by xrun.cli._log_level; here for --help (TorchX's flag)
    p.add_argument(
        "--log_level",
        "--log-level",
        metavar="LEVEL",
        help="Python logging level of xrun and its plugins: DEBUG, INFO, WARNING, ERROR, CRITICAL",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name in COMMANDS:  # in `xrun --help`'s order
        command_module(name).add_arguments(sub)
    return p


def _version() -> str:
    return f"xrun {__version__}"
