"""The gate between two rounds (rounds._await_previous_round): round r + 1 forms only once every
member of round r is out of it. One node keeps it: the cost of a re-formation stays O(1) per
node, not O(N) (each node's WAIT for N ``left`` keys made a 1,024-node replacement take 10-17 s,
benchmarks/rdzv_replace.py), and the gate still holds when its keeper is lost."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Sequence

import pytest

from tests.runtime.rendezvous.helpers import Factory, rendezvous_all, wait_event
from xrun.runtime.rendezvous import RendezvousEvent
from xrun.runtime.store.client import StoreClient

N = 12


@pytest.mark.timeout(120)
def test_one_node_waits_for_the_members_to_leave_the_others_for_its_word(
    make: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    hs = [make(nodes=f"{N}:{N}", addr="n00")]
    hs += [make(hs[0].endpoint, nodes=f"{N}:{N}", addr=f"n{i:02d}") for i in range(1, N)]
    first = rendezvous_all(hs)
    assert sorted(i.group_rank for i in first) == list(range(N))

    waits: list[int] = []  # the number of keys of every WAIT from now on
    real_wait = StoreClient.wait

    def counted(self: StoreClient, keys: Sequence[str], **kw: object) -> object:
        waits.append(len(keys))
        return real_wait(self, keys, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(StoreClient, "wait", counted)
    hs[3].request_restart("a worker failed")
    for h in hs:
        ev = wait_event(h, 20)
        assert ev is not None and ev[0] is RendezvousEvent.RESTART, ev
    again = rendezvous_all(hs)
    assert {(i.round, i.group_world_size) for i in again} == {(1, N)}
    assert sorted(i.group_rank for i in again) == list(range(N))
    # Old: every node's WAIT for the N left keys (and its read of the N-member list); now the
    # first arrival's alone (the sealer's WAIT for the N node entries is the other long one).
    long_waits = [n for n in waits if n >= N - 1]
    assert len(long_waits) <= 2, waits


@pytest.mark.timeout(120)
def test_a_gate_whose_keeper_is_lost_is_kept_by_each_node(make: Factory) -> None:
    """The first arrival in round 1 (the keeper) dies while a member of round 0 has not left
    it yet: the round goes stale, the others wait for the left keys themselves, and once that
    member leaves they form a world instead of waiting for a word that never comes."""
    a = make(nodes="2:4", addr="a")
    b, c, d = (make(a.endpoint, nodes="2:4", addr=x) for x in "bcd")
    rendezvous_all([a, b, c, d])
    b.request_restart("a worker failed")
    for h in (a, b, c, d):
        ev = wait_event(h, 20)
        assert ev is not None and ev[0] is RendezvousEvent.RESTART, ev

    # a arrives in round 1 first (arrival 1: the keeper) and waits for d, which has not left
    keeper_error: list[BaseException] = []

    def keeper() -> None:
        try:
            a.next_rendezvous()
        except BaseException as e:  # its connection is cut below
            keeper_error.append(e)

    watcher = StoreClient(a.endpoint.host, a.endpoint.port)
    t = threading.Thread(target=keeper, daemon=True)
    t.start()
    assert watcher.wait(["job/rdzv/1/node/1"], timeout=20) is not None
    time.sleep(0.3)  # a now waits for the members' left keys
    a._link.client._conn.sock.shutdown(socket.SHUT_RDWR)  # type: ignore[attr-defined]
    assert watcher.wait(["job/rdzv/1/stale"], timeout=20) is not None  # its lease fired
    got: list[object] = []
    joiners = [threading.Thread(target=lambda h=h: got.append(h.next_rendezvous())) for h in (b, c)]
    for j in joiners:
        j.start()
    time.sleep(0.5)
    assert got == []  # d is still in round 0: the gate holds
    d.shutdown()  # d leaves round 0
    for j in joiners:
        j.join(30)
    watcher.close()
    assert len(got) == 2, "b and c never formed a world after the gate's keeper was lost"
    t.join(10)
    assert keeper_error, "the keeper's cut connection went unnoticed"


def test_a_spare_waits_for_the_members_to_leave_in_one_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A parked spare waits until every member of the stale round left it: one WAIT for all
    the left keys (it made one per member: 16,384 round trips in a 16,384-node job)."""
    from xrun.runtime.rendezvous.keys import Keys, Seat, World
    from xrun.runtime.rendezvous.spares import park
    from xrun.runtime.store import StoreServer

    server = StoreServer("127.0.0.1", 0)
    c = StoreClient("127.0.0.1", server.port)
    try:
        k = Keys("job")
        members = [(f"n{i}", f"n{i}", i, 8) for i in range(1, 201)]
        c.set(k.of(0, "world"), Seat(-1, 0, 200, 1600).encode())
        c.set(k.of(0, "members"), World.encode(members))
        c.set(k.of(0, "stale"), b"node n7 is gone")
        for i in range(1, 201):
            c.set(k.of(0, f"left/{i}"), b"")
        waits: list[int] = []
        real_wait = StoreClient.wait

        def counted(self: StoreClient, keys: Sequence[str], **kw: object) -> object:
            waits.append(len(keys))
            return real_wait(self, keys, **kw)  # type: ignore[arg-type]

        monkeypatch.setattr(StoreClient, "wait", counted)
        park(c, k, 0, lambda rnd, nodes: None)
        assert len(waits) <= 4, waits  # world, stale, members, the left keys
    finally:
        c.close()
        server.stop()


@pytest.mark.timeout(120)
def test_in_an_elastic_round_only_the_latest_arrival_runs_the_last_call(
    make: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nodes arriving one by one into a MIN:MAX round: each earlier node used to wake at every
    later arrival (and read the count): O(N^2) for the store. Now a node wakes at most once,
    when it is no longer the latest arrival, and the world still forms with every node."""
    probes: list[str] = []  # the count reads (ADD 0) of woken nodes
    real_add = StoreClient.add

    def counted(self: StoreClient, key: str, delta: int) -> int:
        if delta == 0:
            probes.append(key)
        return real_add(self, key, delta)

    monkeypatch.setattr(StoreClient, "add", counted)
    n = 12
    conf = {"last_call_timeout": "30"}
    hs = [make(nodes=f"2:{n}", addr="n00", **conf)]
    hs += [make(hs[0].endpoint, nodes=f"2:{n}", addr=f"n{i:02d}", **conf) for i in range(1, n)]
    got: list[object] = []
    threads = []
    watcher = StoreClient(hs[0].endpoint.host, hs[0].endpoint.port)
    for i, h in enumerate(hs):
        t = threading.Thread(target=lambda h=h: got.append(h.next_rendezvous()), daemon=True)
        t.start()
        threads.append(t)
        assert watcher.wait([f"job/rdzv/0/node/{i + 1}"], timeout=20) is not None
        time.sleep(0.05)  # it waits now: the next one is a later arrival
    for t in threads:
        t.join(30)
    watcher.close()
    assert len(got) == n
    assert {(i.round, i.group_world_size) for i in got} == {(0, n)}  # type: ignore[attr-defined]
    assert len(probes) <= n, probes
