"""torch's real TCPStore client against xrun's store: the queries that wait on the
server (WAIT, and GET/MULTI_GET/QUEUE_POP/BARRIER built on it), their timeouts and the
CANCEL_WAIT that follows one."""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch.distributed as dist

from tests.runtime.store.torch_fixtures import ServerProcess

SHORT = datetime.timedelta(milliseconds=300)


@contextmanager
def later(delay: float, action: Callable[[], object]) -> Iterator[None]:
    """Run ``action`` on a thread after ``delay`` seconds (the calls that wait on the server
    release the GIL in torch's binding, so a second client may act meanwhile)."""
    timer = threading.Timer(delay, action)
    timer.start()
    try:
        yield
    finally:
        timer.join()


def test_wait_returns_at_once_when_keys_exist(connect: Callable[..., Any]) -> None:
    store = connect()
    store.set("a", "1")
    store.wait(["a"])
    store.wait(["a"], SHORT)
    store.wait([])


def test_wait_blocks_until_every_key_is_set(connect: Callable[..., Any]) -> None:
    waiter, writer = connect(), connect()
    start = time.monotonic()

    def write() -> None:
        writer.set("x", "1")
        time.sleep(0.2)
        writer.add("y", 1)

    with later(0.2, write):
        waiter.wait(["x", "y"])
    assert time.monotonic() - start >= 0.35
    assert waiter.get("y") == b"1"


def test_wait_timeout_raises_and_the_connection_stays_usable(
    tserver: ServerProcess, connect: Callable[..., Any]
) -> None:
    store = connect()
    with pytest.raises(dist.DistStoreError, match="wait timeout after 300ms"):
        store.wait(["absent"], SHORT)
    store.set("after", "ok")  # the CANCEL_WAIT was answered: the stream is in step again
    assert store.get("after") == b"ok"
    store.set("absent", "late")  # the cancelled wait must not answer now
    assert store.get("absent") == b"late"
    assert tserver.dropped() == []


def test_wait_uses_the_stores_timeout_by_default(connect: Callable[..., Any]) -> None:
    store = connect()
    store.set_timeout(SHORT)
    with pytest.raises(dist.DistStoreError, match="wait timeout"):
        store.wait(["absent"])


def test_get_of_a_missing_key_waits_for_it(connect: Callable[..., Any]) -> None:
    reader, writer = connect(), connect()
    with later(0.2, lambda: writer.set("late", "L")):
        assert reader.get("late") == b"L"


def test_get_of_a_missing_key_times_out(connect: Callable[..., Any]) -> None:
    store = connect(timeout=0.3)
    with pytest.raises(dist.DistStoreError, match="timeout"):
        store.get("never")
    store.set("never", "now")
    assert store.get("never") == b"now"


def test_multi_get_waits_for_all_keys(connect: Callable[..., Any]) -> None:
    reader, writer = connect(), connect()
    writer.set("m1", "a")
    with later(0.2, lambda: writer.multi_set(["m2"], ["b"])):
        assert reader.multi_get(["m1", "m2"]) == [b"a", b"b"]


def test_blocking_queue_pop_waits_for_a_push(connect: Callable[..., Any]) -> None:
    popper, pusher = connect(), connect()
    with later(0.2, lambda: pusher.queue_push("q", "item")):
        assert popper.queue_pop("q") == b"item"
    assert popper.queue_len("q") == 0


def test_one_push_wakes_one_blocked_popper(connect: Callable[..., Any]) -> None:
    first, second, pusher = connect(timeout=1.5), connect(timeout=1.5), connect()
    results: dict[str, object] = {}

    def pop(name: str, store: Any) -> None:
        try:
            results[name] = store.queue_pop("jobs")
        except dist.DistStoreError as e:
            results[name] = e

    threads = [threading.Thread(target=pop, args=p) for p in (("a", first), ("b", second))]
    for t in threads:
        t.start()
    time.sleep(0.5)  # both WAITs are parked before the push
    pusher.queue_push("jobs", "only")
    for t in threads:
        t.join(10)
    assert sorted(map(type, results.values()), key=str) == sorted(
        [bytes, dist.DistStoreError], key=str
    ), results
    assert b"only" in results.values()


def test_barrier_of_one_returns_at_once(connect: Callable[..., Any]) -> None:
    store = connect()
    store.barrier("b", 1)
    assert store.get("b") == b"1"  # the arrival count, kept as ADD keeps it


def test_barrier_releases_everyone_when_the_last_arrives(connect: Callable[..., Any]) -> None:
    clients = [connect() for _ in range(3)]
    done: list[int] = []

    def arrive(i: int) -> None:
        clients[i].barrier("gate", 3, datetime.timedelta(seconds=10))
        done.append(i)

    threads = [threading.Thread(target=arrive, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    assert done == []
    arrive(2)
    for t in threads:
        t.join(10)
    assert sorted(done) == [0, 1, 2]


def test_barrier_timeout_raises_and_the_connection_stays_usable(
    tserver: ServerProcess, connect: Callable[..., Any]
) -> None:
    store, other = connect(), connect()
    with pytest.raises(dist.DistStoreError, match="barrier timeout"):
        store.barrier("b2", 2, SHORT)
    store.set("after", "ok")
    assert store.get("after") == b"ok"
    other.barrier("b2", 2)  # torch keeps the timed-out arrival's count: this one completes it
    assert tserver.dropped() == []
