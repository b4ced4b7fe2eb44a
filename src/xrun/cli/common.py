"""What the command modules share: the table of commands, progress lines, the not-found error,
one-line messages."""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

from xrun.errors import AppNotFoundError, UsageError

PROG = "xrun"
# The HANDLE argument's help, for every command that takes one.
HANDLE_HELP = "SCHEDULER://SESSION/APP_ID, a sweep's handle, or a trial's SWEEP_HANDLE/TRIAL"


def progress(msg: str) -> None:
    """A progress line on stderr (stdout carries only what a program reads: a handle, YAML)."""
    print(f"{PROG}: {msg}", file=sys.stderr, flush=True)


def not_found(handle: str) -> AppNotFoundError:
    return AppNotFoundError(f"app {handle} not found (finished long ago, or another session?)")


def one_line(err: BaseException) -> str:
    """An error message on one line (a multi-line message is joined with '; ')."""
    return "; ".join(s.strip() for s in str(err).splitlines() if s.strip()) or type(err).__name__


# Each command's module, in `xrun --help`'s order: the one list of commands (the dispatch and
# the parser read it). A module is imported when its command runs (benchmark 5: `xrun run
# --dryrun` pays for run's imports only, not for what `xrun log` or `configure` need), or all
# of them when argparse builds the whole parser.
COMMANDS: dict[str, str] = {
    name: f"xrun.cli.cmd_{name}"
    for name in (
        "run",
        "builtins",
        "status",
        "cancel",
        "describe",
        "log",
        "stacks",
        "list",
        "runopts",
        "configure",
        "tracker",
    )
}


def command_module(name: str) -> ModuleType:
    """The module of command ``name`` (``cmd_<name>.py``), imported on first use."""
    if name not in COMMANDS:
        raise UsageError(f"unknown command {name!r}; commands: {', '.join(COMMANDS)}")
    return importlib.import_module(COMMANDS[name])
