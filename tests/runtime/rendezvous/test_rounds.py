"""Forming worlds over real loopback sockets: nodes are threads or real subprocesses."""

from __future__ import annotations

import json
import socket

import pytest

from tests.runtime.rendezvous.helpers import Factory, rendezvous_all, spawn_node
from xrun.errors import UsageError

# -- c10d: forming worlds ------------------------------------------------------------------------


def test_single_node_on_port_zero(make: Factory) -> None:
    h = make(nproc=4)
    assert h.is_host and h.endpoint.port != 0
    assert h._link.server is not None and h._link.server.host == "127.0.0.1"  # not 0.0.0.0
    info = h.next_rendezvous()
    assert (info.round, info.group_rank, info.group_world_size, info.world_size) == (0, 0, 1, 4)
    assert info.local_world_sizes == (4,)


@pytest.mark.parametrize("n", [2, 4])
def test_c10d_threads_get_deterministic_ranks(make: Factory, n: int) -> None:
    names = [f"node-{i}" for i in range(n)]
    # The host has the last name and the others are created in reverse order: ranks follow
    # the advertised names, not who serves the store or who arrives first.
    host = make(nodes=f"{n}:{n}", addr=names[-1], nproc=n)
    hs = [
        host,
        *(
            make(host.endpoint, nodes=f"{n}:{n}", addr=names[i], nproc=i + 1)
            for i in reversed(range(n - 1))
        ),
    ]
    infos = rendezvous_all(hs)
    for h, info in zip(hs, infos, strict=True):
        assert info.group_rank == names.index(h.addr)
        assert info.addrs == tuple(names)
        assert info.local_world_sizes == tuple(range(1, n + 1))
        assert info.rank_offset == sum(range(1, info.group_rank + 1))
        assert info.world_size == n * (n + 1) // 2


@pytest.mark.timeout(60)
def test_c10d_subprocess_nodes(make: Factory) -> None:
    host = make("127.0.0.1:0", nodes="3:3", addr="b-host")
    procs = [spawn_node(host.endpoint, "job", "3:3", a) for a in ("c-node", "a-node")]
    info = host.next_rendezvous()
    outs = [json.loads(p.communicate(timeout=30)[0]) for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert info.addrs == ("a-node", "b-host", "c-node") and info.group_rank == 1
    assert [o["rank"] for o in outs] == [2, 0]
    host.finish(5)


def test_ipv6_endpoint(make: Factory) -> None:
    try:
        with socket.create_server(("::1", 0), family=socket.AF_INET6):
            pass
    except OSError:
        # A container without IPv6 loopback: the bracketed form must still fail cleanly.
        with pytest.raises(UsageError, match=r"\[::1\]:0"):
            make("[::1]:0")
        return
    h = make("[::1]:0", nodes="2:2", addr="a")
    peer = make(h.endpoint, nodes="2:2", addr="b")
    assert (
        str(h.endpoint).startswith("[::1]:")
        and h._link.server is not None
        and h._link.server.host == "::1"
    )
    assert [i.group_rank for i in rendezvous_all([h, peer])] == [0, 1]


def test_c10d_endpoint_host_serves_and_second_agent_on_host_becomes_client(make: Factory) -> None:
    # Both resolve the endpoint to this host: the first binds the port, the second finds it taken.
    first = make("127.0.0.1:0", nodes="2:2", addr="x")
    second = make(first.endpoint, nodes="2:2", addr="y")
    assert first.is_host and not second.is_host
    assert [i.group_rank for i in rendezvous_all([first, second])] == [0, 1]
