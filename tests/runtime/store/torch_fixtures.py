"""The torch tests' server process (``torch_server.py``: xrun's real store in a process of its
own) and how to start one; conftest.py makes fixtures of them."""

from __future__ import annotations

import contextlib
import datetime
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.helpers.paths import REPO


@dataclass
class ServerProcess:
    proc: subprocess.Popen[str]
    port: int
    stderr: Path

    def dropped(self) -> list[str]:
        """The reasons of the connections it dropped so far."""
        out = []
        for line in self.stderr.read_text().splitlines():
            for prefix in _DROPPED:
                if line.startswith(prefix):
                    out.append(line.removeprefix(prefix))
        return out

    def alive(self) -> bool:
        return self.proc.poll() is None

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS line")


_DROPPED = ("store: dropping a client: ",)

# XRUN_TORCHSTORE_REFERENCE=1 runs the same tests against torch's own server (libuv), to check
# that they assert what torch does (the tests about dropped connections then fail: torch's
# server does not report them).
_REFERENCE = (
    "import sys, torch.distributed as d\n"
    "s = d.TCPStore('127.0.0.1', 0, is_master=True, wait_for_workers=False)\n"
    "print('PORT', s.port, flush=True)\n"
    "sys.stdin.read()\n"
)


@contextlib.contextmanager
def server_process(tmp_path: Path) -> Iterator[ServerProcess]:
    """xrun's store in a process of its own (torch's with XRUN_TORCHSTORE_REFERENCE=1)."""
    stderr = tmp_path / "server.stderr"
    reference = os.environ.get("XRUN_TORCHSTORE_REFERENCE") == "1"
    argv = ["-c", _REFERENCE] if reference else ["-m", "tests.runtime.store.torch_server"]
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
    assert line.startswith("PORT "), f"the store server did not start: {line!r}"
    try:
        yield ServerProcess(proc, int(line.split()[1]), stderr)
    finally:
        proc.stdin.close()  # it exits when its stdin closes
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def torch_connect(port: int) -> Callable[..., Any]:
    """``connect(**kwargs)``: a real ``torch.distributed.TCPStore(is_master=False)`` client of
    the store at ``port``."""
    import torch.distributed as dist

    def make(timeout: float = 10.0, **kwargs: Any) -> Any:
        return dist.TCPStore(
            "127.0.0.1",
            port,
            is_master=False,
            timeout=datetime.timedelta(seconds=timeout),
            **kwargs,
        )

    return make
