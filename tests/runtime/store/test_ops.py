"""The store's operations over real loopback sockets: values, waits, leases, pipelining, stop."""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest

from xrun.runtime.store import Op, Status, StoreClient, StoreError, StoreServer, StoreTimeoutError
from xrun.runtime.store.protocol import MAGIC, add_fields, encode_request, wait_fields


def test_set_get_add_delete(client: StoreClient) -> None:
    assert client.get("missing") is None
    client.set("a", b"\x00binary\xff")
    assert client.get("a") == b"\x00binary\xff"
    assert client.add("n", 5) == 5
    assert client.add("n", -2) == 3
    assert client.get("n") == b"3"  # counters read back as ASCII decimal
    client.delete("a")
    assert client.get("a") is None
    assert client.multi_get(["n", "a"]) == [b"3", None]


def test_add_on_non_integer_is_an_error_not_a_crash(client: StoreClient) -> None:
    client.set("s", b"abc")
    with pytest.raises(StoreError, match="not an integer"):
        client.add("s", 1)
    assert client.add("ok", 1) == 1  # the connection still works


def test_wait_blocks_on_the_server_until_set(server: StoreServer, client: StoreClient) -> None:
    other = StoreClient("127.0.0.1", server.port)
    t = threading.Timer(0.2, other.set, args=("late", b"v"))
    t.start()
    t0 = time.monotonic()
    assert client.wait(["late"], timeout=5) == [b"v"]
    assert 0.15 < time.monotonic() - t0 < 2
    t.join()
    other.close()


def test_wait_timeout_and_any(client: StoreClient) -> None:
    t0 = time.monotonic()
    assert client.wait(["never"], timeout=0.2) is None
    assert time.monotonic() - t0 >= 0.19
    client.set("b", b"2")
    assert client.wait(["a", "b"], want_all=False, timeout=1) == [None, b"2"]
    assert client.wait(["a", "b"], want_all=True, timeout=0.05) is None


def test_concurrent_adds_are_atomic(server: StoreServer) -> None:
    clients = [StoreClient("127.0.0.1", server.port) for _ in range(8)]
    results: list[int] = []
    lock = threading.Lock()

    def work(c: StoreClient) -> None:
        got = [c.add("ctr", 1) for _ in range(100)]
        with lock:
            results.extend(got)

    threads = [threading.Thread(target=work, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Every ADD returned a distinct value: no lost update, no duplicate arrival index.
    assert sorted(results) == list(range(1, 801))
    for c in clients:
        c.close()


def test_pipeline_answers_in_request_order_even_when_a_wait_parks(
    server: StoreServer, client: StoreClient
) -> None:
    other = StoreClient("127.0.0.1", server.port)
    setter = threading.Timer(0.1, other.set, args=("k", b"v"))
    setter.start()
    r_wait, r_add = client.pipeline(
        [(Op.WAIT, (wait_fields(["k"], True, 2.0),)), (Op.ADD, (add_fields("x", 7),))],
        wait=2.0,
    )
    assert r_wait.values() == [b"v"]
    assert r_add.body.i64() == 7
    setter.join()
    other.close()


def test_lease_fires_unless_renewed(client: StoreClient) -> None:
    client.lease("L1", 0.3, "fired1", b"gone")
    assert client.wait(["fired1"], timeout=2) == [b"gone"]
    # A renewed lease does not fire; a released one never fires.
    client.lease("L2", 0.3, "fired2", b"gone")
    for _ in range(4):
        time.sleep(0.15)
        client.lease("L2", 0.3, "fired2", b"gone")
    assert client.get("fired2") is None
    client.lease("L2", 0, "", b"")
    time.sleep(0.4)
    assert client.get("fired2") is None


def test_owned_lease_fires_when_its_connection_closes(
    server: StoreServer, client: StoreClient
) -> None:
    owner = StoreClient("127.0.0.1", server.port)
    owner.lease("own", 60, "own-fired", b"owner died", fire_on_disconnect=True)
    bystander = StoreClient("127.0.0.1", server.port)
    bystander.lease("free", 60, "free-fired", b"x")
    # A renewal from another connection (heartbeats travel apart) keeps the owner.
    client.lease("own", 60, "own-fired", b"owner died")
    owner.close()
    bystander.close()
    assert client.wait(["own-fired"], timeout=2) == [b"owner died"]
    time.sleep(0.1)
    assert client.get("free-fired") is None  # not owned: only its 60 s timer could fire it


def test_bind_in_use_raises_oserror(server: StoreServer) -> None:
    with pytest.raises(OSError):
        StoreServer("127.0.0.1", server.port)


def test_stop_sends_the_answers_it_owes_before_closing(server: StoreServer) -> None:
    # The rendezvous host sets the verdict ("closed") and stops at once: a peer must still read
    # its answer, not just a closed connection.
    waiter = StoreClient("127.0.0.1", server.port)
    waiter._conn.send(encode_request(7, Op.WAIT, wait_fields(["verdict"], True, None)))
    setter = StoreClient("127.0.0.1", server.port)
    setter.set("verdict", b"v" * 50_000)
    server.stop()
    resp = waiter._conn.recv_response()
    assert (resp.rid, resp.status, resp.values()) == (7, Status.OK, [b"v" * 50_000])
    waiter.close()
    setter.close()


def test_server_stop_unblocks_waiting_clients(server: StoreServer) -> None:
    c = StoreClient("127.0.0.1", server.port)
    errors: list[BaseException] = []

    def waiter() -> None:
        try:
            c.wait(["never"], timeout=None)
        except StoreError as e:
            errors.append(e)

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.1)
    server.stop()
    t.join(5)
    assert not t.is_alive()
    assert errors and "lost the store" in str(errors[0])
    c.close()


def test_a_hung_store_times_out_after_read_timeout() -> None:
    # A fake store that greets and accepts, then never answers (e.g. its host is frozen).
    lsock = socket.create_server(("127.0.0.1", 0))
    conns: list[socket.socket] = []

    def serve() -> None:
        c, _ = lsock.accept()
        conns.append(c)
        c.sendall(
            struct.pack("!I", 24) + MAGIC + b"\x00" + bytes(16) + struct.pack("!I", 1) + b"\x00"
        )

    t = threading.Thread(target=serve)
    t.start()
    c = StoreClient("127.0.0.1", lsock.getsockname()[1], read_timeout=0.3)
    t.join()
    t0 = time.monotonic()
    with pytest.raises(StoreTimeoutError, match="read_timeout"):
        c.add("k", 1)
    assert 0.25 < time.monotonic() - t0 < 2
    c.close()
    for s in conns:
        s.close()
    lsock.close()
