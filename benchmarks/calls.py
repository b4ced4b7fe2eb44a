"""Measure 22 (issue #36): Python callables on the Slurm cluster, xrun beside submitit 1.5.4.

A trivial function (``x + 1``, defined in the driver's ``__main__``: both pickle it by value) is
submitted to the suite's Slurm cluster by workers/calls_driver.py: ``reps`` single calls, each
timed from the submit to its result, then one map of ``XRUN_BENCH_CALLS_MAP`` calls (default
100; 10 with ``--smoke``) from the submit to the last result: ``xrun.Executor("slurm").map_array``
and submitit's ``AutoExecutor.map_array``, each one job array. The two contenders run in turn,
each in its own interpreter (submitit in its venv, ``preemption.submitit_python``; not in
``--smoke``, whose CI has no package index); one CPU and 256 MB per call for both.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from collections.abc import Mapping

from benchmarks import contenders as c
from benchmarks.harness import Row, RunFailed, Stats, Unavailable, one_line

DRIVER = c.WORKERS / "calls_driver.py"


def _drive(which: str, singles: int, n: int) -> dict[str, object]:
    if which == "submitit":
        from benchmarks.preemption import submitit_python

        py = submitit_python()
    else:
        py = c.PYTHON
    tag = f"bench-calls-{which}-{os.getpid()}"  # every job's name: scancel'ed at the end
    # the last array tasks may still be writing their logs when the driver has every result
    with tempfile.TemporaryDirectory(prefix="xrun-bench-calls-", ignore_cleanup_errors=True) as tmp:
        env = {**os.environ, "XDG_STATE_HOME": os.path.join(tmp, "state")}
        argv = [py, str(DRIVER), which, os.path.join(tmp, "calls"), str(singles), str(n), tag]
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=1800, cwd=tmp, env=env)
        except subprocess.TimeoutExpired:
            raise RunFailed("the driver did not finish in 1800 s") from None
        finally:  # a driver that failed or timed out leaves no job behind
            subprocess.run(["scancel", "--name", tag], capture_output=True, timeout=60)
            _gone(tag, 60)
    if p.returncode:
        raise RunFailed(f"exit {p.returncode}: {one_line(p.stderr[-1500:])}")
    out: dict[str, object] = json.loads(p.stdout.strip().splitlines()[-1])
    return out


def _gone(tag: str, timeout: float) -> None:
    """Wait (at most ``timeout`` s) until no job named ``tag`` is left in squeue."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        q = subprocess.run(["squeue", "-h", "--name", tag, "-o", "%i"], capture_output=True,
                           text=True, timeout=60)  # fmt: skip
        if q.returncode == 0 and not q.stdout.strip():
            return
        time.sleep(0.5)


def measure_22(reps: int, smoke: bool) -> list[Row]:
    n = int(os.environ.get("XRUN_BENCH_CALLS_MAP", 10 if smoke else 100))
    names = ["xrun"] if smoke else ["xrun", "submitit"]
    one: dict[str, Stats | str] = {}
    many: dict[str, Stats | str] = {}
    try:
        c.require_slurm()
    except Unavailable as e:
        one = dict.fromkeys(names, f"unavailable: {e}")
        many = dict(one)
    else:
        for rep in range(1 if smoke else 2):  # two rounds, in turn: neither always goes first
            for name in names if rep % 2 == 0 else names[::-1]:
                if name in one and isinstance(one[name], str):
                    continue
                try:
                    got = _drive(name, max(1, reps // 2) if not smoke else 1, n if rep == 0 else 0)
                except (RunFailed, Unavailable) as e:
                    kind = "unavailable" if isinstance(e, Unavailable) else "failed"
                    one[name] = many[name] = f"{kind}: {e}"
                    continue
                prev = one.get(name)
                xs = [*(prev.samples if isinstance(prev, Stats) else []), *got["one"]]  # type: ignore[misc]
                one[name] = Stats([float(x) for x in xs])
                if got["map"] is not None:
                    many[name] = Stats([float(got["map"])])  # type: ignore[arg-type]
    return [
        Row("a trivial function on Slurm (1 CPU), submit -> result", "s",
            "xrun <= submitit", one, reference="submitit", check=_no_slower,
            note="single calls in two rounds, in turn (xrun first, then submitit first)"),
        Row(f"a map of {n} calls (one job array each), submit -> every result", "s",
            "xrun <= submitit", many, reference="submitit",
            check=_no_slower, note="one map each, in the first round (xrun's first)"),
    ]  # fmt: skip


def _no_slower(results: Mapping[str, Stats | str]) -> bool | None:
    x, s = results.get("xrun"), results.get("submitit")
    if not isinstance(x, Stats) or not isinstance(s, Stats):
        return None
    return x.median <= s.median
