"""Fixtures of the store tests: a server on a free loopback port and a client of it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from xrun.runtime.store import StoreClient, StoreServer


@pytest.fixture
def server() -> Iterator[StoreServer]:
    s = StoreServer("127.0.0.1", 0, handshake_timeout=0.5, max_frame=64 * 1024)
    yield s
    s.stop()


@pytest.fixture
def client(server: StoreServer) -> Iterator[StoreClient]:
    c = StoreClient("127.0.0.1", server.port, connect_timeout=5, read_timeout=5)
    yield c
    c.close()
