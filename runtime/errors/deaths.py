"""Why a worker died of a signal: the OOM killer, the agent's own stop, a crash, or a signal
sent from outside.

A process killed by a signal leaves only the number (``exitcode -9``); the reason is read from
what else the system keeps:

* the OOM killer counts its kills per memory cgroup: cgroup v2's ``memory.events`` (``oom_kill``,
  hierarchical, so the agent's cgroup also counts kills in the workers' sub-cgroups), cgroup
  v1's ``memory.oom_control`` (``oom_kill``, the victim's own cgroup, which the workers share
  with the agent), and the host-wide ``/proc/vmstat`` ``oom_kill`` as the last resort (it
  counts every process of the machine, so it only says "probably", and is read only where no
  memory cgroup is found). ``OomCounter`` reads the
  counters before each worker group starts and again after a death: a rise means the kernel
  killed for memory in between;
* the agent notes every signal it sends to a worker (``Worker.sent``), so its own stop (SIGTERM
  after another rank failed, SIGKILL after ``--shutdown-timeout``) is told from one sent by
  someone else;
* the synchronous crash signals (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT) are the process's own
  fault, not a kill.

Which process sent a signal is not recorded anywhere the agent can read (only the victim's
``siginfo`` has it), so an outside signal is named, not its sender.

Standard library only; read on the failure path, plus two small file reads per worker group.
"""

from __future__ import annotations

import os
import signal

__all__ = ["OomCounter", "OomSnapshot", "signal_cause"]

CGROUP_ROOT = "/sys/fs/cgroup"
VMSTAT = "/proc/vmstat"

# Signals a process raises on itself by faulting: a crash, not a kill.
_CRASHES = {
    signal.SIGSEGV: "segmentation fault: an invalid memory access in the worker's own code",
    signal.SIGBUS: "bus error: a bad memory access (a truncated mmap'd file, /dev/shm full)",
    signal.SIGFPE: "arithmetic fault (an integer division by zero in native code)",
    signal.SIGILL: "illegal instruction (a binary built for another CPU)",
    signal.SIGABRT: "aborted: abort() in native code (a failed C/C++ assertion, a double free)",
}


def _oom_kill_count(path: str) -> int | None:
    """The ``oom_kill N`` line of a cgroup file (``memory.events``, ``memory.oom_control``) or of
    ``/proc/vmstat``; None when the file or the line is missing."""
    try:
        # utf-8: the codec every interpreter has loaded (ascii would be imported for this)
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    except (OSError, ValueError):
        return None
    return None


