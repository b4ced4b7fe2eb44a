"""A warm interpreter of the agent's pool (``pool.py``): started ahead of need, it imports what
the job's workers import, then waits for a rank to run and becomes that worker.

Run by path (``python -u .../warm_child.py SOCK_FD MODE DIR DELAY``), never with ``-m``: the
job's interpreter may not have xrun installed, and nothing here may shadow the worker's own
imports. Standard library only, and it never imports xrun. ``MODE``:

* ``cold``: imports nothing; it is handed its rank at once (a first attempt, an empty pool);
* ``warm``: waits until the workers have reported the modules they hold (``DIR/modules.*``,
  written by the workers this file started, see ``_report``) and at least ``DELAY`` seconds
  have passed (a refill must not take the CPU from the workers it just replaced), then imports
  ``torch`` and every reported module, tells the agent it is ready (one byte), and while it
  idles imports what later reports add (it looks every ``_IDLE_LOOK`` s: a stat per file).

The hand-over is one message on the ``SOCK_SEQPACKET`` socket: the rank's JSON (argv, the full
environment, cwd, CPUs) and its two output fds (``SCM_RIGHTS``). The child then does what a
cold ``python -u script.py`` would have done by then: stdout/stderr on those fds, the
environment replaced, the cwd, ``sys.argv``, ``sys.path[0]`` (the script's directory, or the
cwd for ``-m``), and runs the script as ``__main__`` (``-m``: ``runpy``, as the interpreter
does). Its session, process group and parent-death signal were set when the agent spawned it,
as for a cold worker, so the agent watches it exactly as one.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import select
import socket
import sys
import time
import types

_IDLE_LOOK = 2.0  # seconds between looks for new module reports while idle
# When the workers write what they imported, in seconds after their start: often early, so
# that the pool has the modules of the first step (DistributedDataParallel's construction
# alone imports ~800) soon after it, whenever it falls (a ms or two per write).
_REPORT_AT = (1.0, 2.0, 3.0, 5.0, 8.0, 12.0, 17.0, 23.0, 30.0, 40.0, 60.0, 90.0)
_WAIT_REPORTS_MAX = 60.0  # a warm child imports torch at the latest this long after its start
_MAX_MSG = 1 << 22
_SKIP_ENV = "XRUN_WARM_SKIP"  # comma-separated module prefixes a pool must never pre-import
# Under a memory limit: what a child expects its imports to take before one child measured it
# (torch + DDP's modules: 212 MiB anonymous here, docs/recovery.md), and the room it leaves.
_FOOTPRINT = 256 << 20
_MARGIN = 64 << 20


def _job_waiting(sock: socket.socket, timeout: float) -> bool:
    r, _, _ = select.select([sock], [], [], max(0.0, timeout))
    return bool(r)


def _reports(state_dir: str) -> list[str]:
    try:
        names = sorted(n for n in os.listdir(state_dir) if n.startswith("modules."))
    except OSError:
        return []
    return [os.path.join(state_dir, n) for n in names if not n.endswith(".tmp")]


def _reported_modules(state_dir: str) -> list[str]:
    seen: dict[str, None] = {}
    for path in _reports(state_dir):
        try:
            with open(path, encoding="utf-8") as f:
                for line in f:
                    seen.setdefault(line.strip(), None)
        except OSError:
            pass
    seen.pop("", None)
    return list(seen)


def _skipped(name: str, skip: tuple[str, ...]) -> bool:
    return any(name == s or name.startswith(s + ".") for s in skip)


def _import_all(names: list[str], sock: socket.socket) -> bool:
    """Import ``names`` (failures ignored: a module the worker imported may need its rank's
    state); False when a job arrived meanwhile (the rest is the script's to import)."""
    import importlib

    skip = tuple(s for s in os.environ.get(_SKIP_ENV, "").split(",") if s)
    for i, name in enumerate(names):
        if name in sys.modules or name.startswith("__") or _skipped(name, skip):
            continue
        if i % 16 == 0 and _job_waiting(sock, 0):
            return False
        try:
            importlib.import_module(name)
        except BaseException:  # noqa: BLE001 - SystemExit or KeyboardInterrupt too: not ours
            pass
    return True


def _cgroup_memory() -> tuple[int, int] | None:
    """``(limit, used)`` in bytes of the tightest memory limit over this process's cgroup
    (a container's ``--memory``, a Slurm job's cgroup), ``used`` being what cannot be reclaimed
    (anonymous memory and shmem: /dev/shm, where the snapshots live; not the page cache);
    None without a limit. cgroup v2 and v1."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    best: tuple[int, int] | None = None
    for line in lines:
        _, ctrls, path = line.split(":", 2)
        v2 = ctrls == ""
        if not v2 and "memory" not in ctrls.split(","):
            continue
        base = "/sys/fs/cgroup" if v2 else "/sys/fs/cgroup/memory"
        # our own cgroup, or (a private cgroup namespace, a container) the mount's root
        here = base + path.rstrip("/") if os.path.isdir(base + path) else base
        while here.startswith(base):
            stat = _read_stat(os.path.join(here, "memory.stat"))
            if v2:
                limit = _read_int(os.path.join(here, "memory.max"))
                used = stat.get("anon", 0) + stat.get("shmem", 0)
            else:
                limit = stat.get("hierarchical_memory_limit")
                used = stat.get("total_rss", 0) + stat.get("total_shmem", 0)
            if limit is not None and limit < 1 << 60 and stat:
                if best is None or limit - used < best[0] - best[1]:
                    best = (limit, used)
            if not v2 or here == base:
                break  # v1's hierarchical limit already covers the parents
            here = os.path.dirname(here)
    return best


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _read_stat(path: str) -> dict[str, int]:
    out = {}
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(" ")
                if value.strip().isdigit():
                    out[key] = int(value)
    except OSError:
        pass
    return out


def _anon_rss(pid: int | str = "self") -> int:
    with contextlib.suppress(OSError, ValueError), open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


def _workers_growth(need: int) -> int:
    """What the agent's workers (this child's siblings not idling as ``xrun-warm``) will still
    take before they hold at least the imports a warm child holds: a worker checked a second
    after its start has barely begun importing torch."""
    parent, grow = os.getppid(), 0
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                stat = f.read()
            with open(f"/proc/{d}/comm", "rb") as f:
                comm = f.read().strip()
        except OSError:
            continue
        if int(stat[stat.rfind(b")") + 2 :].split()[1]) == parent and comm != b"xrun-warm":
            grow += max(0, need - _anon_rss(d))
    return grow


def _room(state_dir: str, sock: socket.socket) -> tuple[bool, int]:
    """Under a memory limit, wait until this interpreter's imports fit beside what the
    cgroup holds and what the workers will take, one child at a time (a lock in the pool's folder, held by the caller
    through the imports: the next child then sees them); (True, lock fd) to import, (False,
    -1) when a rank arrived first: it runs cold. No limit: (True, -1) at once."""
    import fcntl

    if _cgroup_memory() is None:
        return True, -1
    lock = os.open(os.path.join(state_dir, "memory.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            if _job_waiting(sock, 0.2):
                os.close(lock)
                return False, -1
            continue
        mem = _cgroup_memory()
        need = _read_int(os.path.join(state_dir, "footprint")) or _FOOTPRINT
        if mem is not None:
            mem = (mem[0], mem[1] + _workers_growth(need))
        if mem is None or mem[0] - mem[1] >= need + max(_MARGIN, mem[0] // 16):
            return True, lock
        fcntl.flock(lock, fcntl.LOCK_UN)
        with contextlib.suppress(OSError):
            fd = os.open(os.path.join(state_dir, "no-room"), os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            os.write(
                fd,
                f"--recover warm: no room for a warm interpreter (~{need >> 20} MiB) under the "
                f"memory limit ({mem[0] >> 20} MiB, {mem[1] >> 20} MiB in use): the pool waits "
                f"for room, and a rank restarted meanwhile starts cold".encode(),
            )
            os.close(fd)
        if _job_waiting(sock, _IDLE_LOOK):
            os.close(lock)
            return False, -1


def _warm_up(sock: socket.socket, state_dir: str, delay: float) -> None:
    """Wait for reports (and ``delay``) and for memory, import, say ready, then idle until
    the job comes."""
    start = time.monotonic()
    while not (_reports(state_dir) and time.monotonic() - start >= delay):
        if time.monotonic() - start >= max(delay, _WAIT_REPORTS_MAX):
            break
        if _job_waiting(sock, 0.5):
            return
    go, lock = _room(state_dir, sock)
    if not go:
        return
    try:
        if not _import_all(["torch", *_reported_modules(state_dir)], sock):
            return
        if lock >= 0:  # what the next child under the limit expects to need
            with contextlib.suppress(OSError), open(os.path.join(state_dir, "footprint"), "w") as f:
                f.write(str(_anon_rss()))
    finally:
        if lock >= 0:
            os.close(lock)  # releases the flock
    try:
        sock.send(b"R")
    except OSError:  # the agent sent a rank meanwhile and closed its end: take the rank
        return
    mark = os.path.join(state_dir, f"ready.{os.getpid()}")  # for the eye and the benchmark
    with open(mark, "w"):
        pass
    try:
        _idle(sock, state_dir)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(mark)


def _idle(sock: socket.socket, state_dir: str) -> None:
    stamps: dict[str, float] = {}
    while not _job_waiting(sock, _IDLE_LOOK):
        changed = False
        for path in _reports(state_dir):
            try:
                mtime = os.stat(path).st_mtime
            except OSError:
                continue
            changed |= stamps.get(path) != mtime
            stamps[path] = mtime
        if changed and not _import_all(_reported_modules(state_dir), sock):
            return


def _library_roots() -> tuple[str, ...]:
    """Where importable libraries live: the interpreter's paths and ``sys.path`` without the
    script's directory (index 0) and the cwd. A module from the script's own folder may read
    its rank at import time: it is never pre-imported."""
    import sysconfig

    roots = {p for p in sysconfig.get_paths().values() if p}
    cwd = os.getcwd()
    roots.update(p for p in sys.path[1:] if p and os.path.abspath(p) != cwd)
    script_dir = sys.path[0] if sys.path else ""
    return tuple(
        os.path.join(os.path.abspath(r), "") for r in roots if os.path.abspath(r) != script_dir
    )


def _report(path: str) -> None:
    """In a worker: write the names of the library modules it holds to ``path``, now and then
    (a thread of its own, sleeping between writes; atomically, through a rename)."""
    roots = _library_roots()
    began = time.monotonic()
    for at in _REPORT_AT:
        time.sleep(max(0.0, at - (time.monotonic() - began)))
        names = []
        for name, mod in list(sys.modules.items()):
            file = getattr(mod, "__file__", None)
            if name.startswith("__") or (file and not os.path.abspath(file).startswith(roots)):
                continue
            names.append(name)
        try:
            with open(path + ".tmp", "w", encoding="utf-8") as f:
                f.write("\n".join(names))
            os.replace(path + ".tmp", path)
        except OSError:
            return


def _take_streams(out: int, err: int) -> None:
    """Put the rank's two streams on fds 1 and 2, as a cold worker was started with them."""
    for stream, fd, target in ((sys.stdout, 1, out), (sys.stderr, 2, err)):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
        if target != fd:
            os.dup2(target, fd)
            os.close(target)
        if stream is not None and hasattr(stream, "reconfigure"):
            # stderr is always line buffered; stdout only on a terminal (what startup decides)
            stream.reconfigure(line_buffering=fd == 2 or os.isatty(fd))


