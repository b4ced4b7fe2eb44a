"""The signals the agent handles (``--signals-to-handle``): noted by a handler, seen through a
wakeup fd by the agent's select loop, or raised where the agent blocks outside that loop.

Standard library only (on the agent's start-up path).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType

__all__ = ["AgentSignal", "SignalWatch"]


class AgentSignal(BaseException):
    """Raised by the signal handler only while the agent blocks outside its select loop."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class SignalWatch:
    """Handles ``signals`` between ``install()`` and the undo function it returns.

    ``signum`` is the first signal that arrived (0: none). While ``raising`` is set the handler
    raises ``AgentSignal`` at once (the agent is blocked in a rendezvous call); otherwise the
    agent's select loop wakes up on ``fd`` and reads ``signum``.
    """

    def __init__(self, signals: Iterable[signal.Signals]) -> None:
        self._signals = tuple(signals)
        self.signum = 0
        self.raising = False
        self.fd = -1  # the wakeup pipe's read end while installed
        self._pid = os.getpid()  # the agent's (install() sets it again)

    def install(self) -> Callable[[], None]:
        """Handle the signals (main thread only: elsewhere nothing is handled); returns the
        undo function."""
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        self._pid = os.getpid()
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        old_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        old = {s: signal.signal(s, self._on_signal) for s in self._signals}
        self.fd = r

        def restore() -> None:
            for s, h in old.items():
                signal.signal(s, h)
            signal.set_wakeup_fd(old_fd)
            os.close(r)
            os.close(w)
            self.fd = -1

        return restore

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._pid:
            # A child forked while the agent starts workers, before its exec (the handler is
            # inherited, and so is a signal the agent got just before the fork): not the
            # agent. Die of it, as a process without this handler would.
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.signum = self.signum or signum
        if self.raising:
            raise AgentSignal(signum)

    def check(self) -> None:
        """Raise ``AgentSignal`` for a signal that arrived while nothing raised it."""
        if self.signum:
            raise AgentSignal(self.signum)

    def drain(self) -> None:
        """Empty the wakeup pipe (its bytes only say that a signal arrived)."""
        try:
            while os.read(self.fd, 512):
                pass
        except BlockingIOError:
            pass
