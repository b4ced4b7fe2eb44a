"""A ``data.Clock`` whose timers fire when a test says so: the key space and the handlers
without an event loop."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class ManualTimer:
    def __init__(self, delay: float, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.delay = delay
        self.fn: Callable[..., Any] | None = fn
        self.args = args

    def cancel(self) -> None:
        self.fn = None


class ManualClock:
    """Timers that fire when the test says so."""

    def __init__(self) -> None:
        self.timers: list[ManualTimer] = []

    def call_later(self, delay: float, fn: Callable[..., Any], *args: Any) -> ManualTimer:
        t = ManualTimer(delay, fn, args)
        self.timers.append(t)
        return t

    def fire_all(self) -> None:
        for t in list(self.timers):
            if t.fn is not None:
                fn, t.fn = t.fn, None
                fn(*t.args)
