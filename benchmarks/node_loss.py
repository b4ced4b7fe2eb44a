"""Measure 20: a node-loss drill (issue #35). ``examples/train_ddp.py --print-steps`` as 2 nodes x
2 gloo workers (three runtime agents on this host, c10d; each its own node: ``XRUN_NODE_ID``,
so its own snapshot dir) plus one spare; the node that does not serve the store is SIGKILLed
with its workers (its process group) at a random step; the spare takes its slot. The figure is
the time from the kill to the next full-world step (rank 0's ``step S`` line), with the steps
lost (the last step rank 0 printed before the kill minus the step the new world resumed after)
and whether the final parameters equal an undisturbed run's (its ``--out`` sha256).

Side by side, one job per fault: ``--spares 1 --recover warm`` (the spare's pool full before the
kill), ``--spares 1 --recover off`` (the spare starts cold workers), and the issue's reference:
the same job without a spare, ``--recover off``, losing one worker (``kill -9``) instead of a
node - xrun's cold restart of one worker. Every contender restores from memory
(``Snapshotter(replicated=True)``: the replacement gets the step from its peers).

Beside them (not in ``--smoke``: its venv needs the package index) NVIDIA's ``ft_launcher``
(nvidia-resiliency-ext 0.4.1, benchmarks/ftl.py) with a hot spare: the same three agents, the
same kill. Its workers run the same script; the example's Snapshotter is a worker-side library
that needs no xrun agent (torchelastic's ``TORCHELASTIC_RUN_ID``, ``/dev/shm``), so there too the
spare's ranks get the step from their peers. And torchrun (the installed torch's) with three
agents for ``--nnodes 2``: c10d keeps the third in its redundancy list too, and lets it in once
the dead node's keep-alive has expired. And xrun's spares on the etcd rendezvous
(scripts/etcd-server.sh's etcd), losing the node c10d cannot replace: the one of group rank 0,
whose agent serves the store under c10d. ``XRUN_BENCH_NODE_LOSS_FAULTS`` sets the number of
faults per contender (default ``max(5, --reps)``, 1 with ``--smoke``).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import random
import re
import signal
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from benchmarks import contenders as c
from benchmarks import ftl
from benchmarks.harness import Row, RunFailed, Stats, Unavailable
from benchmarks.recovery import (
    _STARTED,
    _STEP,
    TRAIN,
    _children,
    _comm,
    _Job,
    _p95,
    _ready,
)

NPROC = 2  # workers per node
TOTAL = 400  # steps of the job (0.05 s each): the kill comes before step ~250
_WORKER = re.compile(r"\[\w*\d+\]:")  # a worker's line: "[default0]:..." (both launchers)
FTL = "ft_launcher, hot spare"
CONF = "heartbeat_interval=0.2,heartbeat_timeout=1.5,last_call_timeout=5,join_timeout=120"
# torchrun drops a dead node after keep_alive_interval x keep_alive_max_attempt, 5 x 3 s by
# default, as ft_launcher (which has no knob for it). Shorter is no fairer: at 1 x 2 s on a busy
# host a live agent's keep-alive comes late, and the agents restart their workers round after
# round (seen here: no step in 100 s, 3 of 3 tries at load 9-12).
TORCHRUN = "torchrun"
TORCHRUN_CONF = "last_call_timeout=5,join_timeout=120"
CHURN = 40  # workers stopped before the kill that show a job restarting round after round
# xrun's spares on the etcd rendezvous (scripts/etcd-server.sh's etcd): group rank 0's node lost
ETCD_WARM, ETCD = "etcd-warm", "127.0.0.1:2379"
ETCD_CONF = "heartbeat_interval=0.2,heartbeat_timeout=2,last_call_timeout=5,join_timeout=120"
ETCD_SPARE = "xrun etcd spare, group rank 0's node lost"


def _listening(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RunFailed(f"no store on port {port} after {timeout:.0f} s")


def _job(tmp: str, spares: int, recover: str, n: int) -> list[_Job]:
    """The job's agents, the store's host first (it binds the port before the others start).
    ``recover`` "ftl": NVIDIA's ft_launcher, its third agent the hot spare (benchmarks/ftl.py)."""
    port, run_id = c.free_port(), f"node-loss-{os.getpid()}-{n}"
    extra: dict[str, str] = {}
    if recover == "ftl":
        launcher = ftl.command(port, run_id, NPROC, max_restarts=3)
        extra = ftl.env()
    elif recover == TORCHRUN:
        launcher = [
            c.tool("torchrun"), "--nnodes", "2", "--nproc-per-node", str(NPROC),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--rdzv-id", run_id, "--rdzv-conf", TORCHRUN_CONF, "--max-restarts", "3",
            "--tee", "3", "--monitor-interval", "0.1",
        ]  # fmt: skip
    else:
        # ETCD: the spares' rules kept in etcd (etcd_spares.py), so the node of group rank 0
        # can be lost too; a 2 s lease (etcd's shortest) instead of 1.5 s heartbeats
        backend, endpoint = (
            ("etcd", ETCD) if recover == ETCD_WARM else ("c10d", f"127.0.0.1:{port}")
        )
        launcher = [
            c.PYTHON, "-m", "xrun.runtime", "--nnodes", "2", "--nproc-per-node", str(NPROC),
            "--rdzv-backend", backend, "--rdzv-endpoint", endpoint,
            "--rdzv-id", run_id, "--rdzv-conf", ETCD_CONF if backend == "etcd" else CONF,
            "--max-restarts", "3", "--tee", "3",
            "--recover", "warm" if recover == ETCD_WARM else recover,
            *(["--spares", str(spares)] if spares else []),
        ]  # fmt: skip
    cmd = [
        *launcher, str(TRAIN), "--print-steps", "--step-sleep", "0.05", "--epochs", "1",
        "--steps-per-epoch", str(TOTAL), "--checkpoint-dir", os.path.join(tmp, f"ckpt-{n}"),
        "--out", os.path.join(tmp, f"out-{n}.json"),
    ]  # fmt: skip
    # XRUN_NODE_ID: each agent a node of its own, its own snapshot dir (as on separate hosts)
    first = _Job(cmd, tmp, env={**extra, "XRUN_NODE_ID": f"node-{n}-0"})
    if recover != ETCD_WARM:  # etcd: no store of the first agent's to wait for
        _listening(port, 300)
    rest = [
        _Job(cmd, tmp, first.lines, env={**extra, "XRUN_NODE_ID": f"node-{n}-{i}"})
        for i in range(1, 2 + spares)
    ]
    return [first, *rest]


