"""Helpers of the rendezvous tests: fast timeouts, handlers side by side, a node in a subprocess."""

from __future__ import annotations

import json
import select
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from xrun.runtime.rendezvous import Endpoint, RendezvousEvent, RendezvousHandler, RendezvousInfo

FAST = {
    "join_timeout": "10",
    "last_call_timeout": "0.3",
    "heartbeat_interval": "0.1",
    "heartbeat_timeout": "0.6",
    "close_timeout": "2",
    "read_timeout": "5",
}

Factory = Callable[..., RendezvousHandler]


def rendezvous_all(handlers: list[RendezvousHandler]) -> list[RendezvousInfo]:
    with ThreadPoolExecutor(len(handlers)) as ex:
        return list(ex.map(lambda h: h.next_rendezvous(), handlers))


def wait_event(h: RendezvousHandler, timeout: float) -> tuple[RendezvousEvent, str] | None:
    """What the agent does: select() on fileno(), then poll_event()."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        if select.select([h.fileno()], [], [], left)[0]:
            ev = h.poll_event()
            if ev is not None:
                return ev
    return None


NODE_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    from xrun.runtime.rendezvous import Endpoint, RendezvousParams, create_handler
    ep, run_id, nodes, addr, conf = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], json.loads(sys.argv[5])
    lo, hi = map(int, nodes.split(":"))
    h = create_handler(RendezvousParams("c10d", Endpoint.parse(ep), run_id, lo, hi, 2, conf, local_addr=addr))
    info = h.next_rendezvous()
    print(json.dumps({"rank": info.group_rank, "size": info.group_world_size,
                      "addrs": info.addrs, "round": info.round}), flush=True)
    if "--linger" in sys.argv:
        time.sleep(60)
    h.finish(5)
    h.shutdown()
    """
)


def spawn_node(
    endpoint: Endpoint,
    run_id: str,
    nodes: str,
    addr: str,
    *extra: str,
    conf: dict[str, str] | None = None,
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            NODE_SCRIPT,
            str(endpoint),
            run_id,
            nodes,
            addr,
            json.dumps(conf or FAST),
            *extra,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
