"""Code that runs inside a worker process, between fork and the user's code.

Two jobs, both done before any user code runs:

* tie the worker to the agent: its own process group (so the agent can signal the worker *and*
  its children at once) and ``PR_SET_PDEATHSIG=SIGKILL`` (so the worker dies with the agent);
* for function entrypoints: set the rank's environment and output streams, call the function,
  hand its return value back through a file and record an uncaught exception in the error file.

Standard library only; ``pickle`` is imported by the function path alone.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any, Callable

_PR_SET_PDEATHSIG = 1


def _load_prctl() -> Callable[..., int] | None:
    """libc's ``prctl``, or None where ctypes or libc is unavailable (then workers still get
    their own process group; only the die-with-the-agent guarantee is lost)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        fn: Callable[..., int] = libc.prctl
        return fn
    except (ImportError, OSError, AttributeError):
        return None


def die_with_parent(prctl: Callable[..., int] | None, parent_pid: int | None) -> None:
    """Ask the kernel for SIGKILL when our parent exits, then close the race where it already
    had: a parent that died before the prctl call left us reparented, so ``getppid`` changed.

    ``parent_pid`` is None when our parent is not the agent (the forkserver forks us; it exits
    when the agent does, which fires the signal all the same).
    """
    if prctl is not None:
        import ctypes

        prctl(ctypes.c_int(_PR_SET_PDEATHSIG), ctypes.c_ulong(signal.SIGKILL),
              ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
    if parent_pid is not None and os.getppid() != parent_pid:
        os.kill(os.getpid(), signal.SIGKILL)


def make_preexec(parent_pid: int) -> Callable[[], None]:
    """The ``preexec_fn`` for a binary worker: runs in the child after fork, before exec.

    ctypes and libc are loaded here, in the parent, so the child only makes the call.
    PDEATHSIG survives exec (it is only cleared for set-uid binaries).
    """
    prctl = _load_prctl()

    def preexec() -> None:
        os.setpgid(0, 0)
        die_with_parent(prctl, parent_pid)

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
        from multiprocessing import reduction

        return (_detach_fd, (reduction.DupFd(self.fd),))


def _detach_fd(dup: Any) -> int:
    fd: int = dup.detach()
    return fd


def _fd(x: InheritFd | int | None) -> int | None:
    return x.fd if isinstance(x, InheritFd) else x


def function_main(
    payload: bytes | tuple[Callable[..., Any], tuple[Any, ...]],
    env: dict[str, str],
    stdout: InheritFd | int | None,
    stderr: InheritFd | int | None,
    result_path: str,
    parent_pid: int | None,
) -> None:
    """The multiprocessing target of a function worker.

    ``payload`` is ``pickle.dumps((fn, args))`` under spawn/forkserver: unpickling it here,
    *after* the environment is set, means a module imported by the unpickling (torch, say) sees
    the rank's ``OMP_NUM_THREADS``/``CUDA_VISIBLE_DEVICES``. Under fork it is the pair itself.
    """
    try:
        os.setpgid(0, 0)
    except OSError:  # the parent's setpgid won the race: same result
        pass
    die_with_parent(_load_prctl(), parent_pid)
    _redirect(1, sys.stdout, _fd(stdout))
    _redirect(2, sys.stderr, _fd(stderr))
    os.environ.update(env)

    import pickle

    from .errors import ERROR_FILE_ENV, write_error_file

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


def _redirect(fd: int, stream: Any, target: int | None) -> None:
    if target is None:
        return
    try:
        stream.flush()
    except (OSError, ValueError, AttributeError):
        pass
    os.dup2(target, fd)
    os.close(target)
