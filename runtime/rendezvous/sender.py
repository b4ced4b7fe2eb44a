"""The thread that sends an agent's side-feature news to the job's store off the agent's watch
loop: the module lists for the job's spares (spares.py, "Warm modules": c10d's
``spares.Publisher``, numbered store slots, and etcd's ``etcd_spares.ModulesPublisher``, one
union key) and the stall watchdog's shared progress counter (``diagnose/shared.py``).

A side feature must never hold up the agent: calling a sender never blocks;
one daemon thread, started on the first news (most jobs never publish), sends what is pending,
one send in flight at a time. A failed send is best effort (the rendezvous calls see a lost
store or etcd themselves): it is kept for another try ``RETRY_S`` later, up to ``RETRIES`` times
in a row, then dropped until the next news. ``close`` stops the thread (bounded join; a daemon
never holds up the exit).
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from typing import Generic, TypeVar

__all__ = ["RETRIES", "RETRY_S", "Closed", "Sender"]

RETRY_S, RETRIES = 1.0, 5  # a send the store did not take: again after, at most

N = TypeVar("N")  # the news a call brings
T = TypeVar("T")  # what one send sends


class Closed(Exception):
    """Raised by ``_send`` when it finds the sender closed meanwhile: the thread ends."""


class Sender(ABC, Generic[N, T]):
    """Subclasses hold what is pending and say how it goes out; ``_add``, ``_take`` and
    ``_keep`` run under ``self._cond`` (its lock), ``_send`` and ``_drop_link`` in the
    thread without it. ``ERRORS``: what a failed send raises; ``THREAD``: the thread's name."""

    ERRORS: tuple[type[BaseException], ...] = (OSError,)
    THREAD = "xrun-spare-modules"

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._stopped = False
        self._thread: threading.Thread | None = None

    def __call__(self, news: N) -> None:
        with self._cond:
            if self._stopped:
                return
            self._add(news)
            self._cond.notify()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.THREAD, daemon=True)
                self._thread.start()

    @abstractmethod
    def _add(self, news: N) -> None:
        """New news (a list from the pool, a check's progress)."""

    @abstractmethod
    def _take(self) -> T | None:
        """What to send now, no longer pending (None: nothing pending)."""

    @abstractmethod
    def _send(self, item: T) -> None:
        """Send it (may block on a hung store until ``close`` wakes it)."""

    @abstractmethod
    def _keep(self, item: T) -> None:
        """A send failed: make ``item`` pending again, unless something newer holds it."""

    def _drop_link(self) -> None:  # noqa: B027 - nothing to drop unless overridden
        """A send failed: let go of the connection it used (the next send opens another)."""

    def _wake(self) -> None:  # noqa: B027 - nothing to wake unless overridden
        """``close``: wake a send blocked on a hung store."""

    def _run(self) -> None:
        failures = 0
        while True:
            with self._cond:
                item = self._take()
                while item is None and not self._stopped:
                    self._cond.wait()
                    item = self._take()
                if self._stopped or item is None:
                    return
            try:
                self._send(item)
                failures = 0
            except Closed:
                return
            except self.ERRORS:
                self._drop_link()
                failures += 1
                with self._cond:
                    if failures > RETRIES:
                        failures = 0  # given up on this one: the next news starts afresh
                        continue
                    self._keep(item)
                    self._cond.wait(RETRY_S)  # close() wakes it

    def close(self, timeout: float = 1.0) -> None:
        """Stop the thread: wake a send blocked on the store, and wait for it up to
        ``timeout`` s (a connect in progress may outlast it; the thread closes what it
        opened)."""
        with self._cond:
            self._stopped = True
            self._cond.notify()
            thread = self._thread
        self._wake()
        if thread is not None:
            thread.join(timeout)
