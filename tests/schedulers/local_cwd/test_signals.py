"""Signals on local_cwd (issue #7 item 3), through the real ``xrun`` CLI and real processes.

The workers (a torch-free script written by the test) record SIGTERM in a marker file; rank 1
is stubborn: it records SIGTERM and keeps running, so only SIGKILL ends it.

* ``xrun cancel``: the supervisor SIGTERMs the replica (the runtime agent), the agent forwards
  SIGTERM to every worker, and after ``stop_grace_s`` the supervisor SIGKILLs the replica's
  group; the stubborn worker dies with its agent (PR_SET_PDEATHSIG). The app ends CANCELLED and
  ``xrun run`` (which waits on local_cwd) exits 1 (documented: 0 only for SUCCEEDED).
* SIGTERM to the agent process itself: it forwards SIGTERM to the workers, SIGKILLs the stubborn
  one after its shutdown timeout (``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``) and exits 143 (128 +
  SIGTERM); the app ends FAILED with that exit code (gang semantics: a replica that exits
  non-zero fails the app).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import chaos as procs
from tests.helpers.paths import XRUN

GRACE_S = 2.0

WORKER = """
import os, signal, sys, time

marks, rank = sys.argv[1], os.environ["RANK"]

def on_term(signum, frame):
    with open(os.path.join(marks, rank + ".term"), "w") as f:
        f.write(repr(time.time()))
    if rank != "1":  # rank 1 is stubborn: only SIGKILL ends it
        sys.exit(0)

signal.signal(signal.SIGTERM, on_term)
with open(os.path.join(marks, rank + ".ready"), "w") as f:
    f.write(str(os.getpid()))
while True:
    time.sleep(0.05)
"""


def wait_for(cond: Callable[[], bool], timeout: float, what: str) -> float:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)
    return time.monotonic()


def start_job(tmp: Path, *extra: str) -> tuple[subprocess.Popen[str], str, Path, dict[int, int]]:
    """``xrun run`` a 1x2 job of WORKER; return the CLI process, the handle, the marker dir and
    the workers' pids by rank once both are up."""
    script = tmp / "sigworker.py"
    script.write_text(WORKER)
    marks = tmp / "marks"
    marks.mkdir()
    proc = subprocess.Popen(
        [
            XRUN,
            "run",
            "-s",
            "local_cwd",
            "-cfg",
            f"stop_grace_s={GRACE_S}",
            "dist.ddp",
            "-j",
            "1x2",
            *extra,
            "--script",
            str(script),
            "--",
            str(marks),
        ],
        cwd=tmp,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    handle = proc.stdout.readline().strip()
    assert handle.startswith("local_cwd://"), handle
    wait_for(lambda: all((marks / f"{r}.ready").exists() for r in "01"), 60, "both workers")
    time.sleep(0.1)  # the ready file is written before its content is flushed by close()
    pids = {r: int((marks / f"{r}.ready").read_text()) for r in (0, 1)}
    return proc, handle, marks, pids


def status(handle: str) -> str:
    return subprocess.run(
        [XRUN, "status", handle], capture_output=True, text=True, timeout=30
    ).stdout


@pytest.mark.timeout(90)
def test_cancel_sigterms_workers_then_sigkills_the_stubborn_one(tmp_path: Path) -> None:
    proc, handle, marks, pids = start_job(tmp_path)
    try:
        t0 = time.monotonic()
        # `cancel` returns once the app has ended (after the grace period): watch meanwhile.
        cancel = subprocess.Popen(
            [XRUN, "cancel", handle], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        # Both workers got SIGTERM; the obedient one exits at once.
        wait_for(lambda: all((marks / f"{r}.term").exists() for r in "01"), 10, "SIGTERM marks")
        t_obedient = wait_for(lambda: not procs.alive(pids[0]), 10, "rank 0 to exit")
        assert t_obedient - t0 < GRACE_S, "the obedient worker outlived the grace period"
        # The stubborn one lives through the grace period, then is SIGKILLed.
        t_stubborn = wait_for(lambda: not procs.alive(pids[1]), GRACE_S + 15, "rank 1 to die")
        assert t_stubborn - t0 >= GRACE_S - 0.2, (
            f"the stubborn worker died {t_stubborn - t0:.2f} s after cancel, before the "
            f"{GRACE_S} s grace period"
        )
        cancel_out, _ = cancel.communicate(timeout=30)
        assert cancel.returncode == 0, cancel_out
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            subprocess.run([XRUN, "cancel", handle], capture_output=True, timeout=30)
    assert proc.returncode == 1, err
    assert f"{handle} ended CANCELLED" in err
    assert "State: CANCELLED" in status(handle)


@pytest.mark.timeout(90)
def test_sigterm_to_the_agent_stops_workers_and_fails_the_app(tmp_path: Path) -> None:
    shutdown_s = 1.5
    proc, handle, marks, pids = start_job(
        tmp_path, "--env", f"TORCH_ELASTIC_SHUTDOWN_TIMEOUT={shutdown_s}"
    )
    try:
        agent = procs.ppid(pids[0])
        assert "xrun.runtime" in procs.cmdline(agent), procs.cmdline(agent)
        t0 = time.monotonic()
        os.kill(agent, 15)
        wait_for(lambda: all((marks / f"{r}.term").exists() for r in "01"), 10, "SIGTERM marks")
        t_stubborn = wait_for(lambda: not procs.alive(pids[1]), shutdown_s + 15, "rank 1 to die")
        assert t_stubborn - t0 >= shutdown_s - 0.2, (
            f"the stubborn worker died {t_stubborn - t0:.2f} s after SIGTERM, before the agent's "
            f"{shutdown_s} s shutdown timeout"
        )
        assert not procs.alive(pids[0])
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            subprocess.run([XRUN, "cancel", handle], capture_output=True, timeout=30)
    assert proc.returncode == 1, err
    assert f"{handle} ended FAILED" in err
    st = status(handle)
    assert "State: FAILED" in st and "exit_code=143" in st, st
