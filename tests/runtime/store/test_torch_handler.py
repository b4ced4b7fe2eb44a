"""The handler alone, over a WorkersKeySpace, without sockets: answers, parked waits, barriers,
cancellation, and what a connection's end leaves behind."""

from __future__ import annotations

import pytest

from xrun.runtime.store.torch_data import WorkersKeySpace
from xrun.runtime.store.torch_handler import TorchHandler, TorchService
from xrun.runtime.store.torch_protocol import (
    HANDSHAKE_PREFIX,
    STOP_WAITING,
    WAIT_CANCELED,
    Add,
    Barrier,
    CancelWait,
    Get,
    MultiGet,
    Ping,
    ProtocolError,
    QueuePop,
    QueuePush,
    Request,
    Set,
    Wait,
    encode_bytes,
    encode_int,
    encode_multi_get,
    encode_nonce,
    encode_queue_pop,
    encode_request,
)


class Conn:
    """A session and everything it sent, one entry per send() call."""

    def __init__(self, service: TorchService) -> None:
        self.sent: list[bytes] = []
        self.session: TorchHandler = service.handler(self.sent.append)
        self.session.feed(HANDSHAKE_PREFIX)

    def feed(self, *requests: Request) -> None:
        self.session.feed(b"".join(encode_request(r) for r in requests))


@pytest.fixture
def service() -> TorchService:
    return TorchService(WorkersKeySpace())


def space_of(service: TorchService) -> WorkersKeySpace:
    assert isinstance(service.space, WorkersKeySpace)
    return service.space


def test_one_feed_sends_its_answers_in_order(service: TorchService) -> None:
    # One send() per answer: the connection (session.Session) joins one read's answers into
    # one write (tests/runtime/store/test_session.py).
    conn = Conn(service)
    assert conn.sent == []  # VALIDATE has no answer
    conn.feed(Ping(5), Set("k", b"v"), Get("k"), Add("n", 2), Get("missing"))
    assert conn.sent == [encode_nonce(5), encode_bytes(b"v"), encode_int(2), encode_bytes(b"")]


def test_answers_before_a_bad_request_still_go_out(service: TorchService) -> None:
    conn = Conn(service)
    with pytest.raises(ProtocolError, match="unknown query type 99"):
        conn.session.feed(encode_request(Ping(1)) + b"\x63")
    assert conn.sent == [encode_nonce(1)]


def test_a_wait_is_answered_by_the_write_that_completes_it(service: TorchService) -> None:
    waiter, writer = Conn(service), Conn(service)
    waiter.feed(Wait(("a", "b")))
    assert waiter.sent == [] and waiter.session.waiting
    writer.feed(Set("a", b"1"))
    assert waiter.sent == []
    writer.feed(Add("b", 1))
    assert waiter.sent == [STOP_WAITING]
    assert not waiter.session.waiting


def test_a_deleted_key_no_longer_counts(service: TorchService) -> None:
    space = space_of(service)
    waiter, writer = Conn(service), Conn(service)
    waiter.feed(Wait(("a", "b")))
    writer.feed(Set("a", b"1"))
    space.delete("a")
    writer.feed(Set("b", b"1"))
    assert waiter.sent == []  # torch would answer here (it counts writes, not presence)
    writer.feed(Set("a", b"2"))
    assert waiter.sent == [STOP_WAITING]


def test_cancel_forgets_the_wait(service: TorchService) -> None:
    waiter, writer = Conn(service), Conn(service)
    waiter.feed(Wait(("k",)))
    waiter.feed(CancelWait())
    assert waiter.sent == [WAIT_CANCELED]
    writer.feed(Set("k", b"1"))
    assert waiter.sent == [WAIT_CANCELED]
    assert space_of(service).parked == 0


def test_close_forgets_the_wait_and_sends_nothing(service: TorchService) -> None:
    waiter, writer = Conn(service), Conn(service)
    waiter.feed(Wait(("k",)))
    waiter.session.close()
    waiter.session.close()  # idempotent
    writer.feed(Set("k", b"1"))
    assert waiter.sent == []
    with pytest.raises(ProtocolError, match="closed"):
        waiter.session.handle(Ping(1))


def test_multi_get_of_missing_keys_answers_empty_values(service: TorchService) -> None:
    conn = Conn(service)
    conn.feed(Set("a", b"x"), MultiGet(("a", "nope")))
    assert conn.sent == [encode_multi_get([b"x", b""])]


def test_a_push_wakes_one_blocked_popper(service: TorchService) -> None:
    first, second, pusher = Conn(service), Conn(service), Conn(service)
    first.feed(Wait(("q",)))
    second.feed(Wait(("q",)))
    pusher.feed(QueuePush("q", b"item"))
    assert (first.sent, second.sent) == ([STOP_WAITING], [])
    first.feed(QueuePop("q"))
    assert first.sent[-1] == encode_queue_pop(b"item")
    pusher.feed(QueuePush("q", b"next"))
    assert second.sent == [STOP_WAITING]


def test_barrier_releases_all_when_the_count_is_reached(service: TorchService) -> None:
    a, b, c = Conn(service), Conn(service), Conn(service)
    a.feed(Barrier("gate", 3))
    b.feed(Barrier("gate", 3))
    assert (a.sent, b.sent) == ([], [])
    c.feed(Barrier("gate", 3))
    assert (a.sent, b.sent, c.sent) == ([STOP_WAITING], [STOP_WAITING], [STOP_WAITING])
    assert service.space.get("gate") == b"3"
    Conn(service).feed(Barrier("gate", 3))  # a late arrival passes at once, as in torch


def test_a_cancelled_barrier_keeps_its_count(service: TorchService) -> None:
    a, b = Conn(service), Conn(service)
    a.feed(Barrier("gate", 2))
    a.feed(CancelWait())
    assert a.sent == [WAIT_CANCELED]
    b.feed(Barrier("gate", 2))
    assert b.sent == [STOP_WAITING]
    assert a.sent == [WAIT_CANCELED]


def test_a_closed_connection_leaves_its_barrier(service: TorchService) -> None:
    a = Conn(service)
    a.feed(Barrier("gate", 3))
    a.session.close()
    assert service._barriers == {}


def test_add_overflow_and_non_integers_drop_the_connection(service: TorchService) -> None:
    conn = Conn(service)
    conn.feed(Add("n", (1 << 63) - 1))
    with pytest.raises(ProtocolError, match="overflows a 64-bit integer"):
        conn.feed(Add("n", 1))
    conn = Conn(service)
    conn.feed(Set("t", b"abc"))
    with pytest.raises(ProtocolError, match="'t', whose value is not an integer"):
        conn.feed(Add("t", 1))


def test_a_second_wait_on_one_connection_is_a_protocol_error(service: TorchService) -> None:
    conn = Conn(service)
    conn.feed(Wait(("a",)))
    with pytest.raises(ProtocolError, match="BARRIER while another wait is parked"):
        conn.feed(Barrier("b", 2))
