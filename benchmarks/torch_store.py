"""The workers' store under load: torch's own TCPStore clients against xrun's store and against
torch's own TCPStore server (libuv, torch 2.13's default), the same load in the same run.

``run(server, clients, procs, iters)`` starts the server in a process of its own (``xrun``:
the agent's ``StoreServer``; ``torch``: ``TCPStore(is_master=True)``), then ``procs`` client
processes with ``clients`` ``torch.distributed.TCPStore(is_master=False)`` clients between
them, one thread each (torch's binding releases the GIL while it waits on the socket). Two
figures: ``connect_s``, the seconds until every client is constructed (connect, VALIDATE, PING)
once all processes start at the same moment; ``ops_per_s``: each client does ``iters`` rounds
of ``set``, ``add`` (one counter shared by all), ``get`` (torch's client sends WAIT then GET)
and ``wait`` of its own key, all clients at once: calls per second over the whole run.

``python -m benchmarks.torch_store [CLIENTS] [PROCS] [ITERS]`` prints both servers side by
side; ``XRUN_BENCH_PROFILE=1`` adds the xrun store's profile (where its time goes).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CONNECT_BATCH = 16

# Both servers answer "cpu" on stdin with their process' CPU seconds so far, and stop on EOF.
_CPU_LOOP = """
import resource
for line in sys.stdin:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print("CPU", ru.ru_utime + ru.ru_stime, flush=True)
"""

_XRUN_SERVER = (
    """
import os, sys
from xrun.runtime.store import StoreServer
s = StoreServer("127.0.0.1", 0)
prof = None
if os.environ.get("XRUN_BENCH_PROFILE"):
    import cProfile, threading
    prof = cProfile.Profile()
    ev = threading.Event()
    s._loop.call_soon_threadsafe(lambda: (prof.enable(), ev.set()))
    ev.wait()
print("PORT", s.port, flush=True)
"""
    + _CPU_LOOP
    + """
if prof is not None:
    import pstats, threading
    ev = threading.Event()
    s._loop.call_soon_threadsafe(lambda: (prof.disable(), ev.set()))
    ev.wait()
    pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(18)
os._exit(0)
"""
)

_TORCH_SERVER = (
    """
import os, sys
import torch.distributed as d
s = d.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv=True)
print("PORT", s.port, flush=True)
"""
    + _CPU_LOOP
    + """
os._exit(0)
"""
)


def _spawn(args: list[str], quiet: bool = True) -> subprocess.Popen[str]:
    # torch's client and server warn per connection on this host ("the hostname of the
    # client socket cannot be retrieved"): thousands of lines, nothing to act on
    return subprocess.Popen(
        args,
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL if quiet else None,
        text=True,
    )


def _line(p: subprocess.Popen[str], word: str) -> list[str]:
    assert p.stdout is not None
    line = p.stdout.readline().split()
    if not line or line[0] != word:
        raise RuntimeError(f"expected {word!r} from a benchmark process, got {line!r}")
    return line[1:]


def _cpu(srv: subprocess.Popen[str]) -> float:
    _say([srv], "cpu")
    return float(_line(srv, "CPU")[0])


def _say(procs: list[subprocess.Popen[str]], word: str) -> None:
    for p in procs:
        assert p.stdin is not None
        p.stdin.write(word + "\n")
        p.stdin.flush()


def run(server: str, clients: int, procs: int, iters: int) -> dict[str, float]:
    """One measurement against ``server`` ("xrun" or "torch")."""
    code = _XRUN_SERVER if server == "xrun" else _TORCH_SERVER
    srv = _spawn([sys.executable, "-c", code], quiet=server == "torch")
    children: list[subprocess.Popen[str]] = []
    try:
        port = int(_line(srv, "PORT")[0])
        shares = [clients // procs + (1 if i < clients % procs else 0) for i in range(procs)]
        offset = 0
        for share in shares:
            argv = [sys.executable, "-m", "benchmarks.torch_store", "--child"]
            children.append(_spawn([*argv, str(port), str(share), str(offset), str(iters)]))
            offset += share
        for ch in children:
            _line(ch, "imported")  # torch imported: outside the clock
        t0 = time.perf_counter()
        _say(children, "connect")
        for ch in children:
            _line(ch, "connected")
        connect_s = time.perf_counter() - t0
        cpu0 = _cpu(srv)
        t0 = time.perf_counter()
        _say(children, "go")
        calls = sum(int(_line(ch, "done")[0]) for ch in children)
        ops_s = time.perf_counter() - t0
        cpu = _cpu(srv) - cpu0
        _say(children, "exit")
        for ch in children:
            ch.wait(30)
        return {
            "connect_s": connect_s,
            "ops_per_s": calls / ops_s,
            "calls": calls,
            # the server's CPU while the calls ran, per call
            "server_cpu_us_per_call": cpu / calls * 1e6,
        }
    finally:
        for ch in children:
            if ch.poll() is None:
                ch.kill()
                ch.wait()
        assert srv.stdin is not None
        srv.stdin.close()
        srv.wait(30)


def _child(port: int, share: int, offset: int, iters: int) -> None:
    import datetime

    import torch.distributed as dist

    print("imported", flush=True)
    sys.stdin.readline()
    timeout = datetime.timedelta(seconds=120)
    stores: list[Any] = [None] * share
    errors: list[BaseException] = []

    def connect(i: int) -> None:
        try:
            stores[i] = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
        except BaseException as e:  # reported below
            errors.append(e)

    # At most 16 at once per process: torch's client constructor makes a reverse DNS lookup,
    # and on this host more than ~32 concurrent ones in one process stall for the resolver's
    # 5 s timeout (the same for either server; strace shows the PTR queries).
    for first in range(0, share, _CONNECT_BATCH):
        _all(connect, min(_CONNECT_BATCH, share - first), first)
    if errors:
        raise errors[0]
    print("connected", flush=True)
    sys.stdin.readline()

    def work(i: int) -> None:
        store, key = stores[i], f"k{offset + i}"
        try:
            for n in range(iters):
                store.set(key, str(n))
                store.add("counter", 1)
                store.get(key)
                store.wait([key])
        except BaseException as e:  # reported below
            errors.append(e)

    _all(work, share)
    if errors:
        raise errors[0]
    print(f"done {4 * iters * share}", flush=True)
    sys.stdin.readline()
    os._exit(0)  # torch's client threads need no orderly teardown


def _all(fn: Any, n: int, first: int = 0) -> None:
    threads = [threading.Thread(target=fn, args=(first + i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def main(argv: list[str]) -> None:
    clients, procs, iters = (int(a) for a in (argv + ["1024", "16", "50"][len(argv) :])[:3])
    out = {name: run(name, clients, procs, iters) for name in ("torch", "xrun")}
    ratio = out["xrun"]["ops_per_s"] / out["torch"]["ops_per_s"]
    print(json.dumps({**out, "ops_ratio_xrun_to_torch": ratio}), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        _child(*(int(a) for a in sys.argv[2:6]))
    else:
        main(sys.argv[1:])
