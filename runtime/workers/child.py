"""Code that runs inside a worker process, between fork and the user's code.

Two jobs, both done before any user code runs:

* tie the worker to the agent: its own session, hence its own process group (so the agent can
  signal the worker *and* its children at once, and a worker reading the agent's terminal, a
  pdb prompt say, is not a background job that SIGTTIN stops), and ``PR_SET_PDEATHSIG=SIGKILL``
  (so the worker dies with the agent); ``--numa-binding``'s CPU set;
* for function entrypoints: set the rank's environment and output streams, call the function,
  hand its return value back through a file and record an uncaught exception in the error file.

Standard library only; ``pickle`` is imported by the function path alone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable
from threading import BrokenBarrierError
from typing import Any

from ..errors.files import ERROR_FILE_ENV, write_error_file

_PR_SET_PDEATHSIG = 1


def _pdeathsig_call() -> Callable[[], object] | None:
    """A ready-made ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` call, or None where ctypes or libc
    is unavailable (then workers still get their own process group; only the
    die-with-the-agent guarantee is lost).

    Library and arguments are set up here, in the parent, so a freshly forked child only makes
    the foreign call: the less a child does between fork and exec, the less can go wrong when
    the agent has other threads.
    """
    try:
        import ctypes  # no benchmark: here so that a Python without ctypes still runs

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (ImportError, OSError, AttributeError):
        return None
    prctl.restype = ctypes.c_int
    args = (
        ctypes.c_int(_PR_SET_PDEATHSIG),
        ctypes.c_ulong(signal.SIGKILL),
        *[ctypes.c_ulong(0)] * 3,
    )
    return lambda: prctl(*args)


def die_with_parent(pdeathsig: Callable[[], object] | None, parent_pid: int | None) -> None:
    """Ask the kernel for SIGKILL when our parent exits, then close the race where it already
    had: a parent that died before the prctl call left us reparented, so ``getppid`` changed.

    ``parent_pid`` is None when our parent is not the agent (the forkserver forks us; it exits
    when the agent does, which fires the signal all the same). The signal is tied to the
    *thread* that forked us: ``start_processes`` must be called from a long-lived thread.
    """
    if pdeathsig is not None:
        pdeathsig()
    if parent_pid is not None and os.getppid() != parent_pid:
        os.kill(os.getpid(), signal.SIGKILL)


def new_session() -> None:
    """``setsid`` as torchrun's workers (``start_new_session``); a process that leads a
    group already (the parent's setpgid won a race) keeps that group."""
    try:
        os.setsid()
    except OSError:
        try:
            os.setpgid(0, 0)
        except OSError:
            pass


def make_preexec(parent_pid: int, cpus: set[int] | None = None) -> Callable[[], None]:
    """The ``preexec_fn`` for a binary worker: runs in the child after fork, before exec.
    PDEATHSIG and the CPU affinity survive exec (PDEATHSIG is cleared for set-uid binaries)."""
    pdeathsig = _pdeathsig_call()

    def preexec() -> None:
        new_session()
        die_with_parent(pdeathsig, parent_pid)
        if cpus:
            os.sched_setaffinity(0, cpus)

    return preexec


class InheritFd:
    """An fd for a multiprocessing child; it arrives there as a plain ``int``.

    Under spawn/forkserver the child is a fresh interpreter: ``reduction.DupFd`` (which only
    works while multiprocessing pickles the Process) has the fd passed along. Under fork no
    pickling happens and the child simply has the same fd number.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Any, ...]:
        from multiprocessing import reduction  # benchmark 1: spawned function entrypoints only

        return (_detach_fd, (reduction.DupFd(self.fd),))


def _detach_fd(dup: Any) -> int:
    fd: int = dup.detach()
    return fd


def _fd(x: InheritFd | int | None) -> int | None:
    return x.fd if isinstance(x, InheritFd) else x


def function_main(  # noqa: PLR0913 - a multiprocessing target: all the child needs
    payload: bytes | tuple[Callable[..., Any], tuple[Any, ...]],
    env: dict[str, str],
    stdout: InheritFd | int | None,
    stderr: InheritFd | int | None,
    result_path: str,
    parent_pid: int | None,
    unset: tuple[str, ...] = (),
    cpus: set[int] | None = None,
    all_returned: Any = None,
) -> None:
    """The multiprocessing target of a function worker.

    ``payload`` is ``pickle.dumps((fn, args))`` under spawn/forkserver: unpickling it here,
    *after* the environment is set, means a module imported by the unpickling (torch, say) sees
    the rank's ``OMP_NUM_THREADS``/``CUDA_VISIBLE_DEVICES``. Under fork it is the pair itself.
    ``unset``: variables of the agent's environment the worker must not see (the rendezvous
    secret); a spawned or forked child inherits them before this function runs. ``cpus``:
    the ``--numa-binding`` CPU set, applied before any user code starts a thread.
    ``all_returned``: a ``multiprocessing.Barrier`` of the node's workers, passed once the
    result is saved (see ``Launcher``); a peer that failed never reaches it, and the agent
    stops the ones waiting there.
    """
    new_session()
    die_with_parent(_pdeathsig_call(), parent_pid)
    if cpus:
        os.sched_setaffinity(0, cpus)
    if _redirect(1, sys.stdout, _fd(stdout)):
        sys.stdout = open(1, "w", closefd=False)  # lives as long as the process
    if _redirect(2, sys.stderr, _fd(stderr)):
        sys.stderr = open(2, "w", buffering=1, closefd=False)
    for name in unset:
        os.environ.pop(name, None)
    os.environ.update(env)

    import pickle  # benchmark 1: function entrypoints only (a forked worker)

    try:
        fn, args = pickle.loads(payload) if isinstance(payload, bytes) else payload
        ret = fn(*args)
        tmp = result_path + ".tmp"
        with open(tmp, "wb") as fp:
            pickle.dump(ret, fp, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, result_path)
    except Exception as exc:
        # A user's own @record (ours or torch's) may have written the file already, from
        # deeper down: keep that one. Then re-raise so multiprocessing prints the traceback
        # on stderr and exits 1.
        path = os.environ.get(ERROR_FILE_ENV)
        if path and not os.path.exists(path):
            write_error_file(path, exc)
        raise
    if all_returned is not None:
        with contextlib.suppress(BrokenBarrierError):
            all_returned.wait()


def _redirect(fd: int, stream: Any, target: int | None) -> bool:
    """Point ``fd`` at ``target``; True when ``stream`` (``sys.stdout``/``sys.stderr``) does
    not write to ``fd`` and must be replaced: a fork child inherits whatever object the parent
    had there (a test runner's capture, say)."""
    if target is None:
        return False
    try:
        stream.flush()
    except (OSError, ValueError, AttributeError):
        pass
    os.dup2(target, fd)
    os.close(target)
    try:
        return bool(stream.fileno() != fd)
    except (OSError, ValueError, AttributeError):
        return True
