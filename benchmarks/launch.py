"""Measures 1-3 and 13: a job end to end, launch overhead first, then a real gloo job.

1. ``-j 1x4`` of a do-nothing script;  2. the same with ``-j 2x2`` (two agents, a real
rendezvous);  3. a gloo all_reduce job, 1x4 (four ``import torch`` dominate: the floor);
13. a gloo all_reduce job of two agents x 8 workers (issue #14: the workers use the agent's
store).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from benchmarks import contenders as c
from benchmarks.harness import Row, Stats, at_most, interleave

Launcher = Callable[[c.Job], list[c.Cmd]]


def _runs(job: c.Job, who: dict[str, Launcher], timeout: float) -> dict[str, Callable[[], float]]:
    # Commands are built per run: each run gets its own free port and rendezvous id.
    def one(launcher: Launcher) -> Callable[[], float]:
        return lambda: c.timed(launcher(job), timeout=timeout)

    return {name: one(f) for name, f in who.items()}


ALL: dict[str, Launcher] = {
    "floor": c.floor,
    "torchrun": c.torchrun,
    "torchx": c.torchx,
    "xrun-agent": c.agent,
    "xrun": c.xrun,
}


def measure_1(reps: int, smoke: bool) -> list[Row]:
    job = c.Job("noop.py", nproc=4)
    row = Row(
        "1x4 do-nothing job, end to end",
        "s",
        "xrun <= floor + 0.25 s",
        reference="torchrun",
        check=at_most("xrun", 0.25, plus="floor"),
    )
    row.results = interleave(_runs(job, ALL, 120), reps, warmup=not smoke)
    return [row]


def measure_2(reps: int, smoke: bool) -> list[Row]:
    job = c.Job("noop.py", nnodes=2, nproc=2)
    row = Row(
        "2x2 do-nothing job (two agents, rendezvous), end to end",
        "s",
        "xrun <= 0.45 s",
        reference="torchrun",
        check=at_most("xrun", 0.45),
    )
    row.results = interleave(_runs(job, ALL, 120), reps, warmup=not smoke)
    return [row]


def measure_3(reps: int, smoke: bool) -> list[Row]:
    # Smoke: two workers, not four: two torch imports instead of four keep CI quick.
    nproc = 2 if smoke else 4
    job = c.Job("allreduce.py", nproc=nproc)
    row = Row(
        f"gloo all_reduce job 1x{nproc}",
        "s",
        "xrun <= floor + 0.3 s",
        reference="torchrun",
        check=at_most("xrun", 0.3, plus="floor"),
    )
    row.results = interleave(_runs(job, ALL, 300), reps, warmup=not smoke)
    return [row]


def measure_13(reps: int, smoke: bool) -> list[Row]:
    # Two agents (c10d, one rendezvous) x 8 workers: 16 torch imports on 2 cores dominate, the
    # launchers differ in their start-up, rendezvous and store. Smoke: 2 x 1.
    nproc = 1 if smoke else 8
    job = c.Job("allreduce.py", nnodes=2, nproc=nproc)
    row = Row(
        f"gloo all_reduce job 2x{nproc} (two agents)",
        "s",
        "xrun no slower than torchrun",
        reference="torchrun",
        check=lambda r: _no_slower(r, "xrun-agent", "torchrun"),
    )
    who = {k: ALL[k] for k in ("floor", "torchrun", "xrun-agent", "xrun")}
    row.results = interleave(
        _runs(job, who, 600), reps=1 if smoke else min(reps, 3), warmup=not smoke
    )
    return [row]


def _no_slower(results: Mapping[str, Stats | str], subject: str, reference: str) -> bool | None:
    a, b = results.get(subject), results.get(reference)
    if not isinstance(a, Stats) or not isinstance(b, Stats):
        return None
    return a.median <= b.median
