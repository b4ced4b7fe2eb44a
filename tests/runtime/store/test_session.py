"""The one connection class (``session.Session``) under both protocols, over real loopback
sockets to a real ``StoreServer``: one write per read, answers before a bad request, the
half-close after a refused token, the handshake deadline."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers.net import recv_exactly
from xrun.runtime.store import StoreServer
from xrun.runtime.store import torch_protocol as tp
from xrun.runtime.store.protocol import (
    HELLO,
    LEN,
    MAGIC,
    NONCE_LEN,
    Op,
    Reader,
    auth_mac,
    encode_request,
    pack_bytes,
)
from xrun.runtime.store.session import Session

TOKEN = b"job-secret"
TIMEOUT = 0.5  # the servers' handshake_timeout


@pytest.fixture
def guarded() -> Iterator[StoreServer]:
    s = StoreServer("127.0.0.1", 0, TOKEN, handshake_timeout=TIMEOUT)
    yield s
    s.stop()


def connect(port: int, first: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if first:
        sock.sendall(first)
    return sock


def recv_frame(sock: socket.socket) -> bytes:
    (n,) = LEN.unpack(recv_exactly(sock, 4))
    return recv_exactly(sock, n)


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """The server closed its side (EOF or reset) within ``seconds``, nothing else arriving."""
    sock.settimeout(seconds)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def greet(sock: socket.socket, token: bytes | None) -> bytes:
    """Send HELLO, read the greeting; the credentials frame that answers it."""
    sock.sendall(HELLO)
    greeting = recv_frame(sock)
    nonce = greeting[-NONCE_LEN:]
    return pack_bytes(MAGIC + (auth_mac(token, nonce) if token else b""))


@pytest.fixture
def io_counts(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many reads reached a session and how many writes left one (the real methods run)."""
    counts = {"reads": 0, "writes": 0}
    real_read, real_write = Session.data_received, Session._write

    def read(self: Session, data: bytes) -> None:
        counts["reads"] += 1
        real_read(self, data)

    def write(self: Session, data: bytes) -> None:
        counts["writes"] += 1
        real_write(self, data)

    monkeypatch.setattr(Session, "data_received", read)
    monkeypatch.setattr(Session, "_write", write)
    return counts


def test_one_read_answers_in_one_write_xrun(server: StoreServer, io_counts: Any) -> None:
    pings = b"".join(encode_request(rid, Op.PING) for rid in range(1, 21))
    with connect(server.port, HELLO + pack_bytes(MAGIC) + pings) as sock:
        frames = [recv_frame(sock) for _ in range(22)]  # greeting, verdict, 20 answers
        assert frames[1] == b"\x00"
        assert [Reader(f).u32() for f in frames[2:]] == list(range(1, 21))
    assert 1 <= io_counts["writes"] <= io_counts["reads"]


def test_one_read_answers_in_one_write_torch(server: StoreServer, io_counts: Any) -> None:
    pings = b"".join(tp.encode_request(tp.Ping(n)) for n in range(20))
    with connect(server.port, tp.HANDSHAKE_PREFIX + pings) as sock:
        answers = recv_exactly(sock, 4 * 20)
    assert answers == b"".join(struct.pack("<I", n) for n in range(20))
    assert 1 <= io_counts["writes"] <= io_counts["reads"]


def test_answers_before_a_bad_request_still_go_out(server: StoreServer) -> None:
    torch_burst = tp.HANDSHAKE_PREFIX + tp.encode_request(tp.Ping(7)) + b"\x63"
    with connect(server.port, torch_burst) as sock:
        assert recv_exactly(sock, 4) == struct.pack("<I", 7)
        assert closed_within(sock, 2)
    unknown_op = pack_bytes(struct.pack("!IB", 2, 99))
    xrun_burst = HELLO + pack_bytes(MAGIC) + encode_request(1, Op.PING) + unknown_op
    with connect(server.port, xrun_burst) as sock:
        frames = [recv_frame(sock) for _ in range(3)]
        assert frames[1] == b"\x00" and Reader(frames[2]).u32() == 1
        assert closed_within(sock, 2)


def test_a_refused_client_reads_its_verdict_then_eof(guarded: StoreServer) -> None:
    with connect(guarded.port) as sock:
        creds = greet(sock, b"wrong")
        t0 = time.monotonic()
        sock.sendall(creds + encode_request(1, Op.PING) + b"garbage that is ignored")
        assert recv_frame(sock).startswith(b"\x01wrong or missing token")
        assert closed_within(sock, TIMEOUT / 2)  # half-closed at once: EOF after the verdict
        assert time.monotonic() - t0 < TIMEOUT


def test_the_handshake_deadline_runs_until_the_client_is_trusted(guarded: StoreServer) -> None:
    stalled = connect(guarded.port)
    greet(stalled, TOKEN)  # greeted, never sends its credentials
    half_torch = connect(guarded.port, tp.HANDSHAKE_PREFIX[:3])  # protocol not told yet
    trusted = connect(guarded.port)
    trusted.sendall(greet(trusted, TOKEN))
    assert recv_frame(trusted) == b"\x00"
    torch = connect(guarded.port, tp.HANDSHAKE_PREFIX)
    assert closed_within(stalled, TIMEOUT + 2) and closed_within(half_torch, 1)
    time.sleep(0.2)  # well past the deadline for the two that made it
    trusted.sendall(encode_request(5, Op.PING))
    assert Reader(recv_frame(trusted)).u32() == 5
    torch.sendall(tp.encode_request(tp.Ping(9)))
    assert recv_exactly(torch, 4) == struct.pack("<I", 9)
    for s in (stalled, half_torch, trusted, torch):
        s.close()