def _sha(tmp: str, n: int, jobs: list[_Job]) -> str:
    for j in jobs:
        try:
            j.proc.wait(timeout=600)
        except Exception as e:  # noqa: BLE001 - reported as the fault's failure
            raise RunFailed(f"the job did not end: {e}") from None
    try:
        return str(json.loads(Path(tmp, f"out-{n}.json").read_text())["params_sha256"])
    except (OSError, ValueError, KeyError) as e:
        raise RunFailed(f"no result: {e}; {' | '.join(jobs[0].tail[-3:])}") from None


def _fault(
    tmp: str, n: int, spares: int, recover: str, rng: random.Random
) -> tuple[float, int, str]:
    """One job, one fault: (seconds to the next full-world step, steps lost, final sha256)."""
    jobs = _job(tmp, spares, recover, n)
    job = jobs[0]
    try:
        kill_at = rng.randint(20, 40)
        job.until(_reached(kill_at), 600)
        spare = _spare(jobs, "warm" if recover == ETCD_WARM else recover) if spares else None
        if recover == ETCD_WARM:  # the node of group rank 0, whichever agent that is
            victim = next(j for j in jobs if j.rank0)
        else:  # not the store's host (jobs[0]: its loss ends the job), not the spare
            victim = next(j for j in jobs[1:] if j is not spare)
        last = -1
        while not job.lines.empty():  # the steps before the kill are read
            if m := _STEP.search(job.lines.get_nowait()[1]):
                last = int(m[1])
        if last >= TOTAL - 20:
            raise RunFailed(f"the job was at step {last} of {TOTAL} before the kill")
        t0 = time.monotonic()
        if spares:  # the node: its agent, its process group and every process under it
            tree = _descendants(victim.proc.pid)
            os.killpg(victim.proc.pid, signal.SIGKILL)
            for pid in tree:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        else:
            kids = [k for k in _children(victim.proc.pid) if _comm(k) != "xrun-warm"]
            if not kids:
                raise RunFailed("the victim node has no workers")
            os.kill(rng.choice(kids), signal.SIGKILL)
        others = [j for j in jobs if j is not victim]
        _until(job, others, lambda ln: _STARTED.search(ln) is not None)
        first = [last + 1]

        def step(ln: str) -> bool:
            if m := _STEP.search(ln):  # resumed after S (memory, disk, or 0: scratch): S + 1
                first[0] = int(m[1])
            return m is not None

        t1 = _until(job, others, step)
        return t1 - t0, max(0, last - (first[0] - 1)), _sha(tmp, n, jobs)
    finally:
        for j in jobs:
            j.stop()


def _reached(kill_at: int) -> Callable[[str], bool]:
    """Matches rank 0's step ``kill_at``; fails a job whose launchers stop their workers round
    after round before it gets there."""
    stops = [0]  # workers a launcher stopped before the kill: none in a healthy start

    def match(ln: str) -> bool:
        stops[0] += "closing signal SIGTERM" in ln
        if stops[0] > CHURN:
            raise RunFailed(
                f"{stops[0]} workers stopped before step {kill_at}: the agents restart their "
                "workers round after round (torchrun: 'Detected 1 new nodes ... will restart "
                "worker group')"
            )
        return (m := _STEP.search(ln)) is not None and int(m[1]) >= kill_at

    return match


