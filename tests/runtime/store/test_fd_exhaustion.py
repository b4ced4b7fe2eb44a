"""Out of file descriptors (EMFILE): the store stops accepting for a moment, keeps serving the
connections it has, and takes the waiting ones once descriptors free up. It never dies."""

from __future__ import annotations

import select
import socket
import struct
import subprocess
import sys
import time

import pytest

from tests.helpers.paths import REPO
from xrun.runtime.store.torch_protocol import HANDSHAKE_PREFIX, Ping, encode_request

# The store in a process whose open-files limit is tiny (soft = hard, so the server's own
# attempt to raise it gets nowhere).
# As in an agent, ``logging`` is not loaded until the store has something to report, here
# when it is out of descriptors (importing it then may fail: the store must not care).
SERVER = """
import resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (@, @))
from xrun.runtime.store import StoreServer
s = StoreServer("127.0.0.1", 0)
print("PORT", s.port, flush=True)
sys.stdin.readline()
print("RUNNING" if s.running else "DEAD", flush=True)
"""
LIMIT = 32


def ping(sock: socket.socket, nonce: int, send: bool = True) -> bytes:
    if send:
        sock.sendall(encode_request(Ping(nonce)))
    out = b""
    while len(out) < 4:
        chunk = sock.recv(4 - len(out))
        assert chunk, "closed"
        out += chunk
    return out


@pytest.mark.timeout(60)
def test_emfile_does_not_kill_the_store(tmp_path: object) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER.replace("@", str(LIMIT))],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdin is not None
    try:
        port = int(proc.stdout.readline().split()[1])
        # Workers connect after the agent's rendezvous and their torch import: by then the
        # store has loaded torch's protocol (0.2 s after it starts), which takes descriptors.
        time.sleep(0.5)
        conns = []
        for _ in range(3 * LIMIT):  # far more than it has descriptors for
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(HANDSHAKE_PREFIX)
            conns.append(s)
        early, late = conns[:5], conns[-5:]
        for i, s in enumerate(early):  # accepted before the limit: served all along
            assert ping(s, i) == struct.pack("<I", i)
        for i, s in enumerate(late):
            s.sendall(encode_request(Ping(100 + i)))
        # the late ones wait in the listen backlog: no descriptor to accept them with
        assert select.select(late, [], [], 1.0)[0] == []
        for s in conns[5:-5]:
            s.close()  # descriptors free up
        for i, s in enumerate(late):  # now accepted and served
            assert ping(s, 100 + i, send=False) == struct.pack("<I", 100 + i)
        for s in early + late:
            s.close()
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "RUNNING"
    finally:
        proc.kill()
        _, err = proc.communicate(timeout=10)
    assert "Traceback" not in err and "OverflowError" not in err
