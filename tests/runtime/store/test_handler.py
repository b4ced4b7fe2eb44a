"""xrun's handler alone, over a KeySpace, without sockets: the handshake, answers in order,
parked waits answered from another connection's request, errors, and what a connection's end
leaves behind."""

from __future__ import annotations

import pytest

from tests.runtime.store.manual_clock import ManualClock
from xrun.runtime.store.data import KeySpace
from xrun.runtime.store.errors import ProtocolError, Refused
from xrun.runtime.store.handler import MAX_WAITS_PER_CONNECTION, Admission, XrunHandler
from xrun.runtime.store.protocol import (
    HELLO,
    LEN,
    MAGIC,
    NONCE_LEN,
    Op,
    Reader,
    Status,
    add_fields,
    auth_mac,
    encode_request,
    lease_fields,
    pack_bytes,
    wait_fields,
)

TOKEN = b"job-secret"


class Conn:
    """A handler and every frame it sent (decoded from what went to ``send``)."""

    def __init__(self, data: KeySpace, token: bytes | None = None) -> None:
        self.sent: list[bytes] = []
        self.handler = XrunHandler(data, Admission(token), self.sent.append)

    def frames(self) -> list[bytes]:
        out = []
        for chunk in self.sent:
            r = Reader(chunk)
            while r.pos < len(chunk):
                out.append(r.bytes_())
        self.sent.clear()
        return out

    def answers(self) -> list[tuple[int, Status, Reader]]:
        out = []
        for frame in self.frames():
            r = Reader(frame)
            out.append((r.u32(), Status(r.u8()), r))
        return out

    def greet(self, token: bytes | None = None) -> None:
        self.handler.feed(HELLO)
        (greeting,) = self.frames()
        nonce = greeting[len(MAGIC) + 1 :]
        mac = auth_mac(token, nonce) if token is not None else b""
        self.handler.feed(pack_bytes(MAGIC + mac))
        assert self.frames() == [b"\x00"] and self.handler.trusted

    def call(self, rid: int, op: Op, *fields: bytes) -> None:
        self.handler.feed(encode_request(rid, op, *fields))


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def data(clock: ManualClock) -> KeySpace:
    return KeySpace(clock)


def test_the_greeting_asks_for_a_token_only_when_there_is_one(data: KeySpace) -> None:
    open_, guarded = Conn(data), Conn(data, TOKEN)
    open_.handler.feed(HELLO)
    guarded.handler.feed(HELLO)
    (plain,) = open_.frames()
    (challenge,) = guarded.frames()
    assert plain == MAGIC + b"\x00" + bytes(NONCE_LEN)  # no token: no nonce worth a syscall
    assert challenge[: len(MAGIC) + 1] == MAGIC + b"\x01"
    assert len(challenge) == len(MAGIC) + 1 + NONCE_LEN and challenge[-NONCE_LEN:] != bytes(16)
    assert not open_.handler.trusted and not guarded.handler.trusted


def test_the_right_mac_is_accepted(data: KeySpace) -> None:
    conn = Conn(data, TOKEN)
    conn.greet(TOKEN)
    conn.call(1, Op.PING)
    assert [(rid, st) for rid, st, _ in conn.answers()] == [(1, Status.OK)]


@pytest.mark.parametrize("token", [None, b"wrong"])
def test_a_wrong_or_missing_mac_is_refused_with_a_verdict(
    data: KeySpace, token: bytes | None
) -> None:
    conn = Conn(data, TOKEN)
    conn.handler.feed(HELLO)
    nonce = conn.frames()[0][-NONCE_LEN:]
    mac = auth_mac(token, nonce) if token else b""
    pipelined = encode_request(1, Op.SET, pack_bytes(b"k"), pack_bytes(b"v"))
    with pytest.raises(Refused):
        conn.handler.feed(pack_bytes(MAGIC + mac) + pipelined)
    (verdict,) = conn.frames()
    assert verdict.startswith(b"\x01") and b"wrong or missing token" in verdict
    assert not conn.handler.trusted and data.values == {}  # the pipelined SET was not applied


