"""Exceptions shared by the CLI, the runner and the schedulers.

The CLI maps them to exit codes: ``UsageError`` -> 2 (one line, no traceback),
``AppNotFoundError`` -> 1.
"""

from __future__ import annotations


class XrunError(Exception):
    """Base class for every error xrun raises on purpose."""


class UsageError(XrunError, ValueError):
    """The user's input is wrong: name the bad value, the expected form and the fix."""


class AppNotFoundError(XrunError, LookupError):
    """An app handle or id that the scheduler does not know."""


class SchedulerError(XrunError, RuntimeError):
    """The scheduler's backend refused or failed (the message carries its own words)."""


def printable(msg: object, width: int = 120) -> str:
    """An error message as the CLI prints it: any single word longer than ``width`` (a bad
    value of 6,000 digits, quoted back to the user) is cut to its ends and its length, so the
    error stays one readable line whatever the input was."""
    words = str(msg).split(" ")
    for i, w in enumerate(words):
        if len(w) > width:
            words[i] = f"{w[: width // 2]}...{w[-10:]} ({len(w):,} characters)"
    return " ".join(words)
