"""Rendezvous at scale: N agents spread over several processes, the store in one more.

``run(n, procs)``: this process serves the store (``StoreServer``, with a job secret, as a
scheduler's job has); ``procs`` child processes run ``n`` real ``RendezvousHandler``s between
them, as threads (each agent of a real job is a process of its own on its own host; threads
spread over processes are the nearest a 2-core box gets: no one process runs out of file
descriptors or fights 16,384 threads for one GIL). The clock starts when every child has its
handlers created and waiting, and stops when the last ``next_rendezvous`` has returned, every
handler having armed its round watch (``fileno()``) as the agent does. Then, at steady state,
the store counts its connections: the figure per agent is what a job of N nodes costs the
store's host.

``python -m benchmarks.rdzv_spread N [PROCS]`` prints one line of JSON; ``XRUN_BENCH_MIN=M`` makes
it an elastic job (``--nnodes M:N``; default N:N). At 4,096 agents, M = 2,048 cost 2x the
store's and the agents' CPU of M = N until only the latest arrival ran the last call.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

_STACK = 256 << 10  # per handler thread: they block in recv, they need no 8 MiB stack


def _fd_limit(want: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < min(want, hard):
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))


class Setup:
    """What a simulated job's run needs (``run`` here, ``rdzv_replace.run``): ``procs`` agent
    processes (default: one per 512 agents, at least 2) and their shares of ``n`` agents, the
    store with a job secret (as a scheduler's job has) in this process, its token file, a run
    id. ``spawn`` starts one agent process (``python -m MODULE --child ARGS``)."""

    def __init__(self, n: int, procs: int) -> None:
        from xrun.runtime.store import StoreServer

        self.procs = procs or max(2, (n + 511) // 512)
        _fd_limit(n + 512)
        token = os.urandom(32).hex().encode()  # a token file is read stripped: no raw bytes
        self.tmp = tempfile.TemporaryDirectory(prefix="xrun-bench-")
        self.token_file = os.path.join(self.tmp.name, "token")
        with open(os.open(self.token_file, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
            f.write(token)
        self.server = StoreServer("127.0.0.1", 0, token)
        self.run_id = uuid.uuid4().hex[:8]
        p = self.procs
        self.shares = [n // p + (1 if i < n % p else 0) for i in range(p)]

    @staticmethod
    def spawn(module: str, args: list[str]) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", module, "--child", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        )


def run(n: int, procs: int = 0, timeout: float = 120.0) -> dict[str, Any]:
    """Seconds until ``n`` agents in ``procs`` processes (default: one per 512 agents, at
    least 2) all hold the world; plus the store's connections per agent at steady state."""
    setup = Setup(n, procs)
    procs, tmp, server, shares = setup.procs, setup.tmp, setup.server, setup.shares
    children: list[subprocess.Popen[str]] = []
    try:
        offset = 0
        for share in shares:
            args = [str(server.port), setup.run_id, str(n), str(share), str(offset)]
            children.append(
                setup.spawn("benchmarks.rdzv_spread", [*args, setup.token_file, str(timeout)])
            )
            offset += share
        for ch in children:
            _expect(ch, "ready", timeout)
        prof = _profile_store(server) if os.environ.get("XRUN_BENCH_PROFILE") else None
        t0 = time.perf_counter()
        cpu0 = _cpu()
        for ch in children:
            _say(ch, "go")
        agents_cpu = 0.0
        for ch in children:
            agents_cpu += float(_expect(ch, "done", timeout).split()[1])
        elapsed = time.perf_counter() - t0
        store_cpu = _cpu() - cpu0
        connections = _count_connections(server)
        if prof is not None:
            prof()
        # The store closes first, so the connections' TIME_WAIT lands on its port, not on
        # N ephemeral ports of the agents' side: the next run on this host (same kernel) would
        # otherwise find most of the ephemeral range taken, and connect() slow.
        server.stop()
        for ch in children:
            _say(ch, "finish")
        for ch in children:
            ch.wait(timeout=60)
            if ch.returncode != 0:
                raise RuntimeError(f"an agent process exited {ch.returncode}")
        return {
            "agents": n,
            "processes": procs,
            "seconds": elapsed,
            "connections_per_agent": connections / n,
            # CPU seconds while the clock ran: the store's process, all agent processes
            "store_cpu": store_cpu,
            "agents_cpu": agents_cpu,
        }
    finally:
        for ch in children:
            if ch.poll() is None:
                ch.kill()
                ch.wait()
        server.stop()
        tmp.cleanup()


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _say(ch: subprocess.Popen[str], word: str) -> None:
    assert ch.stdin is not None
    ch.stdin.write(word + "\n")
    ch.stdin.flush()


def _expect(ch: subprocess.Popen[str], word: str, timeout: float) -> str:
    assert ch.stdout is not None
    line = ch.stdout.readline()  # the child gives up after its own timeout and says why
    if not line.startswith(word):
        raise TimeoutError(f"an agent process said {line.strip()!r}, expected {word!r}")
    return line


def _profile_store(server: Any) -> Any:
    """Profile the store's loop thread (debugging: where does the store's time go?); returns
    the function that stops it and prints the top entries to stderr."""
    import cProfile
    import pstats

    p = cProfile.Profile()
    server._loop.call_soon_threadsafe(p.enable)

    def stop() -> None:
        done = threading.Event()
        server._loop.call_soon_threadsafe(lambda: (p.disable(), done.set()))
        done.wait(10)
        pstats.Stats(p, stream=sys.stderr).sort_stats("tottime").print_stats(25)

    return stop


def _count_connections(server: Any) -> int:
    """Open connections the store holds, counted on its loop thread."""
    got: list[int] = []
    done = threading.Event()

    def count() -> None:
        got.append(len(server._sessions))
        done.set()

    server._loop.call_soon_threadsafe(count)
    done.wait(10)
    return got[0]


class _Agents:
    """One agent process of the benchmark: ``share`` handlers as threads (see the module
    docstring), told when to go and when to leave on stdin."""

    def __init__(self, argv: list[str]) -> None:
        port, run_id, n_s, share_s, offset_s, token_file, timeout_s = argv
        self.n, self.share, self.timeout = int(n_s), int(share_s), float(timeout_s)
        self.offset = int(offset_s)
        self.port, self.run_id = int(port), run_id
        self.conf = {"join_timeout": timeout_s, "is_host": "false", "token_file": token_file}
        self.go = threading.Event()
        self.handlers: list[Any] = [None] * self.share
        self.errors: list[BaseException] = []
        self.left = self.share
        self.all_done = threading.Event()
        self.lock = threading.Lock()

    def body(self, i: int) -> None:
        from xrun.runtime.rendezvous import Endpoint, RendezvousParams, create_handler

        try:
            params = RendezvousParams(
                backend="c10d",
                endpoint=Endpoint("127.0.0.1", self.port),
                run_id=self.run_id,
                min_nodes=int(os.environ.get("XRUN_BENCH_MIN", self.n)),
                max_nodes=self.n,
                local_world_size=8,
                conf=self.conf,
                local_addr=f"node{self.offset + i:05d}",
            )
            self.handlers[i] = h = create_handler(params)
            self.go.wait()
            info = h.next_rendezvous()
            assert info.group_world_size == self.n
            h.fileno()  # the agent arms its round watch before it waits on its workers
        except BaseException as e:  # reported by main
            self.errors.append(e)
        with self.lock:
            self.left -= 1
            if self.left == 0:
                self.all_done.set()

    def main(self) -> None:
        _fd_limit(2 * self.share + 256)
        threading.stack_size(_STACK)
        # Harness settings, not the agent's: a real agent is one handler in a process of its
        # own. Here 512 handler threads share one interpreter, and with its defaults they
        # spend most of their CPU passing the GIL among themselves (a 5 ms switch interval)
        # and in the cyclic GC walking 1,024 handlers' objects: measured at 4,096 agents,
        # 9-23 s of agent CPU with the defaults against 2.4-2.6 s with these.
        sys.setswitchinterval(0.1)
        gc.disable()
        threads = [
            threading.Thread(target=self.body, args=(i,), daemon=True) for i in range(self.share)
        ]
        for t in threads:
            t.start()
        print("ready", flush=True)
        sys.stdin.readline()
        cpu0 = _cpu()
        self.go.set()
        if not self.all_done.wait(self.timeout) or self.errors:
            e = self.errors[0] if self.errors else None
            why = f"{type(e).__name__}: {e}" if e else "no error"
            print(f"failed: {self.left} of {self.share} agents have no world ({why})", flush=True)
            os._exit(3)
        print(f"done {_cpu() - cpu0:.3f}", flush=True)
        sys.stdin.readline()
        for h in self.handlers:
            h.finish(0)
            h.shutdown()
        os._exit(0)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        _Agents(sys.argv[2:]).main()
    else:
        args = [int(a) for a in sys.argv[1:3]]
        print(json.dumps(run(*args)), flush=True)