def test_pipelined_requests_answer_in_order_and_id_0_gets_none(data: KeySpace) -> None:
    conn = Conn(data)
    conn.greet()
    conn.handler.feed(
        encode_request(0, Op.SET, pack_bytes(b"k"), pack_bytes(b"v"))
        + encode_request(7, Op.ADD, add_fields("n", 3))
        + encode_request(8, Op.WAIT, wait_fields(["k", "missing"], True, 0))
        + encode_request(0, Op.PING)
        + encode_request(9, Op.DELETE, pack_bytes(b"k"))
    )
    (a, sa, ra), (b, sb, rb), (c, sc, _) = conn.answers()
    assert (a, sa, ra.i64()) == (7, Status.OK, 3)
    assert (b, sb, rb.values()) == (8, Status.TIMEOUT, [b"v", None])
    assert (c, sc) == (9, Status.OK) and "k" not in data.values


def test_a_parked_wait_is_answered_by_another_connections_write(data: KeySpace) -> None:
    waiter, writer = Conn(data), Conn(data)
    waiter.greet()
    writer.greet()
    waiter.call(5, Op.WAIT, wait_fields(["a", "b"], True, None))
    assert waiter.sent == []
    writer.call(1, Op.SET, pack_bytes(b"a"), pack_bytes(b"1"))
    assert waiter.sent == []
    writer.call(2, Op.ADD, add_fields("b", 1))
    ((rid, status, r),) = waiter.answers()
    assert (rid, status, r.values()) == (5, Status.OK, [b"1", b"1"])
    assert not waiter.handler.waits


def test_a_parked_wait_times_out_through_the_clock(data: KeySpace, clock: ManualClock) -> None:
    conn = Conn(data)
    conn.greet()
    conn.call(3, Op.WAIT, wait_fields(["x", "y"], False, 2.0))
    assert [t.delay for t in clock.timers if t.fn is not None] == [2.0]
    clock.fire_all()
    ((rid, status, r),) = conn.answers()
    assert (rid, status, r.values()) == (3, Status.TIMEOUT, [None, None])


def test_store_errors_are_answers_and_the_connection_goes_on(data: KeySpace) -> None:
    conn = Conn(data)
    conn.greet()
    conn.call(1, Op.SET, pack_bytes(b"s"), pack_bytes(b"abc"))
    conn.call(2, Op.ADD, add_fields("s", 1))
    for rid in range(3, 3 + MAX_WAITS_PER_CONNECTION + 1):
        conn.call(rid, Op.WAIT, wait_fields([f"never{rid}"], True, None))
    conn.call(999, Op.PING)
    answers = [(rid, st, r) for rid, st, r in conn.answers()]
    assert [(rid, st) for rid, st, _ in answers] == [
        (1, Status.OK),
        (2, Status.ERROR),
        (3 + MAX_WAITS_PER_CONNECTION, Status.ERROR),
        (999, Status.OK),
    ]
    assert "not an integer" in answers[1][2].str_()
    assert "waits on one connection" in answers[2][2].str_()


def test_closing_fires_owned_leases_and_forgets_waits(data: KeySpace) -> None:
    owner, watcher = Conn(data), Conn(data)
    owner.greet()
    watcher.greet()
    owner.call(0, Op.LEASE, lease_fields("own", 60, "gone", b"owner left", True))
    owner.call(0, Op.LEASE, lease_fields("free", 60, "free-fired", b"x"))
    owner.call(1, Op.WAIT, wait_fields(["never"], True, None))
    watcher.call(2, Op.WAIT, wait_fields(["gone"], True, None))
    owner.sent.clear()
    owner.handler.close()
    owner.handler.close()  # idempotent
    ((rid, status, r),) = watcher.answers()
    assert (rid, status, r.values()) == (2, Status.OK, [b"owner left"])
    assert "free-fired" not in data.values and "free" in data.leases  # not owned: still pending
    assert data.waiters.keys() == set() and owner.sent == []
    with pytest.raises(ProtocolError, match="closed"):
        owner.call(3, Op.PING)


def test_a_request_must_follow_the_handshake(data: KeySpace) -> None:
    conn = Conn(data)
    with pytest.raises(ProtocolError, match="bad handshake"):
        conn.handler.feed(LEN.pack(5) + b"\x00\x00\x00\x01\x06")
