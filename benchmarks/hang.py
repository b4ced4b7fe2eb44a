"""Measure 15 (issue #24): a hang's autopsy, and what the diagnostics cost.

* Hang autopsy: TRIALS runs of a 2x2 gloo job on local_cwd (``xrun run -s local_cwd dist.ddp
  -j 2x2 --stall_timeout S``, workers/hang.py) with the hang at a random rank k. In each trial
  ``xrun stacks`` is asked while the job hangs (its odd group must be rank k alone, in
  ``stuck_here``), then the watchdog must end the job within S + 10 s of the hang with a root
  cause naming rank k and its frame. torchrun runs the same script once, stopped at a cap: how
  long it stays hung and what it printed.
* Cost: ``xrun stacks`` of a 1xN job (N = 64) on this machine; the watchdog's effect on a 1x4
  do-nothing job (measure 1's job, the agent alone) and on the agent's peak RSS (measure 4's).
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import threading
import time
from collections.abc import Callable, Mapping

from benchmarks import contenders as c
from benchmarks.harness import Row, RunFailed, Stats, at_most, interleave
from benchmarks.rss import peak_rss_mib

HANG = str(c.WORKERS / "hang.py")
SLEEP = str(c.WORKERS / "sleep.py")


def _xrun(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [c.tool("xrun"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "XDG_STATE_HOME": c._state_dir()},
    )


class _Job:
    """``xrun run --wait`` of a local_cwd job, its streamed log lines timestamped as they come."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(
            [c.tool("xrun"), "run", "--wait", "-s", "local_cwd", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **c.BASE_ENV, "XDG_STATE_HOME": c._state_dir()},
        )
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.handle = self.proc.stdout.readline().strip()
        self.lines: list[tuple[float, str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def when(self, text: str, timeout: float) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for t, line in list(self.lines):
                if text in line:
                    return t
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.05)
        raise RunFailed(f"{text!r} never appeared in the job's output ({self.handle})")

    def end(self, timeout: float) -> float:
        try:
            self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                _xrun("cancel", self.handle)
                self.proc.wait(60)
        self._reader.join(10)
        return time.monotonic()


def _trial(k: int, stall: int) -> dict[str, object]:
    """One hung 2x2 job: did `xrun stacks` single out rank k, when did the job end after the
    hang, and does its root cause name rank k and its frame."""
    job = _Job(
        ["dist.ddp", "-j", "2x2", "--rdzv_port", str(c.free_port())]
        + ["--stall_timeout", str(stall), "--script", HANG, "--", str(k)]
    )
    try:
        hung = job.when(f"hanging rank {k}", 120)
        time.sleep(1.0)  # the other ranks reach the all_reduce rank k never joins
        t0 = time.monotonic()
        st = _xrun("stacks", job.handle)
        stacks_s = time.monotonic() - t0
        first = st.stdout.splitlines()[0] if st.stdout else st.stderr.strip()
        odd = re.match(rf"4 ranks, 2 group\(s\): rank {k} in stuck_here \(hang\.py:\d+\); ", first)
        ended = job.end(stall + 60)
    except BaseException:
        _xrun("cancel", job.handle)
        raise
    cause = next((ln for _, ln in job.lines if f"stalled {stall} s: " in ln), "")
    return {
        "k": k,
        "stacks_odd_ok": bool(odd),
        "stacks_line": first,
        "stacks_s": stacks_s,
        "end_after_hang_s": ended - hung,
        "cause_ok": f"rank {k} in stuck_here (hang.py:" in cause,
        "cause": cause[cause.find("stalled") :],
    }


def _torchrun_hang(cap: float) -> tuple[float, str]:
    """torchrun (standalone 1 node x 4: torchrun's multi-node needs an etcd-free c10d pair,
    which gives the same picture) of the same script, stopped at ``cap``: the seconds it stayed
    hung and the last lines it printed."""
    argv = [c.tool("torchrun"), "--standalone", "--nproc-per-node", "4", "-t", "3", HANG, "1"]
    p = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **c.BASE_ENV},
    )
    lines: list[tuple[float, str]] = []

    def read() -> None:
        assert p.stdout is not None
        for line in p.stdout:
            lines.append((time.monotonic(), line.rstrip("\n")))

    th = threading.Thread(target=read, daemon=True)
    th.start()
    deadline = time.monotonic() + 120
    while not any("hanging rank 1" in ln for _, ln in lines) and time.monotonic() < deadline:
        time.sleep(0.05)
    hung = time.monotonic()
    try:
        p.wait(cap)
        stopped = time.monotonic()
    except subprocess.TimeoutExpired:
        stopped = time.monotonic()
        # SIGTERM, not SIGKILL: torchrun then stops its workers (they run in sessions of their
        # own and would outlive a killed torchrun).
        p.terminate()
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    th.join(10)
    # what it said while hung (its own shutdown messages after our SIGTERM are not that)
    after = [ln for t, ln in lines if hung + 0.5 < t < stopped]
    return stopped - hung, (" | ".join(after[-3:]) or "nothing")


