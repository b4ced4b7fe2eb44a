"""torch's real TCPStore client (is_master=False) against xrun's store: every
non-blocking query type, with the answers torch's own server gives (recorded from torch 2.13)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch.distributed as dist

from tests.runtime.store.torch_fixtures import ServerProcess


def test_handshake_validates_and_pings(tserver: ServerProcess, connect: Callable[..., Any]) -> None:
    store = connect()  # VALIDATE + PING: the constructor fails unless the nonce comes back
    assert store.port == tserver.port
    assert store.num_keys() == 0
    assert tserver.dropped() == []


def test_set_get_binary_and_empty_values(connect: Callable[..., Any]) -> None:
    store = connect()
    store.set("k", "v1")
    assert store.get("k") == b"v1"
    store.set("k", b"\x00\xff\x01")
    assert store.get("k") == b"\x00\xff\x01"
    store.set("empty", "")
    assert store.get("empty") == b""
    big = bytes(range(256)) * 4096  # 1 MiB: torch's client sends it in 1,440-byte pieces
    store.set("big", big)
    assert store.get("big") == big


def test_keys_are_shared_between_clients(connect: Callable[..., Any]) -> None:
    a, b = connect(), connect()
    a.set("shared", "x")
    assert b.get("shared") == b"x"


def test_add_counts_in_ascii_decimal(connect: Callable[..., Any]) -> None:
    store = connect()
    assert store.add("n", 5) == 5
    assert store.add("n", -2) == 3
    assert store.add("n", 0) == 3
    assert store.get("n") == b"3"
    store.set("m", "41")
    assert store.add("m", 1) == 42


def test_add_to_a_non_integer_drops_only_that_connection(
    tserver: ServerProcess, connect: Callable[..., Any]
) -> None:
    bad, good = connect(), connect()
    bad.set("text", "abc")
    with pytest.raises(dist.DistNetworkError):
        bad.add("text", 1)
    assert any("not an integer" in reason for reason in tserver.dropped())
    good.set("still", "serving")
    assert good.get("still") == b"serving"


def test_compare_set_follows_torchs_rules(connect: Callable[..., Any]) -> None:
    store = connect()
    store.set("k", "v1")
    assert store.compare_set("k", "v1", "v2") == b"v2"  # match: swapped
    assert store.compare_set("k", "zz", "v3") == b"v2"  # mismatch: the current value
    assert store.get("k") == b"v2"
    assert store.compare_set("c", "", "new") == b"new"  # missing + empty expected: created
    assert store.get("c") == b"new"
    assert store.compare_set("d", "x", "y") == b"x"  # missing + expected: torch echoes it
    assert not store.check(["d"])


def test_check(connect: Callable[..., Any]) -> None:
    store = connect()
    store.set("k", "1")
    assert store.check(["k"])
    assert not store.check(["k", "nope"])
    assert store.check([])
    store.queue_push("q", "x")  # a non-empty queue counts as present
    assert store.check(["q"])


def test_num_keys_and_delete_key(connect: Callable[..., Any]) -> None:
    store = connect()
    store.set("a", "1")
    store.set("b", "2")
    assert store.num_keys() == 2
    assert store.delete_key("a") is True
    assert store.delete_key("a") is False
    assert store.num_keys() == 1
    store.queue_push("q", "x")  # queues are not keys
    assert store.num_keys() == 1


def test_append(connect: Callable[..., Any]) -> None:
    store = connect()
    store.set("k", "ab")
    store.append("k", "cd")
    assert store.get("k") == b"abcd"
    store.append("fresh", "xy")
    assert store.get("fresh") == b"xy"


def test_multi_set_and_multi_get(connect: Callable[..., Any]) -> None:
    store = connect()
    store.multi_set(["m1", "m2", "m3"], ["x", "yy", ""])
    assert store.multi_get(["m2", "m1", "m3"]) == [b"yy", b"x", b""]
    assert store.multi_get([]) == []


def test_queue_push_len_pop(connect: Callable[..., Any]) -> None:
    store = connect()
    assert store.queue_len("q") == 0
    store.queue_push("q", "first")
    store.queue_push("q", b"\x00second")
    assert store.queue_len("q") == 2
    assert store.queue_pop("q") == b"first"
    assert store.queue_pop("q", False) == b"\x00second"
    with pytest.raises(dist.QueueEmptyError):
        store.queue_pop("q", False)
    assert store.queue_len("q") == 0


def test_list_keys_strips_the_clients_prefix(connect: Callable[..., Any]) -> None:
    store = connect()
    store.set("a", "1")
    store.add("b", 1)
    store.queue_push("q", "x")
    assert sorted(store.list_keys()) == ["a", "b"]


def test_world_size_client_registers_under_init_key(connect: Callable[..., Any]) -> None:
    # A client given world_size (and wait_for_workers) ADDs 1 to "init/" - torch's only key
    # without the client's "/" prefix; list_keys hides it, num_keys counts it.
    first = connect(world_size=2)
    connect(world_size=2)
    assert first.num_keys() == 1
    assert first.list_keys() == []


def test_prefix_store_and_clone(connect: Callable[..., Any]) -> None:
    store = connect()
    prefixed = dist.PrefixStore("job/0", store)
    prefixed.set("k", "v")
    assert store.get("job/0/k") == b"v"
    twin = store.clone()  # a second connection with the first one's settings
    assert twin.get("job/0/k") == b"v"
    assert twin.add("job/0/n", 2) == 2
