"""Measure 16 (issue #24): a hang's autopsy, and what the diagnostics cost.

* Hang autopsy: TRIALS runs of a 2x2 job with the hang at a random rank k, on local_cwd (20
  trials, ``xrun run -s local_cwd dist.ddp -j 2x2 --stall_timeout S``, a gloo job:
  workers/hang.py) and on the suite's real backends: slurm (5 trials, the same gloo job on two
  nodes of the test cluster) and docker (5 trials, two containers; the xrun-python image has no
  torch, so workers/park.py parks the ranks where a hung collective would). In each trial
  ``xrun stacks`` is asked while the job hangs (its odd group must be rank k alone, in
  ``stuck_here``), then the watchdog must end the job within S + 10 s of the hang, and ``xrun
  status`` must name rank k and its frame as the root cause. torchrun runs the gloo script once,
  stopped at a cap: how long it stays hung and what it printed.
* Cost: ``xrun stacks`` of a 1xN job (N = 64) on this machine; the watchdog's effect on a 1x4
  do-nothing job (measure 1's job, the agent alone) and on the agent's peak RSS (measure 4's).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping

from benchmarks import contenders as c
from benchmarks.harness import Row, RunFailed, Stats, Unavailable, at_most, interleave
from benchmarks.rss import peak_rss_mib

HANG = str(c.WORKERS / "hang.py")
PARK = str(c.WORKERS / "park.py")
SLEEP = str(c.WORKERS / "sleep.py")
BACKENDS = ("local_cwd", "docker", "slurm")


def _xrun(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [c.tool("xrun"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "XDG_STATE_HOME": c._state_dir()},
    )


class _Job:
    """``xrun run --wait --log`` of a job, its streamed log lines timestamped as they come."""

    def __init__(self, argv: list[str], scheduler: str = "local_cwd", cwd: str | None = None):
        self.proc = subprocess.Popen(
            [c.tool("xrun"), "run", "--wait", "--log", "-s", scheduler, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=cwd,
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


def _job_argv(backend: str, k: int, stall: int) -> list[str]:
    """The 2x2 dist.ddp job with the hang at rank k, as ``backend`` runs it (from a dir holding
    its script: docker's workspace, slurm's shared job dir)."""
    argv = ["dist.ddp", "-j", "2x2", "--stall_timeout", str(stall)]
    if backend == "docker":  # no torch in the image: park.py, the torch-free hang
        return [*argv, "--image", "xrun-python:latest", "--script", "park.py", "--", str(k)]
    if backend == "slurm":  # the test cluster's nodes are small
        argv += ["--cpu", "1", "--memMB", "512"]
    return [*argv, "--rdzv_port", str(c.free_port()), "--script", "hang.py", "--", str(k)]


def _check_backend(backend: str) -> None:
    """Unavailable unless ``backend`` answers here (the suite's scripts start them)."""
    if backend == "slurm":
        c.require_slurm()
    elif backend == "docker":
        probe = ["docker", "image", "inspect", "xrun-python:latest"]
        if (
            shutil.which("docker") is None
            or subprocess.run(probe, capture_output=True, timeout=60).returncode
        ):
            raise Unavailable("no Docker Engine with xrun-python (scripts/docker-engine.sh image)")


def _trial(backend: str, k: int, stall: int) -> dict[str, object]:
    """One hung 2x2 job: did `xrun stacks` single out rank k, when did the job end after the
    hang, and does `xrun status` name rank k and its frame as the root cause."""
    with tempfile.TemporaryDirectory(prefix="xrun-bench-hang-") as cwd:
        for script in (HANG, PARK):
            shutil.copy(script, cwd)
        job = _Job(_job_argv(backend, k, stall), backend, cwd)
        try:
            hung = job.when(f"hanging rank {k}", 180)
            # The other ranks reach the all_reduce rank k never joins within about a second on
            # a quiet box; on a busy one they may still be on their way: look again (as a user
            # would), at most 3 times, while the job is still hung.
            for attempt in range(3):
                time.sleep(1.0)
                t0 = time.monotonic()
                st = _xrun("stacks", job.handle)
                stacks_s = time.monotonic() - t0
                first = st.stdout.splitlines()[0] if st.stdout else st.stderr.strip()
                odd = re.match(
                    rf"4 ranks, 2 group\(s\): rank {k} in stuck_here \(\w+\.py:\d+\); ", first
                )
                if odd or attempt == 2 or not re.match(r"4 ranks, \d+ group", first):
                    break
            ended = job.end(stall + 60)
        except BaseException:
            _xrun("cancel", job.handle)
            raise
        status = _xrun("status", job.handle).stdout  # slurm reads it from the job dir, cwd
    cause = next((ln for ln in status.splitlines() if ln.startswith("Error: ")), "")
    return {
        "k": k,
        "stacks_odd_ok": bool(odd),
        "stacks_line": first,
        "stacks_s": stacks_s,
        "end_after_hang_s": ended - hung,
        "cause_ok": re.search(rf"stalled {stall} s: rank {k} in stuck_here \(\w+\.py:", cause)
        is not None,
        "cause": cause.removeprefix("Error: ") or status[-300:],
    }


def _trials(backend: str, trials: int, stall: int, rng: random.Random) -> list[dict[str, object]]:
    _check_backend(backend)
    return [_trial(backend, rng.randrange(4), stall) for _ in range(trials)]


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


def _autopsy(trials: Mapping[str, int], stall: int, cap: float) -> list[Row]:
    """Rows per question, a contender per backend ("xrun local_cwd", ...)."""
    rng = random.Random(24)
    runs: dict[str, list[dict[str, object]] | str] = {}
    for backend, n in trials.items():
        try:
            runs[backend] = _trials(backend, n, stall, rng)
        except Unavailable as e:
            runs[backend] = f"unavailable: {e}"
        except Exception as e:  # noqa: BLE001 - a broken backend is a result, not a crash
            runs[backend] = f"failed: {type(e).__name__}: {str(e)[:300]}"

    def per_backend(
        value: Callable[[list[dict[str, object]]], list[float]],
    ) -> dict[str, Stats | str]:
        return {f"xrun {b}": r if isinstance(r, str) else Stats(value(r)) for b, r in runs.items()}

    def all_zero(res: Mapping[str, Stats | str]) -> bool | None:
        got = [v for v in res.values() if isinstance(v, Stats)]
        return None if not got else len(got) == len(res) and all(v.median == 0 for v in got)

    done = [r for rs in runs.values() if not isinstance(rs, str) for r in rs]
    bad = [r for r in done if not (r["stacks_odd_ok"] and r["cause_ok"])]
    where = ", ".join(f"{n} on {b}" for b, n in trials.items())
    rows = [
        Row(
            f"hang autopsy, 2x2 jobs with the hang at a random rank k ({where}): trials where "
            "`xrun stacks` did not show rank k alone in the odd group",
            "jobs",
            "0 on every backend",
            results=per_backend(lambda rs: [float(sum(not r["stacks_odd_ok"] for r in rs))]),
            check=all_zero,
            note="; ".join(str(r["stacks_line"]) for r in bad[:2]),
        ),
        Row(
            f"... with --stall_timeout {stall}: trials whose `xrun status` root cause did not "
            "name rank k and its frame",
            "jobs",
            "0 on every backend",
            results=per_backend(lambda rs: [float(sum(not r["cause_ok"] for r in rs))]),
            check=all_zero,
            note=str(done[0]["cause"]) if done else "",
        ),
    ]
    tr_s, tr_said = _torchrun_hang(cap)
    ends = per_backend(lambda rs: [float(str(r["end_after_hang_s"])) for r in rs])
    end_row = Row(
        f"... seconds from the hang to the job's end (torchrun: stopped at the {cap:g} s cap)",
        "s",
        f"xrun every trial <= {stall + 10} s",
        results={**ends, "torchrun": Stats([tr_s])},
        check=lambda res: (
            None
            if not any(isinstance(v, Stats) for k, v in res.items() if k != "torchrun")
            else all(
                isinstance(v, Stats) and max(v.samples) <= stall + 10
                for k, v in res.items()
                if k != "torchrun"
            )
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
    # 5 trials on each of the suite's real backends (1 in the smoke run, so they keep working)
    per = {"local_cwd": trials, "docker": min(trials, 5), "slurm": min(trials, 5)}
    rows = _autopsy(per, stall, cap)
    rows.append(_stacks_cost(nproc, max(1, min(reps, 5))))
    return rows + _watchdog_cost(reps, smoke)