def _run_script(path: str) -> None:
    """What ``python script.py`` does with the script: a fresh ``__main__``, run as is."""
    abspath = os.path.abspath(path)
    with open(abspath, "rb") as f:
        source = f.read()
    from importlib.machinery import SourceFileLoader

    main = types.ModuleType("__main__")
    main.__dict__.update(
        __file__=abspath,
        __cached__=None,
        __loader__=SourceFileLoader("__main__", abspath),
        __builtins__=builtins,
    )
    sys.modules["__main__"] = main
    code = compile(source, abspath, "exec", dont_inherit=True)
    try:
        exec(code, main.__dict__)
    except SystemExit:
        raise
    except BaseException as e:
        # The traceback a cold worker prints: from the script's frame on, not ours.
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != abspath:
            tb = tb.tb_next
        tb = tb or e.__traceback__
        e.__traceback__ = tb  # a hook that reads sys.exc_info() (torch's) sees the same
        sys.excepthook(type(e), e, tb)
        if isinstance(e, KeyboardInterrupt):  # the interpreter's own exit: killed by SIGINT
            import signal

            sys.stdout.flush()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        sys.exit(1)


def _set_comm(name: bytes) -> None:
    """The process name ``ps``/``top`` show (``PR_SET_NAME``); best effort."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, ctypes.c_char_p(name[:15]), 0, 0, 0)
    except (ImportError, OSError, AttributeError):
        pass


def _become(sock: socket.socket, comm: bytes) -> None:
    msg, fds, _, _ = socket.recv_fds(sock, _MAX_MSG, 2)
    sock.close()
    if not msg or len(fds) != 2:
        # The pool let us go (its end closed, no rank sent). Never exit 0 here: were this a
        # worker, 0 would pass for a rank that succeeded.
        os._exit(1)
    job = json.loads(msg)
    if comm:
        _set_comm(comm)  # a worker's name, as a cold one's
    _take_streams(fds[0], fds[1])
    os.environ.clear()
    os.environ.update(job["env"])
    os.chdir(job["cwd"])
    if job.get("cpus"):
        os.sched_setaffinity(0, job["cpus"])
    argv, module = job["argv"], job.get("module")
    sys.argv = ["-m", *argv[1:]] if module else list(argv)
    script_dir = os.getcwd() if module else os.path.dirname(os.path.realpath(argv[0]))
    sys.path.insert(0, script_dir)
    if job.get("report"):
        import _thread

        _thread.start_new_thread(_report, (job["report"],))
    if module:
        import runpy

        runpy._run_module_as_main(module, alter_argv=True)  # type: ignore[attr-defined]
    else:
        _run_script(argv[0])


def main() -> None:
    # sys.path[0] is this file's folder: drop it, or a worker's `import api` could find ours.
    sys.path.pop(0)
    fd, mode, state_dir, delay = int(sys.argv[1]), sys.argv[2], sys.argv[3], float(sys.argv[4])
    sock = socket.socket(fileno=fd)
    comm = b""
    if mode == "warm":
        # Idle, it shows as `xrun-warm` in ps and top (a worker shows as the interpreter again).
        with contextlib.suppress(OSError), open("/proc/self/comm", "rb") as f:
            comm = f.read().strip()
        _set_comm(b"xrun-warm")
        try:
            _warm_up(sock, state_dir, delay)
        except OSError:
            pass  # a rank may be waiting all the same: _become reads it, or leaves
    _become(sock, comm)


if __name__ == "__main__":
    main()
