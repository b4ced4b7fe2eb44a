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
