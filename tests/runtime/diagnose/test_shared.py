"""The stall watchdog's progress exchange with the other nodes (runtime/diagnose/shared.py): a
store that does not answer (its host node paused, a busy store) never holds up the agent's watch
loop, which must see a worker exit or a pre-emption's SIGTERM meanwhile, and is never taken for
a stall; once the store answers again, a real stall is still declared.

A real idle worker (``sleep``) and the watchdog's own ``Diagnostics``; the store is a fake whose
calls block like a paused host's, until released or its read timeout (no real store can be
paused on demand without pausing the test's own process)."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest

from xrun.runtime.diagnose.watch import Diagnostics
from xrun.runtime.events import Stalled
from xrun.runtime.rendezvous.api import Members, RendezvousInfo, RendezvousTimeoutError

STALL_S = 1.0  # checks every 0.25 s; the view of the others is stale after 2 s
STORE_TIMEOUT_S = 30.0  # the paused store's answer never comes before the test releases it


class _Group:
    """What the watchdog reads of a worker group (PContext's attributes): one worker."""

    def __init__(self, pid: int, stdout: str) -> None:
        self.nprocs, self._pid = 1, pid
        self.stdouts, self.stderrs, self.error_files = {0: stdout}, {}, {}
        self.before_stop = None

    def pids(self) -> dict[int, int]:
        return {0: self._pid}


class _PausedStore:
    """The agent's keys (KeyValue) in a store whose host is paused until ``released``."""

    def __init__(self) -> None:
        self.released = threading.Event()
        self.counter = 0
        self.adds = 0

    def add(self, key: str, delta: int) -> int:
        self.adds += 1
        if not self.released.wait(STORE_TIMEOUT_S):
            raise RendezvousTimeoutError("the store did not answer")
        self.counter += delta  # no other node adds: none of their progress
        return self.counter

    def set(self, key: str, value: bytes) -> None:
        self.released.wait(STORE_TIMEOUT_S)

    def get(self, key: str, timeout: float) -> bytes:
        raise RendezvousTimeoutError(f"key {key!r} was not set within {timeout:g}s")


@pytest.mark.timeout(120)
def test_a_paused_store_holds_up_no_check_and_makes_no_stall(tmp_path: Path) -> None:
    out = tmp_path / "stdout"
    out.write_text("")
    worker = subprocess.Popen(["sleep", "300"])
    store = _PausedStore()
    diag = Diagnostics(STALL_S, shutdown_timeout=10, host="node0")
    close = diag.install()
    try:
        info = RendezvousInfo(0, 0, 2, 0, 2, Members(lambda: ((1, 1), ("a", "b"))))
        diag.attach(_Group(worker.pid, str(out)), info, "", lambda: store)  # type: ignore[arg-type]
        out.write_text("ready\n")  # the worker's sign of life; then it sleeps: no work here
        slowest, end = 0.0, time.monotonic() + 8 * STALL_S
        while time.monotonic() < end:
            t0 = time.monotonic()
            verdict = diag.check()
            slowest = max(slowest, time.monotonic() - t0)
            assert verdict is None, verdict.reason
            time.sleep(diag.timeout(None) or 0.1)  # the agent's select timeout
        assert store.adds >= 1  # the exchange was tried, and is still hung
        # a check is a few stat and /proc reads: never the store's 30 s
        assert slowest < 2.0, f"a check took {slowest:.1f} s: the store call blocked it"

        # The store answers again: no node made progress since the sign of life, a stall.
        store.released.set()
        verdict, end = None, time.monotonic() + 30
        while verdict is None and time.monotonic() < end:
            verdict = diag.check()
            time.sleep(diag.timeout(None) or 0.1)
        assert isinstance(verdict, Stalled), "the answering store's empty news hid a stall"
        assert verdict.reason.startswith(f"stalled {STALL_S:g} s"), verdict.reason
    finally:
        store.released.set()
        close()
        worker.kill()
        worker.wait()
