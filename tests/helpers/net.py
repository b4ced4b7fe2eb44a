"""Ports for tests, and reading from a raw socket."""

from __future__ import annotations

import random
import socket

# Picked from below the kernel's ephemeral range (32768-60999 by default), and below torch's
# default ports (29400, 29500) that some tests use as they are: a port from the ephemeral range
# that is free now can be taken, before the test binds it, as the local port of any outgoing
# connection on the machine (that made test_two_agents_over_ipv6 flaky, see issue #17).
_LOW, _HIGH = 20_000, 29_000


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (IPv6 when ``host`` has a colon)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for _ in range(100):
        port = random.randrange(_LOW, _HIGH)
        with socket.socket(family) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(family) as s:  # a crowded range: let the kernel pick one
        s.bind((host, 0))
        return int(s.getsockname()[1])


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    """``n`` bytes from ``sock``; fails the test if the peer closes first."""
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        assert chunk, f"connection closed after {len(out)} of {n} bytes"
        out += chunk
    return out
