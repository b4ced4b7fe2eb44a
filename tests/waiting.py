"""Polling for a condition in tests: the one loop every test module uses."""

from __future__ import annotations

import time
from collections.abc import Callable


def poll_until(cond: Callable[[], object], timeout: float, interval: float = 0.01) -> bool:
    """Poll ``cond`` until it holds or ``timeout`` s pass; whether it held (checked once more
    at the deadline, so a slow last poll still counts)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(interval)
    return bool(cond())
