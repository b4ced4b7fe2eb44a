"""Publishing the warm pool's modules to the spares (``--spares --recover warm``, issue #35) never
holds up the agent's watch loop, even when the store stops answering.

The store is a real one, served by a process of its own that the test SIGSTOPs (a host that
hangs: the kernel still accepts connections and buffers requests, nobody answers); the pool is
a real ``WarmPool`` whose ``tick`` (called by the agent's watch loop, agent.py ``_watch``) shares
what the workers reported through the real handler's ``warm_spares``. Before the fix the tick
made the store calls itself and blocked up to the store's ``read_timeout`` (30 s here): the
agent saw no worker exit, stop request or round event meanwhile.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.store_process import store_process
from tests.helpers.waiting import wait_for
from tests.runtime.rendezvous.helpers import Factory
from xrun.runtime.store.client import StoreClient
from xrun.runtime.workers.pool import WarmPool

READ_TIMEOUT = 30.0  # what a call to the hung store could block before the fix
PROMPT = 8.0  # a tick's bound here: generous on a busy 2-core host, far below READ_TIMEOUT


@pytest.fixture
def store() -> Iterator[tuple[subprocess.Popen[str], int]]:
    with store_process() as served:
        yield served


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[WarmPool]:
    script = tmp_path / "train.py"
    script.write_text("")
    p = WarmPool.create(sys.executable, [str(script)], 1)
    assert p is not None
    try:
        yield p
    finally:
        p.close()


def report(pool: WarmPool, rank: int, *modules: str) -> None:
    """A worker's module report (warm_child._report), as the pool reads it."""
    Path(pool.dir, f"modules.{rank}").write_text("".join(m + "\n" for m in modules))


def timed_tick(pool: WarmPool) -> float:
    """One pass of the watch loop through the pool, with a report due: its seconds."""
    now = time.monotonic()
    pool._look = (now, now + 95.0)  # as attach() sets it once the workers started
    pool.tick(None)
    return time.monotonic() - now


def published(port: int, n: int) -> str:
    """The ``n``-th module list in the store (the spares' reader's view), waited for."""
    import zlib

    c = StoreClient("127.0.0.1", port, read_timeout=60.0)
    try:
        vals = c.wait([f"job/kv/spare-modules/{n}"], timeout=60.0)
        assert vals is not None and vals[0] is not None
        return zlib.decompress(vals[0]).decode()
    finally:
        c.close()


def publishers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "xrun-spare-modules"]


def test_a_hung_store_does_not_hold_up_the_watch_loop(
    make: Factory, store: tuple[subprocess.Popen[str], int], pool: WarmPool
) -> None:
    proc, port = store
    h = make(f"127.0.0.1:{port}", read_timeout=str(READ_TIMEOUT))
    h.warm_spares(pool)
    os.kill(proc.pid, signal.SIGSTOP)  # before the first publish: even connecting hangs
    report(pool, 0, "json")
    assert timed_tick(pool) < PROMPT
    report(pool, 1, "json", "csv")  # a newer list while the first still hangs: latest wins
    assert timed_tick(pool) < PROMPT
    os.kill(proc.pid, signal.SIGCONT)
    # nothing is lost: the store gets the lists once it answers again (the newest holds all)
    first = published(port, 1).split("\n")
    assert "json" in first
    if "csv" not in first:
        assert sorted(published(port, 2).split("\n")) == ["csv", "json"]


def test_shutdown_wakes_a_publish_blocked_on_a_hung_store(
    make: Factory, store: tuple[subprocess.Popen[str], int], pool: WarmPool
) -> None:
    proc, port = store
    h = make(f"127.0.0.1:{port}", read_timeout=str(READ_TIMEOUT))
    h.warm_spares(pool)
    report(pool, 0, "json")
    assert timed_tick(pool) < PROMPT
    assert published(port, 1) == "json"  # connected, first list in
    os.kill(proc.pid, signal.SIGSTOP)
    report(pool, 0, "json", "csv")
    assert timed_tick(pool) < PROMPT  # the ADD now hangs, in the publisher's thread
    time.sleep(0.5)  # let it reach the read
    start = time.monotonic()
    h.shutdown()
    assert time.monotonic() - start < PROMPT
    # nothing left running: the blocked call woke up (its socket shut down) and the thread ended
    wait_for(lambda: not publishers(), timeout=PROMPT, what="the publisher thread to end")


def test_a_list_lost_after_its_slot_was_counted_is_sent_again_into_that_slot() -> None:
    """The connection dies between the ADD that counts a list's slot and the SET that writes
    it (injected: a real store cannot drop it on demand). The spares wait for the slots in
    order, so a counted slot never written would stop them for good: the list goes again,
    on a new connection, into the same slot."""
    import zlib

    from xrun.runtime.rendezvous.spares import Publisher
    from xrun.runtime.store import StoreServer
    from xrun.runtime.store.errors import StoreError

    server = StoreServer("127.0.0.1", 0)
    opened: list[StoreClient] = []

    class Flaky(StoreClient):
        def set(self, key: str, value: bytes) -> None:
            if len(opened) == 1:  # the first connection dies after its ADD
                raise StoreError("connection reset by peer")
            super().set(key, value)

    def open_client() -> StoreClient:
        c = Flaky("127.0.0.1", server.port)
        opened.append(c)
        return c

    pub = Publisher(open_client, "job")
    reader = StoreClient("127.0.0.1", server.port)
    try:
        pub(["torch", "numpy"])
        got = reader.wait(["job/kv/spare-modules/1"], timeout=20)
        assert got is not None, "the list was dropped with its slot counted"
        assert zlib.decompress(got[0] or b"").decode().split("\n") == ["torch", "numpy"]
        assert reader.get("job/kv/spare-modules/n") == b"1" and len(opened) == 2
    finally:
        pub.close()
        reader.close()
        server.stop()
