"""A port thief: a process that keeps binding whatever TCP ports are free, and holds them.

What a busy host does to a launcher that picks a "free" port, releases it and binds it again
later (the rank-0-hosts-the-store design xrun had before issue #14): between the two, anything
else on the host may take the port, and this takes a large share of them on purpose. It binds
``--rate`` fresh ports a second on 0.0.0.0 (``listen``, as a server would), holds each for
``--hold`` seconds, and never holds more than ``--max`` at once, so the host keeps enough
ephemeral ports for outgoing connections.

``python -m benchmarks.port_thief [--rate N] [--hold S] [--max N]``: runs until stdin closes
(or SIGTERM) and then prints ``stolen <n>``: how many ports it held in all.
``Thief()`` runs one as a child process: ``with Thief(): ...``.
"""

from __future__ import annotations

import argparse
import collections
import os
import socket
import subprocess
import sys
import threading
import time


def steal(rate: float, hold: float, max_held: int, stop: threading.Event) -> int:
    """Bind free ports until ``stop`` is set; how many it took."""
    held: collections.deque[tuple[float, socket.socket]] = collections.deque()
    stolen = 0
    batch = max(1, int(rate / 100))  # bind in batches, 100 times a second
    while not stop.is_set():
        now = time.monotonic()
        while held and (held[0][0] < now or len(held) > max_held - batch):
            held.popleft()[1].close()
        for _ in range(batch):
            s = socket.socket()
            try:
                s.bind(("0.0.0.0", 0))
                s.listen(1)
            except OSError:
                s.close()
                break
            held.append((now + hold, s))
            stolen += 1
        stop.wait(0.01)
    for _, s in held:
        s.close()
    return stolen


class Thief:
    """``with Thief(rate, hold): ...`` runs a thief process meanwhile; ``.stolen`` after."""

    def __init__(self, rate: float = 2000, hold: float = 2.0, max_held: int = 4000) -> None:
        self.args = ["--rate", str(rate), "--hold", str(hold), "--max", str(max_held)]
        self.proc: subprocess.Popen[str] | None = None
        self.stolen = 0

    def __enter__(self) -> Thief:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.port_thief", *self.args],
            cwd=root,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "stealing":
            raise RuntimeError("the port thief did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.close()  # the thief stops and reports
        out = self.proc.stdout.read()
        self.proc.wait(timeout=30)
        self.stolen = int(out.split()[-1]) if out.split() else 0


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.port_thief", description=__doc__)
    p.add_argument("--rate", type=float, default=2000, help="ports bound per second")
    p.add_argument("--hold", type=float, default=2.0, help="seconds each port is held")
    p.add_argument("--max", type=int, default=4000, help="most ports held at once")
    ns = p.parse_args()
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    import signal

    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print("stealing", flush=True)
    print(f"stolen {steal(ns.rate, ns.hold, ns.max, stop)}", flush=True)


if __name__ == "__main__":
    main()
