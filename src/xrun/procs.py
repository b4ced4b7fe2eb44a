"""This machine's processes and GPUs, as the kernel tells them: what local_cwd's apps and the
sweeps' supervisors both ask (a pid is told apart from a later process that reuses it by its
start time, stored next to it).

Standard library only and nothing else from xrun: local_cwd's supervisor imports it while
running with ``-S`` (see :mod:`xrun.schedulers.local_cwd.supervisor`).
"""

from __future__ import annotations

import errno
import os
import signal


def proc_start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22).

    Stored next to every pid so a recycled pid is never mistaken for our process. None when the
    process does not exist, is a zombie, or there is no /proc (then only the pid is checked).
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return None
    except OSError:
        return None
    # comm (field 2) may contain spaces and parentheses: the fields we want follow the LAST ')'.
    fields = stat[stat.rfind(b")") + 2 :].split()
    if fields[0] in (b"Z", b"X"):  # exited, not yet reaped: as good as dead
        return None
    return int(fields[19])


def is_alive(pid: int | None, start: int | None) -> bool:
    """Whether ``pid`` is still the process that was started at ``start`` (see above)."""
    if not pid:
        return False
    if os.path.isdir("/proc/self"):
        now = proc_start_time(pid)
        return now is not None and (start is None or now == start)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def pidfd_of(pid: int | None, start: int | None) -> int | None:
    """An open pidfd of ``pid`` while it is the process started at ``start`` (see
    :func:`is_alive`), or None (gone, or a later process that took the pid); the caller closes
    it. OSError where there is no pidfd (another OS, Linux before 5.3, a seccomp filter).

    Opened first, then checked: the fd pins one process, so a pid reused before the open fails
    the check, and what the fd then signals or waits for is the process checked, whichever
    process takes the pid later. (Checked first, the fd could pin the later one.)
    """
    if not pid:
        return None
    if not hasattr(os, "pidfd_open"):
        raise OSError(errno.ENOSYS, "no os.pidfd_open on this system")
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return None
    if not is_alive(pid, start):
        os.close(fd)
        return None
    return fd


def signal_if_same(pid: int | None, start: int | None, sig: int) -> bool:
    """Send ``sig`` to ``pid`` only if it is still the process started at ``start`` (see
    :func:`is_alive`); whether it was sent.

    Checked, then sent by ``os.kill``, a pid that is reused in between would be signalled: a
    process of anyone's. So it is sent through :func:`pidfd_of`'s fd (Linux 5.3+): a process
    that ends after the check takes the signal with it (ESRCH), never passing it on. Without
    one (another OS, a seccomp filter refusing either call): check, then ``os.kill``.
    """
    if not pid:
        return False
    try:
        fd = pidfd_of(pid, start)
    except OSError:  # no pidfd here
        return _check_then_kill(pid, start, sig)
    if fd is None:
        return False
    try:
        signal.pidfd_send_signal(fd, sig)
    except ProcessLookupError:  # it ended after the check: the signal went nowhere else
        return False
    except (AttributeError, OSError):
        # Refused by a seccomp filter that let pidfd_open through (ENOSYS, EPERM), or not ours
        # to signal (EPERM): by the pid then, which says which of the two it was.
        return _check_then_kill(pid, start, sig)
    finally:
        os.close(fd)
    return True


def _check_then_kill(pid: int, start: int | None, sig: int) -> bool:
    """:func:`signal_if_same` without a pidfd: a pid reused between the check and the kill
    is signalled, a window nothing closes here."""
    if not is_alive(pid, start):
        return False
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def visible_gpus() -> list[str]:
    """GPU ids replicas may use: ``CUDA_VISIBLE_DEVICES`` if set, else the NVIDIA driver's."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip()]
    try:
        return [str(i) for i in range(len(os.listdir("/proc/driver/nvidia/gpus")))]
    except OSError:
        return []
