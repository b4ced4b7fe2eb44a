"""An xrun store served by a process of its own, for tests that SIGSTOP it (a store host that
hangs: the kernel still accepts connections and buffers requests, nobody answers)."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager


@contextmanager
def store_process(
    seed: Mapping[str, bytes] | None = None,
) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """(the serving process, its port); ``seed``: keys the store holds from the start."""
    code = (
        "import time\n"
        "from xrun.runtime.store.server import StoreServer\n"
        f"s = StoreServer('127.0.0.1', 0, seed={dict(seed or {})!r})\n"
        "print(s.port, flush=True)\n"
        "time.sleep(900)\n"
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None
        yield p, int(p.stdout.readline())
    finally:
        p.send_signal(signal.SIGCONT)
        p.kill()
        p.wait()
