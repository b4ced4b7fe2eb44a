"""What the command modules share: progress lines, the not-found error, one-line messages."""

from __future__ import annotations

import sys

from xrun.errors import AppNotFoundError

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
