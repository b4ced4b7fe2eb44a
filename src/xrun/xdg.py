"""Where xrun keeps per-user state: ``$XDG_STATE_HOME/xrun/...`` (``~/.local/state/xrun``).

The one helper every scheduler uses for its state dir, so ``XDG_STATE_HOME`` is read in one place.
"""

from __future__ import annotations

import os


def state_home() -> str:
    """``$XDG_STATE_HOME``, or ``~/.local/state`` (the XDG base-directory default)."""
    return os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )


def state_dir(*parts: str) -> str:
    """``<state_home>/xrun/<parts...>`` (not created)."""
    return os.path.join(state_home(), "xrun", *parts)
