"""Measures 11 and 12: the agent's store at scale (issue #14).

11. Rendezvous of N agents (``benchmarks/rdzv_spread.py``): the store in one process, the agents
    spread over several (threads in each), N = 1,024 / 4,096 / 16,384; the figure is the time
    until every agent holds the world. Beside it: t(16,384)/t(1,024) (linear would be 16) and
    the store's connections per agent once they all have it. Then a lost node replaced by a
    spare in a job of N (``benchmarks/rdzv_replace.py``, issue #35): the time from the loss
    until the N - 1 survivors and the spare hold the next world, the spare on the lost node's
    group rank, no survivor's rank changed; the store's CPU in that time.
12. The workers' store under torch's own clients (``benchmarks/torch_store.py``): 1,024
    ``TCPStore(is_master=False)`` clients doing set/add/get/wait against xrun's store and
    against torch's own TCPStore server (libuv), interleaved; calls per second and the time
    to connect them all.

Each figure comes from fresh child processes (the store, the agents, the clients), so one run
never inherits another's threads, sockets or heap.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Mapping
from typing import Any

from benchmarks import contenders as c
from benchmarks.harness import Row, RunFailed, Stats, interleave, one_line

ROOT = str(c.WORKERS.parent.parent)
SCALE_SIZES = (1024, 4096, 16384)
SMOKE_SCALE_SIZES = (256,)


def _json_child(code: str, timeout: float) -> dict[str, Any]:
    try:
        p = subprocess.run(
            [c.PYTHON, "-c", code],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=ROOT,
            env={**os.environ, **c.BASE_ENV},
        )
    except subprocess.TimeoutExpired:
        raise RunFailed(f"no result in {timeout:g} s") from None
    if p.returncode != 0:
        raise RunFailed(one_line(p.stderr[-800:]))
    result: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    return result


def _spread(n: int, cap: float, seen: dict[int, list[dict[str, Any]]]) -> Callable[[], float]:
    def once() -> float:
        code = (
            "import json, benchmarks.rdzv_spread as r\n"
            f"print(json.dumps(r.run({n}, timeout={cap!r})))"
        )
        result = _json_child(code, cap + 60)
        seen.setdefault(n, []).append(result)
        return float(result["seconds"])

    return once


def measure_11(reps: int, smoke: bool) -> list[Row]:
    sizes = SMOKE_SCALE_SIZES if smoke else SCALE_SIZES
    cap = 30.0 if smoke else 120.0
    seen: dict[int, list[dict[str, Any]]] = {}
    rows: list[Row] = []
    for n in sizes:
        row = Row(
            f"rendezvous of {n} agents (spread over processes)",
            "s",
            "16,384 agents < 10 s" if n == 16384 else "(scaling)",
            reference="xrun",
            check=(lambda r: _median_below(r, "xrun", 10.0)) if n == 16384 else None,
        )
        row.results = interleave(
            {"xrun": _spread(n, cap, seen)}, reps=1 if n > 1024 else min(reps, 3), warmup=False
        )
        row.note = _where(seen.get(n, []))
        rows.append(row)
    if not smoke:
        rows.append(_ratio_row(rows[0], rows[-1]))
    rows.append(_connections_row(seen))
    rows += [_replace_row(n, cap) for n in sizes]
    return rows


def _replace_row(n: int, cap: float) -> Row:
    row = Row(
        f"a spare replaces 1 lost node of {n} (simulation)",
        "s",
        "16,384 nodes < 10 s" if n == 16384 else "(scaling)",
        reference="xrun",
        check=(lambda r: _median_below(r, "xrun", 10.0)) if n == 16384 else None,
    )
    runs: list[dict[str, Any]] = []

    def once() -> float:
        code = (
            "import json, benchmarks.rdzv_replace as r\n"
            f"print(json.dumps(r.run({n}, timeout={cap * 2!r})))"
        )
        result = _json_child(code, cap * 4 + 60)
        if result["spare_took_rank"] != result["lost_rank"] or result["ranks_changed"]:
            raise RunFailed(f"the replacement moved ranks: {result}")
        runs.append(result)
        return float(result["replace_seconds"])

    row.results = interleave({"xrun": once}, reps=1, warmup=False)
    if runs:
        r = runs[-1]
        row.note = (
            f"round 0 formed in {r['round0_seconds']:.2f} s; the store's CPU for the "
            f"replacement {r['replace_store_cpu']:.2f} s; the spare took group rank "
            f"{r['lost_rank']}, no survivor's rank changed"
        )
    return row


def _median_below(results: Mapping[str, Stats | str], name: str, limit: float) -> bool | None:
    s = results.get(name)
    return s.median < limit if isinstance(s, Stats) else None


def _where(runs: list[dict[str, Any]]) -> str:
    """Where the time went, from the last run: the store's and the agents' CPU seconds."""
    if not runs:
        return ""
    r = runs[-1]
    return (
        f"{r['processes']} agent processes; CPU while the clock ran: store "
        f"{r['store_cpu']:.2f} s, agents {r['agents_cpu']:.2f} s (2 cores in all)"
    )


def _ratio_row(small: Row, big: Row) -> Row:
    row = Row(
        "t(16,384) / t(1,024)",
        "x",
        "<= 20 (16 = linear)",
        reference="xrun",
        check=lambda r: _median_below(r, "xrun", 20.0 + 1e-9),
    )
    a, b = small.median("xrun"), big.median("xrun")
    row.results = {"xrun": Stats([b / a]) if a and b else "unavailable: a size did not finish"}
    return row


def _connections_row(seen: dict[int, list[dict[str, Any]]]) -> Row:
    row = Row(
        "store connections per agent, steady state",
        "conn",
        "<= 1",
        reference="xrun",
        check=lambda r: _median_below(r, "xrun", 1.0 + 1e-9),
    )
    per = [run["connections_per_agent"] for runs in seen.values() for run in runs]
    row.results = {"xrun": Stats([max(per)]) if per else "unavailable: no run finished"}
    return row


def _throughput(
    server: str, clients: int, procs: int, iters: int, seen: dict[str, list[dict[str, Any]]]
) -> Callable[[], float]:
    def once() -> float:
        code = (
            "import json, benchmarks.torch_store as t\n"
            f"print(json.dumps(t.run({server!r}, {clients}, {procs}, {iters})))"
        )
        result = _json_child(code, 600)
        seen.setdefault(server, []).append(result)
        return float(result["ops_per_s"])

    return once


def measure_12(reps: int, smoke: bool) -> list[Row]:
    clients, procs, iters = (32, 2, 50) if smoke else (1024, 16, 20)
    seen: dict[str, list[dict[str, Any]]] = {}
    ops = Row(
        f"worker store: {clients} torch TCPStore clients, set/add/get/wait",
        "ops/s",
        "xrun >= 0.5x torch's libuv server",
        subject="xrun",
        reference="torch (libuv)",
        check=lambda r: _at_least_half(r),
    )
    ops.results = interleave(
        {
            "torch (libuv)": _throughput("torch", clients, procs, iters, seen),
            "xrun": _throughput("xrun", clients, procs, iters, seen),
        },
        # 2 at most: torch's server takes ~2 minutes to connect 1,024 clients on this host
        reps=1 if smoke else min(reps, 2),
        warmup=False,
    )
    cpu = {k: [r["server_cpu_us_per_call"] for r in v] for k, v in seen.items()}
    ops.note = "server CPU per call (us): " + ", ".join(f"{k} {min(v):.0f}" for k, v in cpu.items())
    connect = Row(
        f"worker store: connect {clients} torch clients",
        "s",
        "(reported)",
        subject="xrun",
        reference="torch (libuv)",
    )
    names = {"torch": "torch (libuv)", "xrun": "xrun"}
    connect.results = {names[k]: Stats([r["connect_s"] for r in v]) for k, v in seen.items() if v}
    connect.note = (
        "torch's client makes a reverse DNS lookup per connection, and torch's server one per "
        "accepted connection on its only loop thread; this host's resolver answers some after "
        "its 5 s timeout, which is most of both figures"
    )
    return [ops, connect]


def _at_least_half(results: Mapping[str, Stats | str]) -> bool | None:
    x, t = results.get("xrun"), results.get("torch (libuv)")
    if not isinstance(x, Stats) or not isinstance(t, Stats):
        return None
    return x.median >= 0.5 * t.median
