"""Rendezvous scaling: seconds until N agents (threads in one process) all hold a world.

``run(n)`` measures xrun's c10d rendezvous (one store + n handlers, min = max = n);
``run_torch(n, timeout)`` measures torch's dynamic rendezvous on its c10d backend the same way
(torch is imported only there); ``run_etcd(n)`` xrun's etcd rendezvous against a running etcd. ``python benchmarks/rdzv.py`` prints both tables.

The clock starts before the handlers are created (so it includes connecting and authenticating)
and stops when the last ``next_rendezvous`` returns.
"""

from __future__ import annotations

import os
import resource
import sys
import threading
import time
import uuid
from typing import Any


def _raise_fd_limit(n_agents: int) -> None:
    # Each agent holds one socket, and the in-process store holds the other end.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, 4 * n_agents + 256))
    if want > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def _run_threads(n: int, join: Any, timeout: float) -> float:
    """Start ``n`` threads calling ``join(i)``; seconds until all returned (raise on error)."""
    errors: list[BaseException] = []
    go = threading.Event()

    def body(i: int) -> None:
        go.wait()
        try:
            join(i)
        except BaseException as e:  # reported to the caller below
            errors.append(e)

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    t0 = time.perf_counter()
    go.set()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    elapsed = time.perf_counter() - t0
    if any(t.is_alive() for t in threads):
        raise TimeoutError(f"{n} agents did not rendezvous within {timeout:g}s")
    if errors:
        raise errors[0]
    return elapsed


def run(n_agents: int, timeout: float = 120.0, token: bytes | None = None) -> float:
    """xrun: one store + ``n_agents`` handlers as threads; seconds until all have a world.
    With ``token`` the store checks every agent's HMAC (the agents read it from a 0600 file,
    conf ``token_file``, as from a scheduler)."""
    import tempfile

    from xrun.runtime.rendezvous import Endpoint, RendezvousParams, create_handler
    from xrun.runtime.store import StoreServer

    _raise_fd_limit(n_agents)
    server = StoreServer("127.0.0.1", 0, token)
    conf = {"join_timeout": str(timeout), "is_host": "false"}
    token_dir = tempfile.TemporaryDirectory(prefix="xrun-bench-")
    if token is not None:
        path = os.path.join(token_dir.name, "token")
        with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
            f.write(token)
        conf["token_file"] = path
    endpoint = Endpoint("127.0.0.1", server.port)
    run_id = uuid.uuid4().hex[:8]
    handlers: list[Any] = [None] * n_agents

    def join(i: int) -> None:
        params = RendezvousParams(
            backend="c10d",
            endpoint=endpoint,
            run_id=run_id,
            min_nodes=n_agents,
            max_nodes=n_agents,
            local_world_size=8,
            conf=conf,
            local_addr=f"node{i:05d}",
        )
        handlers[i] = h = create_handler(params)
        info = h.next_rendezvous()
        assert info.group_world_size == n_agents

    try:
        return _run_threads(n_agents, join, timeout)
    finally:
        for h in handlers:
            if h is not None:
                h.finish(0)
                h.shutdown()
        server.stop()
        token_dir.cleanup()


def run_etcd(n_agents: int, timeout: float = 120.0, endpoint: str = "127.0.0.1:2379") -> float:
    """xrun's etcd rendezvous: ``n_agents`` handlers as threads against the etcd at
    ``endpoint`` (scripts/etcd-server.sh); seconds until all have a world, as ``run``. Each
    handler also starts the workers' store it would serve as group rank 0: part of the cost."""
    from xrun.runtime.rendezvous import Endpoint, RendezvousParams, create_handler

    _raise_fd_limit(2 * n_agents)
    run_id = uuid.uuid4().hex[:8]
    where = Endpoint.parse(endpoint, 2379)
    handlers: list[Any] = [None] * n_agents

    def join(i: int) -> None:
        params = RendezvousParams(
            backend="etcd-v2",
            endpoint=where,
            run_id=run_id,
            min_nodes=n_agents,
            max_nodes=n_agents,
            local_world_size=8,
            conf={"join_timeout": str(timeout), "close_timeout": "2"},
            local_addr="127.0.0.1",  # each agent's workers' store binds it
        )
        handlers[i] = h = create_handler(params)
        info = h.next_rendezvous()
        assert info.group_world_size == n_agents

    try:
        return _run_threads(n_agents, join, timeout)
    finally:
        for h in handlers:
            if h is not None:
                h.close(False, "benchmark over")  # the verdict expires: no exit barrier wait
                h.shutdown()


