"""Fixtures of the store tests: a server on a free loopback port and a client of it; for the
torch-protocol tests, the store in a process of its own (``tserver``) and torch's real
``TCPStore`` clients of it (``connect``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.runtime.store.torch_fixtures import ServerProcess, server_process, torch_connect
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


@pytest.fixture
def tserver(tmp_path: Path) -> Iterator[ServerProcess]:
    with server_process(tmp_path) as s:
        yield s


@pytest.fixture
def connect(tserver: ServerProcess) -> Callable[..., Any]:
    """``connect(**kwargs)``: a real ``torch.distributed.TCPStore(is_master=False)`` client."""
    return torch_connect(tserver.port)
