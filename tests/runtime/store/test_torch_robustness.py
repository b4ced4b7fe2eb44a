"""What a misbehaving client can do to the server: garbage, half messages, absurd lengths,
waits left behind. Each bad connection is dropped alone; the server keeps serving the rest."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.helpers.net import recv_exactly
from tests.runtime.store.torch_fixtures import ServerProcess
from xrun.runtime.store import StoreServer
from xrun.runtime.store.torch_data import WorkersKeySpace
from xrun.runtime.store.torch_protocol import (
    HANDSHAKE_PREFIX,
    CancelWait,
    Ping,
    Set,
    Wait,
    encode_request,
)

U64 = struct.Struct("<Q")


def raw(port: int, data: bytes = b"", *, validate: bool = True) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall((HANDSHAKE_PREFIX if validate else b"") + data)
    return sock


def closed_by_server(sock: socket.socket) -> bool:
    """True when the server closed the connection (EOF or reset) within the socket timeout."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


@pytest.mark.parametrize(
    ("data", "validate", "reason"),
    [
        # Not a torch client's (nor an xrun client's) first bytes: the server's protocol choice
        # drops these before any session sees them.
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", False, "neither xrun's nor torch's protocol"),
        (b"\x00\xde\xad\xbe\xef", False, "neither xrun's nor torch's protocol"),
        (encode_request(Set("k", b"v")), False, "neither xrun's nor torch's protocol"),
        (HANDSHAKE_PREFIX, True, "VALIDATE again"),
        (b"\xff", True, "unknown query type 255"),
        (b"\x01" + U64.pack(1 << 62), True, "key of 4611686018427387904 bytes"),
        (b"\x01" + U64.pack(1) + b"k" + U64.pack(1 << 40), True, "value of 1099511627776 bytes"),
        (b"\x06" + U64.pack(1 << 40), True, "1099511627776 keys in WAIT"),
        (b"\x0b" + U64.pack(1 << 63), True, "keys in MULTI_SET"),  # a negative int64 count
    ],
)
def test_bad_input_drops_only_that_connection(
    tserver: ServerProcess, connect: Callable[..., Any], data: bytes, validate: bool, reason: str
) -> None:
    rss_before = tserver.rss_kib()
    with raw(tserver.port, data, validate=validate) as sock:
        assert closed_by_server(sock)  # at once: the server does not await the declared bytes
    assert any(reason in r for r in tserver.dropped()), tserver.dropped()
    assert tserver.rss_kib() - rss_before < 8 << 10  # nothing near the declared size was allocated
    store = connect()
    store.set("still", "serving")
    assert store.get("still") == b"serving"


def test_half_messages_leave_the_server_serving(
    tserver: ServerProcess, connect: Callable[..., Any]
) -> None:
    half_set = encode_request(Set("key", b"value"))[:-3]
    left_open = [raw(tserver.port, half_set) for _ in range(3)]  # stuck mid-request, still open
    raw(tserver.port, half_set).close()  # gone mid-request
    raw(tserver.port, validate=False).close()  # gone before the handshake
    with socket.create_connection(("127.0.0.1", tserver.port)) as sock:
        sock.sendall(HANDSHAKE_PREFIX[:3])  # half a handshake
        store = connect()
        store.set("k", "v")
        assert store.get("k") == b"v"
        assert not store.check(["key"])  # no half SET was applied
    for sock in left_open:
        sock.close()
    assert tserver.dropped() == []
    assert connect().get("k") == b"v"


def test_a_request_split_into_single_bytes(tserver: ServerProcess) -> None:
    message = HANDSHAKE_PREFIX + encode_request(Set("k", b"v" * 100)) + encode_request(Ping(7))
    with socket.create_connection(("127.0.0.1", tserver.port), timeout=10) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(len(message)):
            sock.send(message[i : i + 1])
        assert recv_exactly(sock, 4) == struct.pack("<I", 7)


def test_ping_echoes_the_nonce(tserver: ServerProcess) -> None:
    with raw(tserver.port, encode_request(Ping(0xDEADBEEF))) as sock:
        assert recv_exactly(sock, 4) == struct.pack("<I", 0xDEADBEEF)


def test_cancel_after_the_wait_fired_answers_both_in_order(tserver: ServerProcess) -> None:
    # The race torch's client handles: its timeout expires just as the key arrives, so it reads
    # STOP_WAITING (0) and then WAIT_CANCELED (1).
    with raw(tserver.port, encode_request(Wait(("k",)))) as waiter:
        with raw(tserver.port, encode_request(Set("k", b"1"))):
            assert recv_exactly(waiter, 1) == b"\x00"
        waiter.sendall(encode_request(CancelWait()))
        assert recv_exactly(waiter, 1) == b"\x01"
        waiter.sendall(encode_request(CancelWait()))  # nothing parked: still answered
        assert recv_exactly(waiter, 1) == b"\x01"


def test_pipelined_wait_then_set_on_one_connection(tserver: ServerProcess) -> None:
    with raw(tserver.port, encode_request(Wait(("p",))) + encode_request(Set("p", b""))) as sock:
        assert recv_exactly(sock, 1) == b"\x00"


def test_a_second_wait_while_one_is_parked_is_dropped(tserver: ServerProcess) -> None:
    with raw(tserver.port, encode_request(Wait(("a",))) + encode_request(Wait(("b",)))) as sock:
        assert closed_by_server(sock)
    assert any("another wait is parked" in r for r in tserver.dropped())


def test_a_closed_connection_forgets_its_parked_wait() -> None:
    store = StoreServer("127.0.0.1", 0)  # raw sockets only: no torch client in this process
    try:
        capped = store.workers().space  # the capped key space (quota.py) around the real one
        space = getattr(capped, "inner", capped)
        assert isinstance(space, WorkersKeySpace)
        deadline = time.monotonic() + 5
        with raw(store.port, encode_request(Wait(("k",)))):
            while not space.parked and time.monotonic() < deadline:
                time.sleep(0.01)
            assert space.parked == 1
        while space.parked and time.monotonic() < deadline:
            time.sleep(0.01)
        assert space.parked == 0
        with raw(store.port, encode_request(Set("k", b"1")) + encode_request(Ping(1))) as sock:
            assert recv_exactly(sock, 4) == struct.pack("<I", 1)
    finally:
        store.stop()
