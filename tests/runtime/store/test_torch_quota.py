"""Issue #26: the workers' key space is capped (runtime/store/quota.py): a torch client's write
past the cap is refused (its connection closed, one log line), what is there stays readable,
and freed bytes count again. Real torch TCPStore clients against a real StoreServer, with the
cap lowered to 1 MiB for the test (the real one is 1 GiB: absurd to fill here)."""

from __future__ import annotations

import datetime
import logging
from collections.abc import Iterator

import pytest

from xrun.runtime.store import quota
from xrun.runtime.store.server import StoreServer

CAP = 1 << 20


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[StoreServer]:
    monkeypatch.setattr(quota, "MAX_BYTES", CAP)
    monkeypatch.setattr(quota, "MAX_KEYS", 100)
    s = StoreServer("127.0.0.1", 0)
    yield s
    s.stop()


def client(port: int) -> object:
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=5))


def test_a_write_past_the_cap_is_refused_and_freed_bytes_count_again(
    server: StoreServer, caplog: pytest.LogCaptureFixture
) -> None:
    import torch.distributed as dist

    a = client(server.port)
    a.set("big", b"x" * (CAP // 2 + 1))  # type: ignore[attr-defined]
    with caplog.at_level(logging.WARNING, logger="xrun.runtime.store.quota"):
        with pytest.raises(dist.DistNetworkError):  # SET has no answer: the next call sees it
            a.set("bigger", b"y" * (CAP // 2 + 1))  # type: ignore[attr-defined]
            a.get("big")  # type: ignore[attr-defined]
    assert any("workers' key space is full" in m for m in caplog.messages), caplog.messages
    b = client(server.port)
    assert b.get("big") == b"x" * (CAP // 2 + 1)  # type: ignore[attr-defined]
    assert b.check(["bigger"]) is False  # type: ignore[attr-defined]
    assert b.delete_key("big")  # type: ignore[attr-defined]
    b.set("bigger", b"y" * (CAP // 2 + 1))  # type: ignore[attr-defined]
    assert b.get("bigger") == b"y" * (CAP // 2 + 1)  # type: ignore[attr-defined]


def test_the_number_of_keys_is_capped_too(server: StoreServer) -> None:
    import torch.distributed as dist

    c = client(server.port)
    for i in range(100):
        c.set(f"k{i}", b"v")  # type: ignore[attr-defined]
    with pytest.raises(dist.DistNetworkError):
        c.set("one-more", b"v")  # type: ignore[attr-defined]
        c.num_keys()  # type: ignore[attr-defined]
    assert client(server.port).num_keys() == 100  # type: ignore[attr-defined]
