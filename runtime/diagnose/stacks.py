"""Every local worker's Python stack, all threads, read from outside the process by py-spy.

py-spy (``pip install 'xrun[stacks]'``, a binary) reads a CPython process's memory through
ptrace: the worker needs no cooperation code, and a worker stuck in C (a collective, a lock, a
``sleep``) answers as well as one running Python. It runs as an executable, never imported, so
the agent stays standard library only. One py-spy per worker, all started at once: a dump takes
tens of milliseconds, mostly waiting on the target, so 64 ranks fit the 3 s budget on 2 cores
(``benchmarks/hang.py`` measures it).

A rank's answer is a plain JSON-able dict (it crosses to the CLI in a file)::

    {"local_rank": 0, "pid": 123, "threads": [{"name": "MainThread", "main": true,
      "frames": [{"name": "stuck_here", "file": "/job/hang.py", "line": 14}, ...]}]}
    {"local_rank": 1, "pid": 124, "error": "no Python stack: pid 124 runs sleep ..."}

Frames are innermost first (py-spy's order).
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from typing import IO, Any

__all__ = ["PYSPY_ENV", "RankStacks", "collect", "find_pyspy", "missing_pyspy"]

RankStacks = dict[str, Any]

# An explicit py-spy executable (e.g. one outside PATH); otherwise next to the agent's Python,
# then on PATH.
PYSPY_ENV = "XRUN_PYSPY"
_FIX = "pip install 'xrun[stacks]' (py-spy) or run bash scripts/setup.sh"


def find_pyspy() -> str | None:
    """The py-spy executable to run, or None."""
    explicit = os.environ.get(PYSPY_ENV)
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if os.access(beside, os.X_OK):
        return beside
    return shutil.which("py-spy")


def missing_pyspy() -> str:
    """The one line saying py-spy is missing, with the fix."""
    where = os.environ.get(PYSPY_ENV) or "PATH or next to " + sys.executable
    return f"py-spy was not found ({where}): {_FIX}"


def collect(workers: Mapping[int, tuple[int, int]], timeout: float = 5.0) -> dict[int, RankStacks]:
    """Stacks of ``workers`` (global rank -> (local rank, pid)), read in parallel; a rank that
    cannot be read gets an ``error`` line instead (py-spy missing, not Python, no permission,
    gone, too slow). Never raises for a rank; returns within about ``timeout`` seconds."""
    exe = find_pyspy()
    out: dict[int, RankStacks] = {}
    if exe is None:
        line = missing_pyspy()
        return {
            r: {"local_rank": lr, "pid": pid, "error": line} for r, (lr, pid) in workers.items()
        }
    running: dict[int, tuple[subprocess.Popen[bytes], IO[bytes], IO[bytes]]] = {}
    for rank, (_, pid) in workers.items():
        # Files, not pipes: a dump of many threads may exceed a pipe's buffer, and reading 64
        # pipes would need a selector; a file never blocks the writer.
        so: IO[bytes] = tempfile.TemporaryFile()
        se: IO[bytes] = tempfile.TemporaryFile()
        try:
            proc = subprocess.Popen(
                [exe, "dump", "--json", "--pid", str(pid)],
                stdout=so,
                stderr=se,
                stdin=subprocess.DEVNULL,
            )
        except OSError as e:
            so.close()
            se.close()
            lr = workers[rank][0]
            out[rank] = {"local_rank": lr, "pid": pid, "error": f"could not run {exe}: {e}"}
            continue
        running[rank] = (proc, so, se)
    deadline = time.monotonic() + timeout
    _wait_exits([proc for proc, _, _ in running.values()], deadline)
    for rank, (proc, so, se) in running.items():
        lr, pid = workers[rank]
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            out[rank] = {
                "local_rank": lr,
                "pid": pid,
                "error": f"py-spy did not answer within {timeout:g}s",
            }
            so.close()
            se.close()
            continue
        so.seek(0)
        se.seek(0)
        stdout, stderr = so.read(), se.read()
        so.close()
        se.close()
        out[rank] = {"local_rank": lr, "pid": pid, **_parse(proc.returncode, stdout, stderr, pid)}
    return dict(sorted(out.items()))


def _wait_exits(procs: list[subprocess.Popen[bytes]], deadline: float) -> None:
    """Block until every one of ``procs`` has exited or ``deadline`` (monotonic) has passed,
    woken by each exit (a pidfd per process; the caller then reaps them without waiting).

    Not ``Popen.wait(timeout)``: it polls, sleeping 1, 2, 4 ... 32, then 50 ms between looks,
    so a dump that ends just after a look is seen up to 50 ms late. A dump takes tens of ms,
    right where those looks fall, so a few ms more or less of py-spy's own time moved a failed
    attempt's restart by 32 or 50 ms (benchmark 7, 2 nodes: +45 ms at the median between two
    commits that only moved timings; docs/benchmark-runs/2026-11-27-restart-wait.txt).
    Without pidfds (Linux < 5.3) this returns at once and the caller's ``Popen.wait`` polls."""
    fds: list[int] = []
    try:
        for p in procs:
            fds.append(os.pidfd_open(p.pid))
    except (AttributeError, OSError):
        for fd in fds:
            os.close(fd)
        return
    try:
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        left = len(fds)
        while left:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            for fd, _ in poller.poll(remaining * 1000):
                poller.unregister(fd)  # a pidfd stays readable once its process has exited
                left -= 1
    finally:
        for fd in fds:
            os.close(fd)


def _parse(code: int, stdout: bytes, stderr: bytes, pid: int) -> RankStacks:
    if code == 0:
        try:
            threads = json.loads(stdout)
        except ValueError:
            return {"error": "py-spy printed no readable stack"}
        return {"threads": [_thread(t, pid) for t in threads if isinstance(t, dict)]}
    return {"error": _why(stderr.decode(errors="replace"), pid)}


def _thread(t: dict[str, Any], pid: int) -> dict[str, Any]:
    frames = [
        {
            "name": str(f.get("name", "?")),
            "file": str(f.get("filename", "?")),
            "line": f.get("line", 0),
        }
        for f in t.get("frames") or ()
        if isinstance(f, dict)
    ]
    name = t.get("thread_name") or f"thread {t.get('os_thread_id', '?')}"
    # The main thread's OS id is the process id (Linux); py-spy may not know a thread's name.
    return {"name": str(name), "main": t.get("os_thread_id") == pid, "frames": frames}


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def _why(err: str, pid: int) -> str:
    """One line for py-spy's failure (its stderr ends with a Rust backtrace)."""
    low = err.lower()
    if "python version" in low or "python interpreter" in low or "libpython" in low:
        return f"no Python stack: pid {pid} runs {_comm(pid)}, not a Python interpreter"
    if "permission denied" in low or "operation not permitted" in low:
        return (
            f"no permission to read pid {pid} (ptrace): run as the worker's user with "
            "kernel.yama.ptrace_scope=0 (sysctl), or give the container CAP_SYS_PTRACE"
        )
    if "no such process" in low or not os.path.exists(f"/proc/{pid}"):
        return f"pid {pid} has exited"
    first = next((ln.strip() for ln in err.splitlines() if ln.strip()), "no message")
    return f"py-spy failed: {first[:200]}"
