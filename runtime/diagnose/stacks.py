"""Every local worker's Python stack, all threads, read from outside the process by py-spy.

py-spy (a dependency of xrun, pinned: a binary wheel, its executable in the environment's
scripts dir) reads a CPython process's memory through
ptrace: the worker needs no cooperation code, and a worker stuck in C (a collective, a lock, a
``sleep``) answers as well as one running Python. It runs as an executable, never imported, so
the agent stays standard library only. One py-spy per worker, all started at once: a dump takes
tens of milliseconds, mostly waiting on the target, so 64 ranks fit the 3 s budget on 2 cores
(``benchmarks/hang.py`` measures it).

A rank's answer is a plain JSON-able dict (it crosses to the CLI in a file)::

    {"local_rank": 0, "pid": 123, "threads": [{"name": "MainThread", "main": true,
      "frames": [{"name": "stuck_here", "file": "/job/hang.py", "line": 14}, ...]}]}
    {"local_rank": 1, "pid": 124, "error": "no Python stack: pid 124 runs sleep ..."}
    {"local_rank": 2, "pid": 125, "exiting": true, "error": "is exiting (interpreter shutdown;
      no Python frames) after RuntimeError in barrier (train.py:9)", "traceback": [frames]}

Frames are innermost first (py-spy's order). An ``error`` that starts with ``is`` reads after
the rank: ``rank 2 is exiting (...)``, ``rank 0 is stopped (SIGSTOP/SIGTSTP)``.

A Python worker past its last frame (its exception printed, or in interpreter shutdown: torch's
finalizers, a gloo teardown) shows py-spy a main thread without frames, or cannot be read at
all; it is *exiting*. A survivor of a failed rank is often one: its collective failed when the
failed rank's sockets closed, before the agent could look. The last traceback in its stderr
file (when the agent keeps one) then says where it was, e.g. in ``barrier``.
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from typing import IO, Any

from .activity import proc_state

__all__ = ["PYSPY_ENV", "RankStacks", "collect", "find_pyspy", "missing_pyspy"]

RankStacks = dict[str, Any]

# An explicit py-spy executable (e.g. one outside PATH); otherwise next to the agent's Python,
# then in its install schemes' scripts dirs (a venv's bin, ~/.local/bin of `pip install --user`),
# then on PATH.
PYSPY_ENV = "XRUN_PYSPY"


def find_pyspy() -> str | None:
    """The py-spy executable to run, or None."""
    explicit = os.environ.get(PYSPY_ENV)
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    for d in _scripts_dirs():
        exe = os.path.join(d, "py-spy")
        if os.access(exe, os.X_OK):
            return exe
    return shutil.which("py-spy")


def _scripts_dirs() -> list[str]:
    import sysconfig  # only when stacks are read

    dirs = [os.path.dirname(sys.executable)]
    for scheme in (sysconfig.get_default_scheme(), f"{os.name}_user"):
        try:
            dirs.append(sysconfig.get_path("scripts", scheme))
        except KeyError:  # no such scheme on this platform
            continue
    return list(dict.fromkeys(dirs))


def missing_pyspy() -> str:
    """The one line saying py-spy is missing, with the fix."""
    explicit = os.environ.get(PYSPY_ENV)
    if explicit:
        return f"py-spy was not found: {PYSPY_ENV}={explicit} is no executable file"
    return (
        f"py-spy was not found (in {', '.join(_scripts_dirs())} or on PATH): it is a dependency "
        f"of xrun, so reinstall xrun (pip install xrun), or set {PYSPY_ENV}=/path/to/py-spy"
    )


EXITING = "is exiting (interpreter shutdown; no Python frames)"
STOPPED = {"T": "is stopped (SIGSTOP/SIGTSTP)", "t": "is stopped by a debugger (ptrace)"}
_TAIL_BYTES = 64 * 1024


def collect(
    workers: Mapping[int, tuple[int, int]],
    timeout: float = 5.0,
    stderrs: Mapping[int, str] | None = None,
    local_vars: bool = False,
) -> dict[int, RankStacks]:
    """Stacks of ``workers`` (global rank -> (local rank, pid)), read in parallel; a rank that
    cannot be read gets an ``error`` line instead (py-spy missing, not Python, no permission,
    stopped, exiting, gone, too slow). ``stderrs``: global rank -> its stderr file, for the
    last traceback of an exiting rank. ``local_vars``: each frame also gets ``vars``, its local
    variables as ``[name, address, repr]`` (py-spy ``--locals``; the stall watchdog's spin rule
    compares them). Never raises for a rank; returns within about ``timeout`` seconds."""
    exe = find_pyspy()
    out: dict[int, RankStacks] = {}
    if exe is None:
        line = missing_pyspy()
        return {
            r: {"local_rank": lr, "pid": pid, "error": line} for r, (lr, pid) in workers.items()
        }
    running: dict[int, tuple[subprocess.Popen[bytes], IO[bytes], IO[bytes]]] = {}
    for rank, (lr, pid) in workers.items():
        state = proc_state(pid)
        if state in STOPPED:
            # Look before py-spy, not only after: py-spy cannot read a stopped process, and its
            # ptrace attach and detach can leave it running by the time we would look (seen as
            # root in CI, where the report said "py-spy failed" instead of "is stopped").
            out[rank] = {"local_rank": lr, "pid": pid, "error": STOPPED[state]}
            continue
        # Files, not pipes: a dump of many threads may exceed a pipe's buffer, and reading 64
        # pipes would need a selector; a file never blocks the writer.
        so: IO[bytes] = tempfile.TemporaryFile()
        se: IO[bytes] = tempfile.TemporaryFile()
        try:
            proc = subprocess.Popen(
                [exe, "dump", "--json", *(["--locals"] if local_vars else []), "--pid", str(pid)],
                stdout=so,
                stderr=se,
                stdin=subprocess.DEVNULL,
            )
        except OSError as e:
            so.close()
            se.close()
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
        r = {"local_rank": lr, "pid": pid, **_parse(proc.returncode, stdout, stderr, pid)}
        if r.get("exiting"):
            _last_traceback(r, (stderrs or {}).get(rank, ""))
        out[rank] = r
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
        ts = [_thread(t, pid) for t in threads if isinstance(t, dict)]
        # no frame on any thread, the main one included: past its last frame (see the top)
        if not any(t["frames"] for t in ts) and _is_python(pid):
            return {"exiting": True, "error": EXITING}
        return {"threads": ts}
    state = proc_state(pid)
    if state in STOPPED:  # py-spy cannot read a stopped process ("Failed to get stack traces")
        return {"error": STOPPED[state]}
    why = _why(stderr.decode(errors="replace"), pid)
    if why.endswith("not a Python interpreter") and _is_python(pid):
        return {"exiting": True, "error": EXITING}  # a finalizing interpreter confuses py-spy
    return {"error": why}


def _thread(t: dict[str, Any], pid: int) -> dict[str, Any]:
    frames: list[dict[str, Any]] = []
    for f in t.get("frames") or ():
        if not isinstance(f, dict):
            continue
        frame = {
            "name": str(f.get("name", "?")),
            "file": str(f.get("filename", "?")),
            "line": f.get("line", 0),
        }
        if isinstance(f.get("locals"), list):  # --locals
            frame["vars"] = [
                [str(v.get("name")), v.get("addr"), str(v.get("repr"))]
                for v in f["locals"]
                if isinstance(v, dict)
            ]
        frames.append(frame)
    name = t.get("thread_name") or f"thread {t.get('os_thread_id', '?')}"
    # The main thread's OS id is the process id (Linux); py-spy may not know a thread's name.
    return {"name": str(name), "main": t.get("os_thread_id") == pid, "frames": frames}


def _is_python(pid: int) -> bool:
    """The process runs a Python executable (``python3.11``, ``python``)."""
    try:
        return "python" in os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return False


_PREFIX = re.compile(r"^\[[^\]\s]*\]:\s?")  # torch's "[rank1]: ", "[default0]:"
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]*)", line (?P<line>\d+), in (?P<name>.+)$')
_HEADER = "Traceback (most recent call last):"


def _last_traceback(r: RankStacks, path: str) -> None:
    """Add where an exiting rank was, from the last traceback in its stderr file: its frames
    (innermost first) and ``after EXC in FUNC (FILE:LINE)`` in its error line."""
    if not path:
        return
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - _TAIL_BYTES))
            text = f.read(_TAIL_BYTES).decode(errors="replace")
    except OSError:
        return
    lines = [_PREFIX.sub("", ln) for ln in text.splitlines()]
    start = max((i for i, ln in enumerate(lines) if ln.startswith(_HEADER)), default=-1)
    if start < 0:
        return
    frames: list[dict[str, Any]] = []
    exc = ""
    for ln in lines[start + 1 :]:
        m = _FRAME.match(ln)
        if m:
            frames.append({"name": m["name"], "file": m["file"], "line": int(m["line"])})
        elif ln and not ln[0].isspace():
            exc = ln.split(":", 1)[0].strip()
            break
    if not frames or not exc:
        return
    frames.reverse()
    from .groups import where  # a failure report only

    r["traceback"] = frames
    r["error"] = f"{EXITING} after {exc[:80]} in {where(frames)}"


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
