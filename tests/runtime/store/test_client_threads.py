"""One ``StoreClient`` used by two threads at once: the agent's ``kv()`` connection is shared by
the watch loop (a stall's exchange of every node's stacks: a WAIT for the others' keys,
diagnose/watch.py) and the stall watchdog's progress thread (an ADD, diagnose/shared.py). The
thread that reads the socket meets the other thread's answer first: it must keep that answer
for its caller, not fail both calls with "response id ... matches no request"."""

from __future__ import annotations

import threading
from typing import Any

from tests.helpers.waiting import wait_for
from xrun.runtime.store import StoreClient, StoreServer


def test_an_answer_for_another_threads_call_is_kept_for_it(
    server: StoreServer, client: StoreClient
) -> None:
    other = StoreClient("127.0.0.1", server.port, connect_timeout=5, read_timeout=5)
    got: dict[str, Any] = {}

    def call(name: str, fn: Any) -> None:
        try:
            got[name] = fn()
        except Exception as e:  # noqa: BLE001 - the test reports what the call raised
            got[name] = e

    waiter = threading.Thread(target=call, args=("wait", lambda: client.wait(["k"], timeout=30)))
    waiter.start()
    # The waiter reads the connection now (its WAIT parked on the server)...
    wait_for(lambda: client._rlock.locked(), what="the waiter reading", timeout=30)  # noqa: SLF001
    adder = threading.Thread(target=call, args=("add", lambda: client.add("n", 1)))
    adder.start()
    # ...so the ADD's answer, sent before the WAIT's, reaches the waiter's read first.
    wait_for(lambda: other.add("n", 0) == 1, what="the ADD applied", timeout=30)
    other.set("k", b"v")
    waiter.join(30)
    adder.join(30)
    other.close()
    assert got == {"wait": [b"v"], "add": 1}
