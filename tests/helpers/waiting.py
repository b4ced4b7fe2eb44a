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


def wait_for(
    cond: Callable[[], object], timeout: float = 20, what: str = "", interval: float = 0.02
) -> float:
    """Poll ``cond`` until it holds and return the (monotonic) time it did; fail the test with
    ``what`` in the message after ``timeout`` s."""
    if not poll_until(cond, timeout, interval):
        raise AssertionError(f"timed out after {timeout:g} s waiting for {what or cond}")
    return time.monotonic()
