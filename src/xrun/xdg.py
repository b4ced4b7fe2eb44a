"""Where xrun keeps per-user state: ``$XDG_STATE_HOME/xrun/...`` (``~/.local/state/xrun``).

The one helper every scheduler uses for its state dir, so ``XDG_STATE_HOME`` is read in one place.
"""

from __future__ import annotations

import os

from xrun.errors import UsageError


def state_home() -> str:
    """``$XDG_STATE_HOME``, or ``~/.local/state`` (the XDG base-directory default; a relative
    value is ignored, as the XDG spec says). One that names an existing file is a UsageError:
    no command could keep or find an app there."""
    value = os.environ.get("XDG_STATE_HOME")
    if not value or not os.path.isabs(value):
        return os.path.join(os.path.expanduser("~"), ".local", "state")
    if os.path.exists(value) and not os.path.isdir(value):
        raise UsageError(
            f"XDG_STATE_HOME={value!r} is not a directory; point it at a directory (xrun keeps "
            "its state in $XDG_STATE_HOME/xrun) or unset it"
        )
    return value


def state_dir(*parts: str) -> str:
    """``<state_home>/xrun/<parts...>`` (not created)."""
    return os.path.join(state_home(), "xrun", *parts)


def check_writable_dir(path: str, what: str) -> None:
    """UsageError unless ``path`` is a directory xrun could create files in, or could be
    created: its nearest existing ancestor must be a writable directory. Only looks (a dry
    run has no side effects); creating it may still fail (``/proc``), which the caller reports.
    """
    probe = os.path.abspath(path)
    while not os.path.lexists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    fix = f"give a writable directory ({what})"
    if not os.path.isdir(probe):
        where = "is" if probe == os.path.abspath(path) else f"is under {probe!r}, which is"
        raise UsageError(f"{path!r} {where} not a directory; {fix}")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UsageError(f"{path!r}: {probe!r} is not writable; {fix}")