def _spare(jobs: list[_Job], recover: str) -> _Job:
    """The agent none of whose workers spoke; with warm, once its pool is full."""
    deadline = time.monotonic() + 300
    spare = None
    while spare is None and time.monotonic() < deadline:
        quiet = [j for j in jobs if not any(_WORKER.match(t) for t in j.tail)]
        spare = quiet[0] if len(quiet) == 1 else None
        time.sleep(0.05)
    if spare is None:
        raise RunFailed("no agent stood by as a spare")
    while recover == "warm" and _ready(spare.proc.pid) < NPROC:
        if time.monotonic() > deadline:
            raise RunFailed("the spare's warm pool did not fill in 300 s")
        time.sleep(0.05)
    return spare


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        kids = _children(todo.pop())
        out += kids
        todo += kids
    return out


def _until(
    job: _Job, alive: list[_Job], match: Callable[[str], bool], timeout: float = 600
) -> float:
    """The time of the first line that ``match``es (``job.lines``: every node's); the killed
    node's end of output is skipped, a survivor's end fails the fault."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            t, line = job.lines.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            raise RunFailed(f"timed out; last lines: {' | '.join(job.tail[-4:])}") from None
        if line == "" and any(j.proc.poll() is not None for j in alive):
            raise RunFailed(f"a survivor ended: {' | '.join(job.tail[-3:])}")
        if line and match(line):
            return t


def _reference(tmp: str) -> str:
    """The undisturbed job's final sha256 (no spare, no kill)."""
    jobs = _job(tmp, 0, "off", 0)
    try:
        return _sha(tmp, 0, jobs)
    finally:
        for j in jobs:
            j.stop()


def measure_20(reps: int, smoke: bool) -> list[Row]:
    # XRUN_BENCH_NODE_LOSS_FAULTS: fewer (or more) faults per contender than max(5, --reps)
    faults = int(os.environ.get("XRUN_BENCH_NODE_LOSS_FAULTS", 1 if smoke else max(5, reps)))
    rng = random.Random(35)
    contenders = {
        "xrun spare, --recover warm": (1, "warm"),
        "xrun spare, --recover off": (1, "off"),
        "xrun no spare, off, one worker killed": (0, "off"),
        FTL: (1, "ftl"),  # NVIDIA's ft_launcher, its hot spare (benchmarks/ftl.py)
        "torchrun c10d, 3 agents for 2 nodes": (1, TORCHRUN),
        ETCD_SPARE: (1, ETCD_WARM),  # the node c10d cannot replace (its agent serves the store)
    }
    # Smoke (CI): ft_launcher's venv needs the package index, as preemption.py's submitit does
    if smoke:  # one fault of the subject; no reference run (bit-identity: n/a)
        contenders = {"xrun spare, --recover warm": (1, "warm")}
    results: dict[str, Stats | str] = {}
    samples: dict[str, list[float]] = {k: [] for k in contenders}
    lost: dict[str, list[int]] = {k: [] for k in contenders}
    same: dict[str, list[bool]] = {k: [] for k in contenders}
    n = 0
    if ETCD_SPARE in contenders and not c.etcd_up():
        results[ETCD_SPARE] = "unavailable: scripts/etcd-server.sh up failed"
    with tempfile.TemporaryDirectory(prefix="xrun-bench-node-loss-") as tmp:
        ref = "" if smoke else _reference(tmp)
        for _ in range(faults):  # round-robin: one fault of each in turn
            for name, (spares, recover) in contenders.items():
                if name in results:
                    continue
                n += 1
                try:
                    secs, steps, sha = _fault(tmp, n, spares, recover, rng)
                except RunFailed as e:
                    results[name] = f"failed: {e}"
                    continue
                except Unavailable as e:
                    results[name] = f"unavailable: {e}"
                    continue
                samples[name].append(secs)
                lost[name].append(steps)
                same[name].append(sha == ref)
                print(f"  {name}: fault {len(samples[name])}: {secs:.3f} s, {steps} steps lost, "
                      f"bit-identical {sha == ref if ref else 'n/a'}", file=sys.stderr)  # fmt: skip
    note = []
    for name, xs in samples.items():
        if name not in results and xs:
            results[name] = Stats(xs)
        if xs:
            ident = f"{sum(same[name])} of {len(xs)}" if not smoke else "n/a"
            note.append(
                f"{name}: median {statistics.median(xs):.3f} s, p95 {_p95(xs):.3f} s, "
                f"n={len(xs)}, steps lost {sum(lost[name])} in all (max {max(lost[name])}), "
                f"bit-identical {ident}"
            )
    return [
        Row(
            "SIGKILL of a node (agent + 2 workers) of a 2x2 gloo DDP job + 1 spare -> "
            "first full-world step",
            "s",
            "spare warm <= 1 s median and <= 0.1x a worker's cold restart, 0 steps lost",
            results,
            subject="xrun spare, --recover warm",
            reference="xrun no spare, off, one worker killed",
            check=lambda r: _check(r, lost.get("xrun spare, --recover warm", [])),
            note="; ".join(note),
        )
    ]


def _check(results: Mapping[str, Stats | str], lost: list[int]) -> bool | None:
    warm, cold = (
        results.get("xrun spare, --recover warm"),
        results.get("xrun no spare, off, one worker killed"),
    )
    if not isinstance(warm, Stats) or not isinstance(cold, Stats):
        return None
    return warm.median <= 1.0 and warm.median <= 0.1 * cold.median and not any(lost)
