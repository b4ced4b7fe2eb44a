"""Issue #26: the workers' store admits torch-protocol clients only from the job's user (on
this host) and the job's nodes (elsewhere): runtime/store/guard.py. Real torch TCPStore clients
against a real StoreServer; another user's client runs under setpriv (the suite runs as root)."""

from __future__ import annotations

import datetime
import logging
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from xrun.runtime.store import guard
from xrun.runtime.store.server import StoreServer

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


@pytest.fixture
def server() -> Iterator[StoreServer]:
    s = StoreServer("127.0.0.1", 0)
    yield s
    s.stop()


def torch_client(port: int, host: str = "127.0.0.1") -> object:
    import torch.distributed as dist

    return dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=10))


def test_the_jobs_user_is_admitted_over_ipv4_and_ipv6() -> None:
    for host in ("127.0.0.1", "::1"):
        s = StoreServer(host, 0)
        try:
            c = torch_client(s.port, host)
            c.set("k", b"v")  # type: ignore[attr-defined]
            assert c.get("k") == b"v"  # type: ignore[attr-defined]
        finally:
            s.stop()


def test_another_users_torch_client_is_refused_with_one_log_line(
    server: StoreServer, caplog: pytest.LogCaptureFixture
) -> None:
    code = (
        "import datetime, torch.distributed as d\n"
        f"s = d.TCPStore('127.0.0.1', {server.port}, is_master=False,"
        " timeout=datetime.timedelta(seconds=3))\n"
        "s.set('stolen', b'x')\n"
    )
    with caplog.at_level(logging.WARNING, logger="xrun.runtime.store.guard"):
        # 9 s on a quiet machine (import torch, then the client's retries until its 3 s run
        # out); over 60 s was seen at load ~10.
        r = subprocess.run(
            [*NOBODY, sys.executable, "-c", code], capture_output=True, text=True, timeout=240
        )
    assert r.returncode != 0, r.stderr[-2000:]  # its every connection was closed
    refused = [m for m in caplog.messages if "refused a torch client" in m]
    assert refused and "another user's (uid 65534" in refused[0], caplog.messages
    mine = torch_client(server.port)
    assert mine.num_keys() == 0 or mine.check(["stolen"]) is False  # type: ignore[attr-defined]


class _Peer:
    """A socket's two addresses (a remote host cannot be made on demand on one machine)."""

    family = socket.AF_INET

    def __init__(self, peer: str, local: str = "10.0.0.1") -> None:
        self.peer, self.local = (peer, 40000), (local, 29500)

    def getpeername(self) -> tuple[str, int]:
        return self.peer

    def getsockname(self) -> tuple[str, int]:
        return self.local


def test_another_host_is_admitted_only_where_an_authenticated_agent_connects_from() -> None:
    stranger = _Peer("10.0.0.9")
    assert "no node of this job" in str(guard.refusal(stranger, []))  # type: ignore[arg-type]
    assert "no node of this job" in str(guard.refusal(stranger, ["10.0.0.7"]))  # type: ignore[arg-type]
    assert guard.refusal(stranger, ["10.0.0.7", "::ffff:10.0.0.9"]) is None  # type: ignore[arg-type]


def test_a_time_wait_ghost_on_the_same_ports_is_not_the_owner(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An earlier connection's TIME_WAIT row (uid 0) on the client's very ports is listed
    before the live one: the owner is the live row's uid (a real table cannot be made to hold
    both on demand)."""
    ends = [("127.0.0.1", 40000), ("127.0.0.1", 29500)]
    local, remote = (guard._proc_addr(socket.AF_INET, a, p) for a, p in ends)
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid\n"
    rows = [
        f"   0: {local} {remote} 06 00000000:00000000 03:00000AAA 00000000     0        0 0",
        f"   1: {local} {remote} 01 00000000:00000000 00:00000000 00000000  1000        0 77",
    ]
    tables = {"/proc/net/tcp": header + "\n".join(rows) + "\n", "/proc/net/tcp6": header}
    monkeypatch.setattr(guard, "_read_table", tables.__getitem__)
    assert guard._find_uid(ends) == 1000
