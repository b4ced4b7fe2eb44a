"""Measure 6: rendezvous of N agents (threads in one process), xrun vs torch's c10d; then N
agents through etcd (xrun's etcd rendezvous, scripts/etcd-server.sh) vs through xrun's store.

The rendezvous code itself is ``benchmarks/rdzv.py`` (``run(n)`` for xrun, ``run_torch(n)`` for
torch). Each figure comes from a fresh child interpreter, killed at a cap: torch's rendezvous
stops completing somewhere past 64 agents, and its stuck threads cannot be stopped from inside.
Once torch misses the cap at some N it is not run at larger N.
"""

from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import Callable

from benchmarks import contenders as c
from benchmarks.harness import Row, RunFailed, Stats, Unavailable, at_most, interleave, one_line

FULL_SIZES = (8, 64, 256, 1024)
SMOKE_SIZES = (8,)
ROOT = str(c.WORKERS.parent.parent)  # the child imports benchmarks.rdzv from the repository


def _child(func: str, n: int, cap: float) -> float:
    code = f"import benchmarks.rdzv as r; print(r.{func}({n}, timeout={cap!r}))"
    try:
        p = subprocess.run(
            [c.PYTHON, "-c", code],
            capture_output=True,
            text=True,
            timeout=cap + 30,
            env={**os.environ, **c.BASE_ENV},
            cwd=ROOT,
        )
    except subprocess.TimeoutExpired:
        raise RunFailed(f"no completion in {cap:g} s") from None
    if p.returncode != 0:
        if "TimeoutError" in p.stderr:
            raise RunFailed(f"no completion in {cap:g} s")
        if "No module named 'benchmarks.rdzv'" in p.stderr:
            raise Unavailable("benchmarks/rdzv.py is not written yet")
        raise RunFailed(one_line(p.stderr[-800:]))
    return float(p.stdout.strip().splitlines()[-1])


def _torch(n: int, cap: float, gave_up: int | None) -> Callable[[], float]:
    if gave_up is None:
        return functools.partial(_child, "run_torch", n, cap)

    def skipped() -> float:
        raise Unavailable(f"not run: no completion at {gave_up} agents already")

    return skipped


def measure_6(reps: int, smoke: bool) -> list[Row]:
    sizes = SMOKE_SIZES if smoke else FULL_SIZES
    cap = 30.0 if smoke else 60.0
    rows: list[Row] = []
    torch_gave_up: int | None = None
    for n in sizes:
        row = Row(
            f"rendezvous of {n} agents",
            "s",
            "xrun: 1024 agents < 2 s" if n == 1024 else "(scaling)",
            reference="torch c10d",
            check=at_most("xrun", 2.0) if n == 1024 else None,
        )
        row.results = interleave(
            {
                "torch c10d": _torch(n, cap, torch_gave_up),
                "xrun": functools.partial(_child, "run", n, cap),
            },
            reps=1 if n >= 64 else min(reps, 3),
            warmup=False,
        )
        if torch_gave_up is None and not isinstance(row.results["torch c10d"], Stats):
            torch_gave_up = n
        rows.append(row)
    rows.extend(_etcd_rows(reps, smoke, cap))
    return rows


ETCD_FULL_SIZES = (8, 64)
ETCD_SMOKE_SIZES = (4,)


def _etcd_rows(reps: int, smoke: bool, cap: float) -> list[Row]:
    """N agents through etcd (``--rdzv-backend etcd-v2``) vs through xrun's own store."""
    up = subprocess.run(
        ["bash", os.path.join(ROOT, "scripts", "etcd-server.sh"), "up"],
        capture_output=True,
        text=True,
        timeout=600,
    )

    def etcd(n: int) -> Callable[[], float]:
        if up.returncode != 0:

            def unavailable() -> float:
                raise Unavailable(f"etcd did not start: {one_line(up.stderr[-300:])}")

            return unavailable
        return functools.partial(_child, "run_etcd", n, cap)

    rows: list[Row] = []
    for n in ETCD_SMOKE_SIZES if smoke else ETCD_FULL_SIZES:
        row = Row(
            f"rendezvous of {n} agents through etcd",
            "s",
            "(comparison)",
            subject="xrun etcd",
            reference="xrun store",
        )
        row.results = interleave(
            {"xrun store": functools.partial(_child, "run", n, cap), "xrun etcd": etcd(n)},
            reps=min(reps, 3),
            warmup=False,
        )
        rows.append(row)
    return rows