def _cgroup_files(proc_cgroup: str, root: str) -> list[str]:
    """The OOM-counting files of the process's memory cgroup (v2 and v1), most precise first.

    Inside a container the cgroup path in ``/proc/self/cgroup`` may name the host's hierarchy
    while ``root`` shows the container's own cgroup at its top: then the top's file is it."""
    try:
        with open(proc_cgroup, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    out: list[str] = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        rel = path.lstrip("/")
        if controllers == "":  # the v2 unified hierarchy (or the v2 half of a hybrid setup)
            tops, name = [root, os.path.join(root, "unified")], "memory.events"
        elif "memory" in controllers.split(","):
            tops, name = [os.path.join(root, "memory")], "memory.oom_control"
        else:
            continue
        for top in tops:
            # the top's file only when the named path is not there (a container's own view):
            # on a host the top is the root cgroup, which is not ours
            for candidate in (os.path.join(top, rel, name), os.path.join(top, name)):
                if os.path.exists(candidate):
                    out.append(candidate)
                    break
    return list(dict.fromkeys(out))


# The OOM kill counters at one moment: ``(file, count)`` pairs.
OomSnapshot = tuple[tuple[str, int], ...]


class OomRise:
    """Where the OOM kill count rose, and by how much. (Plain classes here, not dataclasses:
    this module is on the agent's start-up path, and each dataclass costs its import time.)"""

    __slots__ = ("after", "before", "host_wide", "source")

    def __init__(self, source: str, before: int, after: int, host_wide: bool) -> None:
        self.source = source  # the counter's file
        self.before = before
        self.after = after
        self.host_wide = host_wide  # /proc/vmstat: any process of the host

    def text(self) -> str:
        if self.host_wide:
            return f"{self.source}: oom_kill {self.before} -> {self.after} on this host"
        # the cgroup's path as /proc/<pid>/cgroup names it, not the file's
        group = os.path.dirname(self.source)
        for top in ("/memory", "/unified", ""):
            if group.startswith(CGROUP_ROOT + top):
                group = group[len(CGROUP_ROOT + top) :] or "/"
                break
        return f"memory cgroup {group}: oom_kill {self.before} -> {self.after}"


class OomCounter:
    """The OOM kill counters that cover this process and its children."""

    def __init__(
        self, proc_cgroup: str = "/proc/self/cgroup", root: str = CGROUP_ROOT, vmstat: str = VMSTAT
    ) -> None:
        self.files = _cgroup_files(proc_cgroup, root)
        self.vmstat = vmstat

    def snapshot(self) -> OomSnapshot:
        """The counters now: the memory cgroup's, or, without one, the host's."""
        counts = []
        for path in self.files or [self.vmstat]:
            n = _oom_kill_count(path)
            if n is not None:
                counts.append((path, n))
        return tuple(counts)

    def rise(self, since: OomSnapshot | None) -> OomRise | None:
        """The first counter that rose since ``since``."""
        if since is None:
            return None
        for path, before in since:
            after = _oom_kill_count(path)
            if after is not None and after > before:
                return OomRise(path, before, after, host_wide=path == self.vmstat)
        return None

    def covered(self) -> bool:
        """Whether a memory cgroup's counter (not just the host's) is read."""
        return bool(self.files)


def signal_cause(
    signum: int, sent_by_agent: tuple[int, ...], oom: OomRise | None, cgroup_read: bool
) -> str:
    """Why a worker killed by ``signum`` died, in one phrase (no rank, no location).

    ``sent_by_agent``: the signals the agent sent it while it ran; ``oom``: an OOM counter's
    rise during its attempt; ``cgroup_read``: whether a memory cgroup's counter was read (so
    that its silence means something)."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        return f"killed by signal {signum}"
    if signum in _CRASHES:
        return f"crashed with {name}: {_CRASHES[signal.Signals(signum)]}"
    if signum == signal.SIGKILL and oom is not None and signum not in sent_by_agent:
        if oom.host_wide:
            return f"killed by SIGKILL, probably by the OOM killer ({oom.text()})"
        return f"killed by the OOM killer: out of memory (SIGKILL; {oom.text()})"
    if signum in sent_by_agent:
        if signum == signal.SIGKILL and len(sent_by_agent) > 1:
            first = signal.Signals(sent_by_agent[0]).name
            return (
                f"killed by the agent with SIGKILL: still running --shutdown-timeout after {first}"
            )
        return f"stopped by the agent with {name}"
    if signum == signal.SIGKILL:
        why = "no OOM kill counted" if cgroup_read else "no memory cgroup to ask about OOM kills"
        return f"killed by SIGKILL from outside the agent (kill -9; {why})"
    return f"killed by {name} from outside the agent"


class OomWatch:
    """The counters of this process's cgroup and their values when an attempt started."""

    __slots__ = ("before", "counter")

    def __init__(self, counter: OomCounter, before: OomSnapshot) -> None:
        self.counter = counter
        self.before = before

    @classmethod
    def start(cls, previous: OomWatch | None) -> OomWatch:
        """A watch from now on; the cgroup files are found once per agent (``previous``)."""
        counter = previous.counter if previous is not None else OomCounter()
        return cls(counter, counter.snapshot())

    def rise(self) -> OomRise | None:
        return self.counter.rise(self.before)
