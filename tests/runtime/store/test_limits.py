"""The store's defences: authentication, and clients that send garbage, too much or nothing.
None of them may crash or stall the store for the others."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator

import pytest

from xrun.runtime.store import Op, Status, StoreAuthError, StoreClient, StoreError, StoreServer
from xrun.runtime.store.handler import MAX_WAITS_PER_CONNECTION
from xrun.runtime.store.protocol import encode_request, wait_fields
from xrun.runtime.store.session import Session

TOKEN = b"s3cret-token"


# -- authentication ------------------------------------------------------------------------------


@pytest.fixture
def auth_server() -> Iterator[StoreServer]:
    s = StoreServer("127.0.0.1", 0, TOKEN, handshake_timeout=0.5)
    yield s
    s.stop()


def test_auth_accepts_the_right_token(auth_server: StoreServer) -> None:
    c = StoreClient("127.0.0.1", auth_server.port, TOKEN)
    c.set("x", b"1")
    assert c.get("x") == b"1"
    c.close()


@pytest.mark.parametrize("token", [None, b"wrong"])
def test_auth_rejects_a_wrong_or_missing_token(
    auth_server: StoreServer, token: bytes | None
) -> None:
    with pytest.raises(StoreAuthError, match="XRUN_RDZV_TOKEN"):
        StoreClient("127.0.0.1", auth_server.port, token)
    # With the verdict read lazily the refusal surfaces on the first call, still as an auth error.
    lazy = StoreClient("127.0.0.1", auth_server.port, token, lazy_verdict=True)
    with pytest.raises(StoreAuthError):
        lazy.set("x", b"1")
    lazy.close()
    ok = StoreClient("127.0.0.1", auth_server.port, TOKEN)
    assert ok.get("x") is None  # the rejected client wrote nothing
    ok.close()


# -- abuse: none of these may crash or stall the store for the others -----------------------------


def _raw(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    return s


def _closed_by_peer(s: socket.socket, within: float) -> bool:
    s.settimeout(within)
    try:
        while s.recv(4096):
            pass
        return True
    except TimeoutError:
        return False
    except ConnectionError:
        return True


def test_garbage_bytes_close_only_that_connection(auth_server: StoreServer) -> None:
    good = StoreClient("127.0.0.1", auth_server.port, TOKEN)
    bad = _raw(auth_server.port)
    bad.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(range(256)))
    assert _closed_by_peer(bad, 2)
    bad.close()
    good.set("still", b"works")
    assert good.get("still") == b"works"
    good.close()


def test_big_frame_before_auth_is_refused_at_once(auth_server: StoreServer) -> None:
    bad = _raw(auth_server.port)
    bad.sendall(struct.pack("!I", 1 << 20) + b"x" * 1000)  # claims 1 MiB before authenticating
    t0 = time.monotonic()
    assert _closed_by_peer(bad, 2)
    assert time.monotonic() - t0 < 0.4  # not the 0.5 s handshake timeout: refused on sight
    bad.close()


def test_garbage_after_auth_closes_only_that_connection(server: StoreServer) -> None:
    good = StoreClient("127.0.0.1", server.port)
    victim = StoreClient("127.0.0.1", server.port)
    victim._conn.sock.sendall(struct.pack("!I", 3) + b"\xff\xff\xff")  # truncated request
    assert _closed_by_peer(victim._conn.sock, 2)
    assert good.add("n", 1) == 1
    good.close()
    victim.close()


def test_oversized_frame_is_refused(server: StoreServer, client: StoreClient) -> None:
    bad = StoreClient("127.0.0.1", server.port)
    # A length prefix far above max_frame: the server must not try to buffer it.
    bad._conn.sock.sendall(struct.pack("!I", 2**31))
    assert _closed_by_peer(bad._conn.sock, 2)
    with pytest.raises(StoreError):
        bad2 = StoreClient("127.0.0.1", server.port)
        try:
            bad2.set("big", b"x" * (128 * 1024))  # over the fixture's 64 KiB frame limit
            bad2.get("big")
        finally:
            bad2.close()
    client.set("small", b"ok")
    assert client.get("small") == b"ok"
    assert client.get("big") is None


def test_silent_client_is_dropped_and_does_not_block_others(auth_server: StoreServer) -> None:
    silent = [_raw(auth_server.port) for _ in range(20)]
    t0 = time.monotonic()
    good = StoreClient("127.0.0.1", auth_server.port, TOKEN)
    good.set("k", b"v")
    assert good.get("k") == b"v"
    assert time.monotonic() - t0 < 0.4  # served while 20 silent peers sit in the handshake
    for s in silent:
        assert _closed_by_peer(s, 3)  # handshake_timeout=0.5
        s.close()
    good.close()


def test_parked_waits_per_connection_are_capped(server: StoreServer, client: StoreClient) -> None:
    greedy = StoreClient("127.0.0.1", server.port)
    conn = greedy._conn
    n = MAX_WAITS_PER_CONNECTION + 1
    conn.send(
        b"".join(
            encode_request(rid, Op.WAIT, wait_fields([f"never{rid}"], True, None))
            for rid in range(1, n + 1)
        )
    )
    resp = conn.recv_response()
    assert (resp.rid, resp.status) == (n, Status.ERROR)
    assert "waits on one connection" in resp.body.str_()
    client.set("never1", b"x")  # the parked ones still work, and so does everyone else
    resp = conn.recv_response()
    assert (resp.rid, resp.status, resp.values()) == (1, Status.OK, [b"x"])
    greedy.close()


def test_a_client_that_never_reads_its_answers_is_dropped(
    server: StoreServer, client: StoreClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Session, "MAX_UNSENT", 1 << 20)  # 64 MiB in production
    client.set("big", b"x" * 60_000)
    hog = StoreClient("127.0.0.1", server.port)
    # 400 reads of 60 kB (24 MB) that it never collects: more than the socket buffers hold.
    get_big = wait_fields(["big"], True, 0)
    hog._conn.sock.sendall(b"".join(encode_request(i, Op.WAIT, get_big) for i in range(1, 401)))
    t0 = time.monotonic()
    client.set("k", b"v")  # everyone else is served meanwhile
    # Served meanwhile, not after the hog is dropped or the test times out; 1 s on an idle
    # machine, the margin is for a busy one (a blocked server would take the whole timeout).
    assert client.get("k") == b"v" and time.monotonic() - t0 < 15
    assert _closed_by_peer(hog._conn.sock, 5)  # reading now drains what was sent, then EOF
    hog.close()


@pytest.mark.parametrize("huge", [1e300, float("inf"), 1e9])
def test_absurd_timeouts_do_not_stop_the_loop(
    server: StoreServer, client: StoreClient, huge: float
) -> None:
    # A wait or a lease "for ever": its timer lies beyond what select() can sleep (it used to
    # raise OverflowError there, ending the store's thread for everyone).
    hog = StoreClient("127.0.0.1", server.port)
    hog._conn.send(encode_request(7, Op.WAIT, wait_fields(["never"], True, huge)))
    hog.lease("lease", huge, "fired", b"1")
    time.sleep(1.0)  # past the handshake timers (0.5 s): only those far ones are pending
    assert server.running
    client.set("still", b"serving")
    assert client.get("still") == b"serving"
    hog.close()
