"""Fixtures: the loopback server in its own process, and torch TCPStore clients of it."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.paths import REPO


@dataclass
class ServerProcess:
    proc: subprocess.Popen[str]
    port: int
    stderr: Path

    def dropped(self) -> list[str]:
        """The reasons of the connections it dropped so far."""
        lines = self.stderr.read_text().splitlines()
        return [line.removeprefix("DROPPED ") for line in lines if line.startswith("DROPPED ")]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS line")


# XRUN_TORCHSTORE_REFERENCE=1 runs the same tests against torch's own server (libuv), to check
# that they assert what torch does (the tests about dropped connections then fail: torch's
# server does not report them).
_REFERENCE = (
    "import sys, torch.distributed as d\n"
    "s = d.TCPStore('127.0.0.1', 0, is_master=True, wait_for_workers=False)\n"
    "print('PORT', s.port, flush=True)\n"
    "sys.stdin.read()\n"
)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    stderr = tmp_path / "server.stderr"
    reference = os.environ.get("XRUN_TORCHSTORE_REFERENCE") == "1"
    argv = ["-c", _REFERENCE] if reference else ["-m", "tests.runtime.torchstore.loopback"]
    with stderr.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, *argv],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    assert proc.stdout is not None and proc.stdin is not None
    line = proc.stdout.readline()
    assert line.startswith("PORT "), f"the loopback server did not start: {line!r}"
    yield ServerProcess(proc, int(line.split()[1]), stderr)
    proc.stdin.close()  # it exits when its stdin closes
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture
def connect(server: ServerProcess) -> Callable[..., Any]:
    """``connect(**kwargs)``: a real ``torch.distributed.TCPStore(is_master=False)`` client."""
    import torch.distributed as dist

    def make(timeout: float = 10.0, **kwargs: Any) -> Any:
        return dist.TCPStore(
            "127.0.0.1",
            server.port,
            is_master=False,
            timeout=datetime.timedelta(seconds=timeout),
            **kwargs,
        )

    return make
