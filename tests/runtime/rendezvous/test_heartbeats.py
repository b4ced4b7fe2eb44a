"""A node's heartbeats never wait for a slow side call of its own agent.

The heartbeat thread (leases.py) renews the node's round leases under the handler's lock. The
agent's keys (``handler.kv()``, used by the stall watchdog's shared progress counter and its
cross-node stacks) open a second store connection on first use; that connect (DNS, a store
with a full accept backlog, SYN retries: up to ``read_timeout`` with backoff) used to happen
under the same lock. A slow connect then starved the heartbeats: after ``heartbeat_timeout``
the store fired the node's lease, the round went stale (every node restarted its workers) and
the node's lost-lease quarantined it, though nothing had failed.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from tests.helpers.net import free_port
from tests.runtime.rendezvous.helpers import FAST, rendezvous_all, wait_event
from xrun.runtime.rendezvous import (
    Endpoint,
    RendezvousHandler,
    RendezvousParams,
    create_handler,
)
from xrun.runtime.rendezvous.budget import quarantine_key
from xrun.runtime.rendezvous.keys import Keys

# Heartbeats every 0.2 s, a node lost after 2 s without one (roomy on a loaded 2-core host).
CONF = {**FAST, "heartbeat_interval": "0.2", "heartbeat_timeout": "2"}
WINDOW_S = 5.0  # the slow connect lasts this long: well past heartbeat_timeout


@pytest.fixture
def pair() -> Iterator[tuple[RendezvousHandler, RendezvousHandler]]:
    ep = Endpoint("127.0.0.1", free_port())
    made = [
        create_handler(
            RendezvousParams("c10d", ep, "hb", 1, 2, 1, CONF, local_addr="127.0.0.1", node_id=node)
        )
        for node in ("a", "b")
    ]
    try:
        yield made[0], made[1]
    finally:
        for h in sorted(made, key=lambda h: h.is_host):
            h.shutdown()


def test_a_slow_kv_connect_does_not_starve_the_heartbeats(
    pair: tuple[RendezvousHandler, RendezvousHandler],
) -> None:
    host, peer = pair
    assert host.is_host and not peer.is_host
    infos = rendezvous_all([host, peer])
    assert {i.group_world_size for i in infos} == {2}

    link = peer._link  # type: ignore[attr-defined]
    real_open = link.open_client
    entered, release = threading.Event(), threading.Event()

    def slow_open():  # type: ignore[no-untyped-def]
        entered.set()
        release.wait(60)
        return real_open()

    link.open_client = slow_open
    opener = threading.Thread(target=peer.kv, daemon=True)
    opener.start()
    try:
        assert entered.wait(30)
        # While the peer's agent connects: no node may look gone to the others.
        event = wait_event(host, WINDOW_S)
    finally:
        release.set()
        opener.join(30)
    assert event is None, f"a healthy node was dropped while its agent connected: {event}"
    q = host._link.client.get(quarantine_key(Keys("hb"), "b"))  # type: ignore[attr-defined]
    assert q is None, f"a healthy node was quarantined: {q!r}"
    peer.kv().set("x", b"1")  # the connection came up and works
