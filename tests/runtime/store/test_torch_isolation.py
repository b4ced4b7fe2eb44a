"""One port, two protocols, two key spaces: a torch client reaches only the workers' keys, never
the rendezvous' (nor the agents' secret), and each workers' generation starts empty."""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable
from typing import Any

from tests.runtime.store.torch_fixtures import ServerProcess
from tests.runtime.store.torch_server import SECRET_KEY, TOKEN, WORKERS_KEY
from xrun.runtime.store import StoreClient
from xrun.runtime.store.torch_protocol import (
    HANDSHAKE_PREFIX,
    Check,
    Get,
    GetNumKeys,
    ListKeys,
    Set,
    encode_request,
)

U64 = struct.Struct("<Q")


def ask(port: int, *requests: Any, answer: int) -> bytes:
    """Raw torch-protocol requests on a fresh connection: keys exactly as given (torch's own
    client would put "/" before them); the first ``answer`` bytes that come back."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(HANDSHAKE_PREFIX + b"".join(encode_request(r) for r in requests))
        out = b""
        while len(out) < answer:
            chunk = sock.recv(answer - len(out))
            assert chunk, "the store closed the connection"
            out += chunk
        return out


def agent(tserver: ServerProcess) -> StoreClient:
    return StoreClient("127.0.0.1", tserver.port, TOKEN, connect_timeout=10, read_timeout=10)


def test_a_torch_client_cannot_read_rendezvous_keys(tserver: ServerProcess) -> None:
    port = tserver.port
    assert ask(port, Get(SECRET_KEY), answer=8) == U64.pack(0)  # an empty value, not its own
    assert ask(port, Check((SECRET_KEY,)), answer=1) == b"\x01"  # NOT_READY
    assert ask(port, Check((WORKERS_KEY,)), answer=1) == b"\x01"
    assert ask(port, GetNumKeys(), answer=8) == struct.pack("<q", 0)
    assert ask(port, ListKeys(), answer=8) == struct.pack("<q", 0)
    a = agent(tserver)
    assert a.get(SECRET_KEY) == b"agent-only"  # it is there, for the agents


def test_a_torch_client_cannot_write_rendezvous_keys(
    tserver: ServerProcess, connect: Callable[..., Any]
) -> None:
    ask(
        tserver.port,
        Set(SECRET_KEY, b"forged"),
        Set(WORKERS_KEY, b"forged"),
        GetNumKeys(),
        answer=8,
    )
    a = agent(tserver)
    assert a.get(SECRET_KEY) == b"agent-only"
    assert a.get(WORKERS_KEY) == b"0"
    assert connect().num_keys() == 2  # the two it wrote, in the workers' own key space


def test_an_xrun_client_without_the_secret_is_refused_on_the_same_port(
    tserver: ServerProcess,
) -> None:
    import pytest

    from xrun.runtime.store import StoreAuthError

    with pytest.raises(StoreAuthError):
        StoreClient("127.0.0.1", tserver.port, None, connect_timeout=5, read_timeout=5)


def test_a_new_generation_starts_empty_and_the_old_one_stays_apart(
    tserver: ServerProcess, connect: Callable[..., Any]
) -> None:
    old = connect()
    old.set("k", "attempt 0")
    assert connect().get("k") == b"attempt 0"  # same generation: shared
    agent(tserver).set(WORKERS_KEY, b"1")  # the rendezvous formed a new round
    new = connect()
    assert not new.check(["k"]) and new.num_keys() == 0
    new.set("k", "attempt 1")
    old.set("late", "from attempt 0")  # a straggler of the old round
    assert old.get("k") == b"attempt 0"
    assert connect().get("k") == b"attempt 1"
    assert not new.check(["late"])