def run_torch(n_agents: int, timeout: float = 60.0) -> float:
    """torch's dynamic rendezvous (c10d backend, TCPStore), min = max = n, same measurement.

    Runs in a child process (torch is imported there only): a rendezvous that does not finish
    leaves C++ threads behind that no timeout can stop, so the child is killed instead. Raises
    TimeoutError when it does not finish within ``timeout`` s (torch import time excluded).
    """
    import subprocess

    cmd = [sys.executable, os.path.abspath(__file__), "--torch-child", str(n_agents), str(timeout)]
    try:
        out = subprocess.run(
            # + room for importing torch; under the 30 s grace a caller (benchmarks/scale.py)
            # gives this process, so that this child is never orphaned
            cmd,
            capture_output=True,
            text=True,
            timeout=timeout + 25,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise TimeoutError(
            f"torch: {n_agents} agents did not rendezvous within {timeout:g}s"
        ) from None
    lines = out.stdout.split()
    if out.returncode != 0 or not lines:
        if "did not rendezvous" in out.stderr:
            raise TimeoutError(f"torch: {n_agents} agents did not rendezvous within {timeout:g}s")
        raise RuntimeError(f"torch benchmark child failed ({out.returncode}): {out.stderr[-2000:]}")
    return float(lines[-1])


def _torch_child(n_agents: int, timeout: float) -> float:
    from datetime import timedelta

    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        DynamicRendezvousHandler,
        RendezvousTimeout,
    )

    _raise_fd_limit(n_agents)
    master = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv=True)
    run_id = uuid.uuid4().hex[:8]

    def join(i: int) -> None:
        store = TCPStore(
            "127.0.0.1", master.port, is_master=False, timeout=timedelta(seconds=timeout)
        )
        backend = C10dRendezvousBackend(store, run_id)
        handler = DynamicRendezvousHandler.from_backend(
            run_id=run_id,
            store=store,
            backend=backend,
            min_nodes=n_agents,
            max_nodes=n_agents,
            # torch's rank 0 serves the workers' store at its local_addr: it must resolve.
            local_addr="127.0.0.1",
            timeout=RendezvousTimeout(join=timedelta(seconds=timeout)),
        )
        handler.next_rendezvous()

    return _run_threads(n_agents, join, timeout)


def main(argv: list[str]) -> None:
    print("backend  agents  seconds")
    for n in (8, 64, 256, 1024):
        print(f"xrun     {n:6d}  {run(n):7.3f}", flush=True)
    # the same with the job's secret checked on every connection (HMAC challenge-response)
    print(f"xrun+tok {1024:6d}  {run(1024, token=os.urandom(32).hex().encode()):7.3f}", flush=True)
    if "--no-torch" in argv:
        return
    for n in (8, 32):
        try:
            secs = f"{run_torch(n):7.3f}"
        except TimeoutError as e:
            secs = f"timeout ({e})"
        print(f"torch    {n:6d}  {secs}", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--torch-child"]:
        try:
            print(f"{_torch_child(int(sys.argv[2]), float(sys.argv[3])):.6f}", flush=True)
        except TimeoutError as e:
            print(e, file=sys.stderr, flush=True)
            os._exit(3)  # torch's stuck threads would hang a normal exit
        os._exit(0)
    main(sys.argv[1:])