def _autopsy(trials: int, stall: int, cap: float) -> list[Row]:
    rng = random.Random(24)
    results = [_trial(rng.randrange(4), stall) for _ in range(trials)]
    misses = sum(not r["stacks_odd_ok"] for r in results)
    cause_misses = sum(not r["cause_ok"] for r in results)
    ends = [float(str(r["end_after_hang_s"])) for r in results]
    bad = [r for r in results if not (r["stacks_odd_ok"] and r["cause_ok"])]
    rows = [
        Row(
            f"hang autopsy, {trials} trials of a 2x2 gloo job (hang at a random rank k): "
            "trials where `xrun stacks` did not show rank k alone in the odd group",
            "jobs",
            "0",
            results={"xrun": Stats([float(misses)])},
            check=lambda res: isinstance(res.get("xrun"), Stats) and res["xrun"].median == 0,
            note="; ".join(str(r["stacks_line"]) for r in bad[:2]),
        ),
        Row(
            f"... with --stall_timeout {stall}: trials whose root cause did not name rank k and "
            "its frame",
            "jobs",
            "0",
            results={"xrun": Stats([float(cause_misses)])},
            check=lambda res: isinstance(res.get("xrun"), Stats) and res["xrun"].median == 0,
            note=str(results[0]["cause"]) if results else "",
        ),
    ]
    tr_s, tr_said = _torchrun_hang(cap)
    end_row = Row(
        f"... seconds from the hang to the job's end (torchrun: stopped at the {cap:g} s cap)",
        "s",
        f"xrun every trial <= {stall + 10} s",
        results={"xrun": Stats(ends), "torchrun": Stats([tr_s])},
        check=lambda res: (
            isinstance(res.get("xrun"), Stats) and max(res["xrun"].samples) <= stall + 10
        ),
        note=f"torchrun printed after the hang: {tr_said}",
    )
    return [*rows, end_row]


def _stacks_cost(nproc: int, reps: int) -> Row:
    """`xrun stacks` of a 1xN job of sleeping workers, answered end to end."""
    job = _Job(["dist.ddp", "-j", f"1x{nproc}", "--script", SLEEP, "--", "600"])
    samples = []
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:  # every worker answers with a stack
            p = _xrun("stacks", "--json", job.handle)
            if p.returncode == 0:
                ranks = json.loads(p.stdout)["roles"].get("sleep", {})
                if len(ranks) == nproc and all(r.get("threads") for r in ranks.values()):
                    break
            time.sleep(0.5)
        for _ in range(reps):
            t0 = time.monotonic()
            p = _xrun("stacks", job.handle)
            samples.append(time.monotonic() - t0)
            if p.returncode != 0 or not p.stdout.startswith(f"{nproc} ranks, 1 group(s)"):
                raise RunFailed(f"xrun stacks: {p.stdout[:200]} {p.stderr[:200]}")
    finally:
        _xrun("cancel", job.handle)
        job.end(60)
    return Row(
        f"`xrun stacks` of a 1x{nproc} job, end to end",
        "s",
        "<= 3 s",
        results={"xrun": Stats(samples)},
        check=at_most("xrun", 3.0),
    )


def _with_stall(cmds: list[c.Cmd]) -> list[c.Cmd]:
    return [([*argv[:3], "--stall-timeout", "20", *argv[3:]], env) for argv, env in cmds]


def _watchdog_cost(reps: int, smoke: bool) -> list[Row]:
    noop = c.Job("noop.py", nproc=4)
    timed: Mapping[str, Callable[[], float]] = {
        "xrun-agent": lambda: c.timed(c.agent(noop)),
        "xrun-agent+stall": lambda: c.timed(_with_stall(c.agent(noop))),
    }
    launch = Row(
        "1x4 do-nothing job (measure 1), the agent with --stall-timeout 20 vs without",
        "s",
        "unchanged within noise (<= +0.05 s)",
        subject="xrun-agent+stall",
        reference="xrun-agent",
        check=lambda res: res["xrun-agent+stall"].median <= res["xrun-agent"].median + 0.05,
    )
    launch.results = interleave(timed, reps, warmup=not smoke)
    sleep = c.Job("sleep.py", args=("1.0" if not smoke else "0.5",), nproc=4)
    rss = Row(
        "agent peak RSS (VmHWM, measure 4's 1x4 job) with --stall-timeout 20",
        "MiB",
        "<= 25 MiB",
        subject="xrun-agent+stall",
        reference="xrun-agent",
        check=at_most("xrun-agent+stall", 25.0),
    )
    rss.results = interleave(
        {
            "xrun-agent": lambda: peak_rss_mib(c.agent(sleep)[0]),
            "xrun-agent+stall": lambda: peak_rss_mib(_with_stall(c.agent(sleep))[0]),
        },
        reps=min(reps, 3),
        warmup=False,
    )
    return [launch, rss]


def measure_16(reps: int, smoke: bool) -> list[Row]:
    trials, stall, cap, nproc = (1, 5, 10.0, 8) if smoke else (20, 20, 60.0, 64)
    rows = _autopsy(trials, stall, cap)
    rows.append(_stacks_cost(nproc, max(1, min(reps, 5))))
    return rows + _watchdog_cost(reps, smoke)
