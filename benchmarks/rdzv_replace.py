"""A lost node replaced by a spare, at scale (issue #35): the rendezvous and store cost of the
replacement in an N-node job, by simulation.

``run(n, procs)``: as ``rdzv_spread.run`` (this process serves the store, ``procs`` children run
the agents' real ``RendezvousHandler``\\ s as threads), with ``--spares 1``: ``n`` active agents
plus one spare form round 0 (the spare parks on the store). Then one agent is lost: its
connection is shut down as a SIGKILLed agent's would be (the store fires its leases: the round
goes stale, the agent is out of it). The clock runs from that moment until the ``n - 1``
survivors, woken by their round watch (``fileno()``), and the spare hold round 1; it checks
that the spare took the lost node's group rank and every survivor kept its own. The store's
CPU in that time is what the replacement costs the store's host.

What it leaves out: detecting the loss (a closed connection is seen at once; a hung host after
``heartbeat_timeout``), and the workers (their store, their restart: measure 20 has those).

``python -m benchmarks.rdzv_replace N [PROCS]`` prints one line of JSON.
"""

from __future__ import annotations

import gc
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
from typing import Any

from benchmarks.rdzv_spread import (
    _STACK,
    Setup,
    _count_connections,
    _cpu,
    _expect,
    _fd_limit,
    _profile_store,
    _say,
)


def run(n: int, procs: int = 0, timeout: float = 300.0) -> dict[str, Any]:
    """Seconds from the loss of one of ``n`` agents until the survivors and the spare hold the
    next world; the store's CPU in that time."""
    setup = Setup(n, procs)
    procs, tmp, server, shares = setup.procs, setup.tmp, setup.server, setup.shares
    run_id = setup.run_id
    lost = n // 2  # an agent in the middle, in a process that has no spare
    children: list[subprocess.Popen[str]] = []
    try:
        offset = 0
        for k, share in enumerate(shares):
            # The last process also runs the spare (one more handler, arriving last).
            args = [str(server.port), run_id, str(n), str(share), str(offset)]
            args += [setup.token_file, str(timeout), "1" if k == procs - 1 else "0"]
            children.append(setup.spawn("benchmarks.rdzv_replace", args))
            offset += share
        for ch in children:
            _expect(ch, "ready", timeout)
        t0 = time.perf_counter()
        for ch in children:
            _say(ch, "go")
        for ch in children:
            _expect(ch, "formed", timeout)
        formed_s = time.perf_counter() - t0
        connections = _count_connections(server)
        _say(children[-1], "spare")
        _expect(children[-1], "spare", timeout)
        # the spare arrives in the full world and parks (its WAITs pending); nothing else moves
        time.sleep(2.0)
        owner = next(k for k in range(procs) if sum(shares[: k + 1]) > lost)
        prof = _profile_store(server) if os.environ.get("XRUN_BENCH_PROFILE") else None
        cpu0 = _cpu()
        t1 = time.perf_counter()
        _say(children[owner], f"lose {lost}")
        for ch in children:
            _say(ch, "watch")
        wrong = 0
        spare_rank = lost_rank = -1
        for ch in children:
            try:
                words = _expect(ch, "reformed", timeout).split()
            except TimeoutError:
                _dump(server, run_id, n)
                raise
            wrong += int(words[1])
            spare_rank = max(spare_rank, int(words[2]))
            lost_rank = max(lost_rank, int(words[3]))
        elapsed = time.perf_counter() - t1
        store_cpu = _cpu() - cpu0
        if prof is not None:
            prof()
        server.stop()
        for ch in children:
            _say(ch, "finish")
        for ch in children:
            ch.wait(timeout=60)
        return {
            "agents": n,
            "processes": procs,
            "round0_seconds": formed_s,
            "connections_per_agent": connections / n,
            "replace_seconds": elapsed,
            "replace_store_cpu": store_cpu,
            "spare_took_rank": spare_rank,
            "lost_rank": lost_rank,
            "ranks_changed": wrong,
        }
    finally:
        for ch in children:
            if ch.poll() is None:
                ch.kill()
                ch.wait()
        server.stop()
        tmp.cleanup()


def _dump(server: Any, run_id: str, n: int) -> None:
    """What the store holds of rounds 0 and 1 (debugging a re-formation that never ended)."""
    got: list[str] = []
    done = threading.Event()

    def look() -> None:
        data = server._data
        p = f"{run_id}/rdzv/"
        v = data.values
        for r in (0, 1, 2):
            left = sum(1 for i in range(1, n + 2) if f"{p}{r}/left/{i}" in v)
            nodes = sum(1 for i in range(1, n + 2) if f"{p}{r}/node/{i}" in v)
            seats = sum(1 for i in range(1, n + 2) if f"{p}{r}/seat/{i}" in v)
            got.append(
                f"round {r}: join={v.get(f'{p}{r}/join')!r} nodes={nodes} seats={seats} "
                f"left={left} stale={v.get(f'{p}{r}/stale')!r} world={f'{p}{r}/world' in v}"
            )
        got.append(f"cur={v.get(p + 'cur')!r} closed={v.get(p + 'closed')!r}")
        waits = sorted(data.waiters.items(), key=lambda kv: -len(kv[1]))[:8]
        got.append("parked on: " + ", ".join(f"{k} x{len(ws)}" for k, ws in waits))
        done.set()

    server._loop.call_soon_threadsafe(look)
    done.wait(10)
    print("\n".join(got), file=sys.stderr)


