"""xrun's real store server in a process of its own, for the tests that drive torch's client.

``python -m tests.runtime.store.torch_server`` starts a ``StoreServer`` on a free loopback port
(token ``TOKEN``, workers' generation key ``WORKERS_KEY``, a seeded rendezvous key
``SECRET_KEY``), prints ``PORT <n>`` and serves until its stdin closes. The store logs at debug
level to stderr, so a test reads why a connection was dropped ("store: dropping ...").

Its own process because some of torch's binding calls (queue_len, list_keys ...) block on the
socket holding the GIL, which would freeze a server thread in the client's process.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

TOKEN = b"the-agents-secret"
WORKERS_KEY = "job/rdzv/workers"
SECRET_KEY = "job/rdzv/0/node/1"


def main() -> None:
    logging.basicConfig(level=logging.DEBUG, stream=sys.stderr, format="%(message)s")
    from xrun.runtime.store import StoreServer

    server = StoreServer(
        "127.0.0.1",
        0,
        TOKEN,
        workers_key=WORKERS_KEY,
        seed={SECRET_KEY: b"agent-only", WORKERS_KEY: b"0"},
    )
    print(f"PORT {server.port}", flush=True)
    sys.stdin.read()  # the test closes our stdin (or dies): stop
    server.stop()
    os._exit(0)


if __name__ == "__main__":
    threading.current_thread().name = "torch-server-main"
    main()
