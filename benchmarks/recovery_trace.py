"""Where the time of a ``--recover warm`` recovery goes (issue #34): one 1x4 job of
``examples/train_ddp.py --print-steps`` (steps of 0.1 s, through ``workers/trace_train.py``),
``kill -9`` of one worker, ``faults`` times; the agent and the workers append
``time.monotonic()`` marks to one file, and each fault's marks are printed relative to the kill.

    python -m benchmarks.recovery_trace [--faults 3] [--recover warm|off]

The agent is run in this file's ``agent`` mode: xrun's own agent with a few of its functions
wrapped to log when they begin and end (nothing else changes; xrun never imports this file).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACED = ROOT / "benchmarks" / "workers" / "trace_train.py"


def _mark(event: str) -> None:
    with open(os.path.join(os.environ["XRUN_TRACE_DIR"], "trace"), "a") as f:
        f.write(f"{time.monotonic():.6f} {os.getpid()} agent {event}\n")


def _wrap(owner: object, name: str, label: str | None = None) -> None:
    real = getattr(owner, name)
    label = label or name

    def wrapped(*a, **k):  # noqa: ANN002, ANN003, ANN202
        _mark(f"{label} begin")
        try:
            return real(*a, **k)
        finally:
            _mark(f"{label} end")

    setattr(owner, name, wrapped)


def agent(argv: list[str]) -> int:
    """xrun's agent, its recovery path timestamped."""
    from xrun.runtime import agent as ag
    from xrun.runtime.errors import rootcause
    from xrun.runtime.workers import api, pool

    _wrap(api.PContext, "_finish", "pc.finish (failure seen, survivors stopped)")
    _wrap(api.PContext, "_stop", "pc.stop")
    _wrap(rootcause, "explain_attempt")
    _wrap(ag.Agent, "_request_restart")
    _wrap(ag.Agent, "_start")
    _wrap(ag, "start_processes")
    _wrap(pool.WarmPool, "refill")
    if os.environ.get("XRUN_TRACE_FILL_ONCE"):  # an experiment: no refill after the first
        real_refill = pool.WarmPool.refill

        def refill(self, envs):  # noqa: ANN001, ANN202
            if not self._fills:
                real_refill(self, envs)

        pool.WarmPool.refill = refill
    real_start = pool.WarmPool.start

    def start(self, rank, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        ready = [c.check_ready() for c in self._idle]
        proc = real_start(self, rank, *a, **k)
        _mark(f"pool.start rank {rank} -> pid {proc.pid} (idle ready {ready})")
        return proc

    pool.WarmPool.start = start
    real_create = ag.create_handler

    def create_handler(*a, **k):  # noqa: ANN002, ANN003, ANN202
        h = real_create(*a, **k)
        _wrap(h, "next_rendezvous", "next_rendezvous")
        return h

    ag.create_handler = create_handler
    from xrun.runtime.__main__ import main

    return main(argv)


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            out += [int(x) for x in task.read_text().split()]
        except OSError:
            pass
    return out


def drill(faults: int, recover: str, settle: float, size: int = 0) -> list[list[tuple[float, str]]]:
    from benchmarks import recovery as rec

    rng = random.Random(37)
    with tempfile.TemporaryDirectory(prefix="xrun-trace-") as tmp:
        os.environ["XRUN_TRACE_DIR"] = tmp
        trace = os.path.join(tmp, "trace")
        cmd = [sys.executable, "-m", "benchmarks.recovery_trace", "agent", "--standalone",
               "--nproc-per-node", "4", "--max-restarts", str(faults), "--tee", "3",
               "--recover", recover, *(["--warm-pool-size", str(size)] if size else []),
               str(TRACED), *rec._script(tmp)[1:]]  # fmt: skip
        job = rec._Job(cmd, str(ROOT))
        kills = []
        try:
            for f in range(faults):
                job.until(lambda ln, f=f: f"started (restart {f})" in ln, 600)
                for _ in range(rng.randint(5, 15)):
                    job.until(lambda ln: rec._STEP.search(ln) is not None, 120)
                deadline = time.monotonic() + 300
                while (
                    recover == "warm"
                    and time.monotonic() < deadline
                    and (rec._ready(job.proc.pid) < 4 or time.monotonic() < job.started + settle)
                ):
                    time.sleep(0.1)
                workers = [k for k in _children(job.proc.pid) if rec._comm(k) != "xrun-warm"]
                while not job.lines.empty():
                    job.lines.get_nowait()
                victim = rng.choice(workers)
                t0 = time.monotonic()
                os.kill(victim, signal.SIGKILL)
                with open(trace, "a") as fh:
                    fh.write(f"{t0:.6f} {victim} driver KILL\n")
                job.until(lambda ln, f=f: f"started (restart {f + 1})" in ln, 600)
                t1 = job.until(lambda ln: rec._STEP.search(ln) is not None, 600)
                with open(trace, "a") as fh:
                    fh.write(f"{t1:.6f} 0 driver FIRST-STEP-LINE ({t1 - t0:.3f} s)\n")
                kills.append((t0, t1))
                print(f"fault {f + 1}: {t1 - t0:.3f} s", file=sys.stderr)
                job.lines.put((t1, f"rank 0/4: started (restart {f + 1})"))
        finally:
            job.stop()
        lines = []
        for ln in Path(trace).read_text().splitlines():
            t, rest = ln.split(" ", 1)
            lines.append((float(t), rest))
    lines.sort()
    out = []
    for t0, t1 in kills:
        out.append([(t - t0, e) for t, e in lines if t0 - 0.001 <= t <= t1 + 0.001])
    return out


def _rollup(pid: int) -> dict[str, int]:
    """kB figures of /proc/PID/smaps_rollup (Rss, Pss, Pss_Anon, Pss_File, ...)."""
    out = {}
    for ln in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        k, v = ln.split(":", 1)
        out[k] = int(v.split()[0])
    return out


def _cpu_s(pid: int) -> float:
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def memory(settle: float, idle_s: float) -> None:
    """The pool's memory per warm interpreter (PSS: shared pages divided among their users)
    and CPU while idle, beside the workers' own, in a 1x4 train_ddp job."""
    from benchmarks import recovery as rec

    with tempfile.TemporaryDirectory(prefix="xrun-mem-") as tmp:
        cmd = [sys.executable, "-m", "xrun.runtime", "--standalone", "--nproc-per-node", "4",
               "--max-restarts", "1", "--tee", "3", "--recover", "warm", *rec._script(tmp)]  # fmt: skip
        job = rec._Job(cmd, str(ROOT))
        try:
            job.until(lambda ln: "started (restart 0)" in ln, 600)
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and (
                rec._ready(job.proc.pid) < 4 or time.monotonic() < job.started + settle
            ):
                time.sleep(0.5)
            kids = _children(job.proc.pid)
            warm = [k for k in kids if rec._comm(k) == "xrun-warm"]
            workers = [k for k in kids if k not in warm]
            cpu0 = {k: _cpu_s(k) for k in warm}
            time.sleep(idle_s)
            cpu = {k: _cpu_s(k) - cpu0[k] for k in warm}
            for name, pids in (("warm interpreter (idle)", warm), ("worker (training)", workers)):
                for k in pids:
                    r = _rollup(k)
                    extra = (
                        f"  cpu {cpu[k] / idle_s * 100:.2f}% over {idle_s:g}s" if k in cpu else ""
                    )
                    print(f"{name:24s} pid {k}: Rss {r['Rss'] / 1024:7.1f} MiB  Pss {r['Pss'] / 1024:7.1f} MiB"
                          f"  Pss_Anon {r['Pss_Anon'] / 1024:7.1f} MiB  Pss_File {r['Pss_File'] / 1024:6.1f} MiB{extra}")  # fmt: skip
            agent = _rollup(job.proc.pid)
            print(
                f"{'agent':24s} pid {job.proc.pid}: Rss {agent['Rss'] / 1024:7.1f} MiB  Pss {agent['Pss'] / 1024:7.1f} MiB"
            )
        finally:
            job.stop()


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "agent":
        return agent(sys.argv[2:])
    p = argparse.ArgumentParser()
    p.add_argument("--faults", type=int, default=3)
    p.add_argument("--recover", default="warm")
    p.add_argument("--pool-size", type=int, default=0)
    p.add_argument("--settle", type=float, default=30.0, help="job age before the first kill")
    p.add_argument("--memory", action="store_true", help="the pool's memory and idle CPU")
    a = p.parse_args()
    if a.memory:
        memory(a.settle, 20.0)
        return 0
    totals = []
    for i, events in enumerate(drill(a.faults, a.recover, a.settle, a.pool_size)):
        print(f"--- fault {i + 1} (seconds after the kill)")
        for dt, e in events:
            print(f"{dt:8.3f}  {e}")
        totals.append(events[-1][0])
    print(f"median kill -> first full step: {statistics.median(totals):.3f} s  {totals}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