class _Agents:
    """One agent process: ``share`` handlers as threads (plus the spare in the last process)."""

    def __init__(self, argv: list[str]) -> None:
        port, run_id, n_s, share_s, offset_s, token_file, timeout_s, spare = argv
        self.n, self.share, self.timeout = int(n_s), int(share_s), float(timeout_s)
        self.offset, self.spare = int(offset_s), spare == "1"
        self.port, self.run_id = int(port), run_id
        # A long heartbeat_timeout: 512 agents to a process on a busy 2-core host can miss
        # their renewals for 15 s while the world re-forms (each real agent has a host of its
        # own), and the second re-formation that follows is not the one measured here.
        self.conf = {
            "join_timeout": timeout_s,
            "is_host": "false",
            "token_file": token_file,
            "heartbeat_timeout": timeout_s,
        }
        self.handlers: list[Any] = [None] * (self.share + self.spare)
        self.ranks: dict[int, tuple[int, int]] = {}  # handler -> group rank in rounds 0, 1
        self.errors: list[BaseException] = []
        self.cond = threading.Condition()
        self.phase = threading.Event()
        self.lost = -1  # the local index of the lost handler, if it is ours

    def params(self, i: int) -> Any:
        from xrun.runtime.rendezvous import Endpoint, RendezvousParams

        name = f"node{self.offset + i:05d}" if i < self.share else "spare"
        return RendezvousParams(
            backend="c10d",
            endpoint=Endpoint("127.0.0.1", self.port),
            run_id=self.run_id,
            min_nodes=self.n,
            max_nodes=self.n,
            local_world_size=8,
            conf=self.conf,
            local_addr=name,
            spares=1,
        )

    def body(self, i: int, go: threading.Event) -> None:
        # the spare (i == share) arrives once the world formed, as a spare that starts late
        from xrun.runtime.rendezvous import create_handler

        try:
            self.handlers[i] = h = create_handler(self.params(i))
            go.wait()
            info = h.next_rendezvous()
            first = info.group_rank
            self._note(i, (first, -1))
            if i < self.share:
                # the agent's round watch; the phase event keeps the lost one out of the count
                poller = select.poll()
                poller.register(h.fileno(), select.POLLIN | select.POLLHUP)
                while not poller.poll(1000):
                    pass
                if i == self.lost:
                    return
                event = h.poll_event()
                assert event is not None, "the round watch woke without news"
                info = h.next_rendezvous()
            self._note(i, (first if i < self.share else -1, info.group_rank))
        except BaseException as e:  # reported by main
            if i != self.lost:
                self.errors.append(e)
            with self.cond:
                self.cond.notify_all()

    def _note(self, i: int, ranks: tuple[int, int]) -> None:
        with self.cond:
            self.ranks[i] = ranks
            self.cond.notify_all()

    def _wait(self, done: Any) -> None:
        deadline = time.monotonic() + self.timeout
        with self.cond:
            while not done() and not self.errors:
                if not self.cond.wait(max(0.0, deadline - time.monotonic())):
                    break
        if self.errors or not done():
            e = self.errors[0] if self.errors else None
            why = f"{type(e).__name__}: {e}" if e else "timed out"
            print(f"failed: {why}", flush=True)
            os._exit(3)

    def main(self) -> None:
        _fd_limit(2 * (self.share + 1) + 256)
        threading.stack_size(_STACK)
        sys.setswitchinterval(0.1)  # harness settings: see rdzv_spread._Agents.main
        gc.disable()
        go, spare_go = threading.Event(), threading.Event()
        threads = [
            threading.Thread(target=self.body, args=(i, go), daemon=True) for i in range(self.share)
        ]
        if self.spare:
            threads.append(
                threading.Thread(target=self.body, args=(self.share, spare_go), daemon=True)
            )
        for t in threads:
            t.start()
        print("ready", flush=True)
        sys.stdin.readline()
        go.set()
        self._wait(lambda: sum(r[1] == -1 for r in self.ranks.values()) >= self.share)
        print("formed", flush=True)
        cmd = sys.stdin.readline().split()
        if cmd[0] == "spare":
            spare_go.set()
            print("spare", flush=True)
            cmd = sys.stdin.readline().split()
        lost_rank = -1
        if cmd[0] == "lose":
            self.lost = int(cmd[1]) - self.offset
            h = self.handlers[self.lost]
            lost_rank = self.ranks[self.lost][0]
            # As a SIGKILLed agent: the connection ends with no goodbye (the store fires its
            # leases); shutdown() also wakes its own round watch, which then just returns.
            h._link.client._conn.sock.shutdown(socket.SHUT_RDWR)
            sys.stdin.readline()  # "watch"
        want = self.share - (self.lost >= 0) + self.spare
        self._wait(lambda: sum(r[1] >= 0 for r in self.ranks.values()) >= want)
        wrong = sum(
            1 for i, r in self.ranks.items() if i < self.share and r[1] >= 0 and r[0] != r[1]
        )
        spare_rank = self.ranks[self.share][1] if self.spare else -1
        print(f"reformed {wrong} {spare_rank} {lost_rank}", flush=True)
        sys.stdin.readline()
        for i, h in enumerate(self.handlers):
            if i != self.lost:
                h.finish(0)
                h.shutdown()
        os._exit(0)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        _Agents(sys.argv[2:]).main()
    else:
        n, procs, timeout = (int(a) for a in [*sys.argv[1:4], "0", "0"][:3])
        print(json.dumps(run(n, procs, float(timeout or 300))), flush=True)
