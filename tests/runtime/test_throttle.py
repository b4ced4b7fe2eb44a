"""Issue #31 P7 and M6: log lines that others can cause are rate-limited (runtime/throttle.py):
the store guard's refusals (another local user's connections, a real store and a real client
under setpriv) and the file timer's malformed requests (a real FIFO and server)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from xrun.runtime.store import guard
from xrun.runtime.store import torch_protocol as tp
from xrun.runtime.store.server import StoreServer
from xrun.runtime.throttle import Throttle
from xrun.runtime.timer import server as timer

SUMMARY = "store: refused {n} more torch clients (other users or hosts) in the last {s} s"
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def test_the_first_lines_then_one_count_per_period() -> None:
    t = Throttle("held {n} in {s} s", first=3, period=60.0)
    said = [t.line(f"e{i}", now=float(i)) for i in range(10)]  # 10 events in 10 s
    assert said[:2] == ["e0", "e1"] and said[2] is not None and said[2].startswith("e2 (")
    assert said[3:] == [None] * 7
    assert t.line("e10", now=62.5) == "held 8 in 60 s"  # e3..e10, since e2's line at t=2
    assert t.line("e11", now=63.0) is None
    assert t.flush(now=70.0) == "held 1 in 8 s" and t.flush(now=71.0) is None


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Iterator[StoreServer]:
    # a fresh count (raising=False: the test runs, and fails, on code without the throttle)
    monkeypatch.setattr(guard, "REFUSALS", Throttle(SUMMARY), raising=False)
    s = StoreServer("127.0.0.1", 0)
    yield s
    s.stop()


def test_another_users_connection_flood_writes_a_bounded_log(
    store: StoreServer, caplog: pytest.LogCaptureFixture
) -> None:
    """200 torch-protocol connections from `nobody`: 5 lines, then the count when the store
    stops (was: 200 lines, one per connection, ~7 KB/s from any local account)."""
    n = 200
    code = (
        "import socket, sys\n"
        f"for _ in range({n}):\n"
        f"    s = socket.create_connection(('127.0.0.1', {store.port}))\n"
        f"    s.sendall({tp.HANDSHAKE_PREFIX!r})\n"
        "    s.settimeout(30)\n"
        "    while s.recv(4096): pass\n"  # refused: closed by the store
        "    s.close()\n"
        "print('done')\n"
    )
    with caplog.at_level(logging.WARNING, logger="xrun.runtime.store.guard"):
        r = subprocess.run(
            [*NOBODY, sys.executable, "-c", code], capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 0 and "done" in r.stdout, r.stderr[-2000:]
        store.stop()
    lines = [m for m in caplog.messages if m.startswith("store: refused")]
    assert len(lines) == 6, lines
    assert all("another user's (uid 65534" in m for m in lines[:5])
    assert "any more are counted" in lines[4]
    assert lines[5].startswith(f"store: refused {n - 5} more torch clients"), lines[5]


def test_malformed_timer_requests_write_a_bounded_log(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker writing 300 malformed requests: 5 lines (was: 300)."""
    monkeypatch.setattr(timer, "_MALFORMED", Throttle("ignored {n} more"), raising=False)
    server = timer.FileTimerServer(str(tmp_path / "fifo"))
    try:
        with open(server.path, "w") as f:
            for i in range(300):
                f.write(f"not json {i}\n")
                f.flush()
        ok = {"version": 1, "pid": os.getpid(), "scope_id": "s", "expiration_time": -1}
        with open(server.path, "w") as f:
            f.write(json.dumps(ok) + "\n")
        deadline = time.monotonic() + 60
        while server.requests < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.requests == 1
    finally:
        server.stop()
    said = [ln for ln in capfd.readouterr().err.splitlines() if "malformed request" in ln]
    assert len(said) == 5, said[:10]
    assert "not json 0" in said[0] and "any more are counted" in said[4]
