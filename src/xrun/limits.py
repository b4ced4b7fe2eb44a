"""Checks for the values a user hands xrun: bounded counts, durations, env var names.

Every check raises :class:`~xrun.errors.UsageError` (exit 2, one line) naming the value, the
expected form and the limit; the limits themselves are :mod:`xrun.contract`'s, shared with the
runtime agent. Standard library only and nothing imported beyond it: the dry run and the
agent's start-up both use it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from xrun.contract import MAX_DURATION_S
from xrun.errors import UsageError

# POSIX's portable env var name: what a shell can export and every libc accepts.
ENV_NAME_FORM = "[A-Za-z_][A-Za-z0-9_]* (e.g. MY_VAR)"
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
# Plain ASCII digits: str.isdigit() and \d accept '１' and '٣', which int() then reads.
_DIGITS_RE = re.compile(r"[0-9]+", re.ASCII)

# Input files read whole (saved AppDefs, sweep files, component files, .xrunconfig): a file
# past this is refused before it is read (a wrong path to a dataset must not fill memory).
MAX_FILE_BYTES = 16 * 1024 * 1024


def shown(value: object, width: int = 40) -> str:
    """``repr(value)``, cut to about ``width`` characters: an error message names the bad value
    without repeating a 5,000-digit number."""
    text = repr(value)
    if len(text) <= width:
        return text
    return f"{text[: width - 4]}...{text[-1]} ({len(str(value)):,} characters)"


def is_digits(text: str) -> bool:
    """Only the ASCII digits 0-9 (no sign, no spaces, no other script's digits)."""
    return _DIGITS_RE.fullmatch(text) is not None


def to_float(text: str) -> float:
    """``float(text)`` for plain ASCII text, else NaN (as for no number at all): float() reads
    other scripts' digits ('٢', '１'), which no xrun option takes (ASCII digits everywhere, as
    ``-j``). Callers refuse NaN with their own message."""
    if not text.isascii():
        return math.nan
    try:
        return float(text)
    except ValueError:
        return math.nan


def capped_int(text: str, cap: int) -> int:
    """``text`` (ASCII digits, see :func:`is_digits`) as an int, or ``cap + 1`` when it is
    larger: a number past Python's int-string limit (4,300 digits) is never converted, and the
    caller reports the limit, not a ValueError."""
    digits = text.lstrip("0") or "0"
    if len(digits) > len(str(cap)):
        return cap + 1
    return min(int(digits), cap + 1)


def check_count(value: int, what: str, limit: int, lo: int = 1) -> int:
    """``lo <= value <= limit`` or a UsageError naming ``what`` and the limit."""
    if value < lo:
        raise UsageError(f"{what} {shown(value)} is invalid: expected an integer >= {lo}")
    if value > limit:
        raise UsageError(
            f"{what} {shown(value)} is over the limit of {limit:,}; ask for at most {limit:,}"
        )
    return value


def check_duration(value: float, what: str) -> float:
    """A number of seconds from 0 to :data:`~xrun.contract.MAX_DURATION_S` (a day); NaN and
    infinities are refused too (an infinite grace period is a process nobody stops)."""
    if not (math.isfinite(value) and 0 <= value <= MAX_DURATION_S):
        raise UsageError(
            f"{what}={shown(value)} is invalid: expected a number of seconds from 0 to "
            f"{MAX_DURATION_S:g} (one day)"
        )
    return value


def is_env_name(name: str) -> bool:
    return _ENV_NAME_RE.fullmatch(name) is not None


def check_env_name(name: object, where: str) -> None:
    """UsageError unless ``name`` is a POSIX env var name: ``BAD=NAME`` or ``A B`` would reach
    ``execve`` as garbage, or fail only when the job starts."""
    if not isinstance(name, str) or not is_env_name(name):
        raise UsageError(
            f"{where}: env var name {shown(name)} is invalid; expected {ENV_NAME_FORM}"
        )


def check_env(env: Mapping[str, object], where: str) -> None:
    """UsageError unless every name is a POSIX env var name and every value a string without
    a NUL byte (``execve`` cannot carry one: caught at submit, not in the supervisor)."""
    for key, value in env.items():
        check_env_name(key, where)
        if not isinstance(value, str):
            raise UsageError(f"{where} {key}={value!r:.80} must be a string")
        check_no_nul([value], f"{where} {key}: value")


def check_no_nul(texts: list[object], what: str) -> None:
    """UsageError naming the first of ``texts`` that holds a NUL byte (no command line or
    process environment can carry one); non-strings are left to the caller's checks."""
    for text in texts:
        if isinstance(text, str) and "\0" in text:
            raise UsageError(
                f"{what} {shown(text)} holds a NUL byte (\\0), which no process can be given; "
                "remove it"
            )
