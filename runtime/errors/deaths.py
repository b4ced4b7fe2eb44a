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
  killed for memory in between — some process of the cgroup, not necessarily this worker. So the
  kernel's own record of the victim (``/dev/kmsg``: "Killed process PID", "oom-kill:… pid=PID")
  decides where it can be read (root, or ``dmesg_restrict=0``); where it cannot, a rise in a
  cgroup that also holds processes other than this agent and its workers (a user's shell, a
  second job) is only "probably" the OOM killer;
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
import time

__all__ = ["OomCounter", "OomSnapshot", "signal_cause"]

CGROUP_ROOT = "/sys/fs/cgroup"
VMSTAT = "/proc/vmstat"
KMSG = "/dev/kmsg"
# A kernel record this long before the attempt's start is not about its workers (the printk
# clock and CLOCK_MONOTONIC both count from boot, a little apart).
_KMSG_SLACK = 5.0

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


def _kmsg_oom_kills(since: float, path: str = KMSG) -> list[tuple[int, str]] | None:
    """The OOM killer's kills the kernel's log records since ``since`` (monotonic seconds), as
    ``(pid, memory cgroup)`` ("" where the record names no cgroup); None when the log cannot be
    read (not root under ``dmesg_restrict``, a container without ``/dev/kmsg``). Each read of
    ``/dev/kmsg`` returns one record, ``PRIO,SEQ,USEC,FLAGS;TEXT``; a file of such lines reads
    the same."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    kills: list[tuple[int, str]] = []
    try:
        while True:
            try:
                data = os.read(fd, 16384)
            except BlockingIOError:  # the end of the log
                break
            except BrokenPipeError:  # a record overwritten while reading: on to the next
                continue
            except OSError:
                return None
            if not data:
                break
            for record in data.decode("utf-8", "replace").splitlines():
                head, sep, text = record.partition(";")
                fields = head.split(",")
                if not sep or len(fields) < 3 or not fields[2].isdigit():
                    continue  # a continuation line (" SUBSYSTEM=…") or no record at all
                if int(fields[2]) / 1e6 >= since - _KMSG_SLACK:
                    kills += _oom_kill(text)
    finally:
        os.close(fd)
    return kills


def _oom_kill(text: str) -> list[tuple[int, str]]:
    """The kill a kernel log line records: "…Killed process 123 (python)…" (always printed)
    or "oom-kill:…,task_memcg=/job,task=python,pid=123,…" (rate-limited; names the cgroup)."""
    if text.startswith("oom-kill:"):
        keys = dict(x.partition("=")[::2] for x in text[len("oom-kill:") :].split(","))
        pid = keys.get("pid", "")
        return [(int(pid), keys.get("task_memcg", ""))] if pid.isdigit() else []
    at = text.find("Killed process ")
    if at < 0:
        return []
    pid = text[at + len("Killed process ") :].split(" ", 1)[0]
    return [(int(pid), "")] if pid.isdigit() else []


def _pids_in(group: str, limit: int = 256) -> list[int] | None:
    """The processes of the cgroup dir ``group`` and of its sub-cgroups (whose kills its
    counter also counts); None when they cannot be read."""
    pids: list[int] = []
    try:
        for n, (top, _, files) in enumerate(os.walk(group)):
            if n >= limit:
                break
            if "cgroup.procs" in files:
                with open(os.path.join(top, "cgroup.procs"), encoding="utf-8") as f:
                    pids += [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        return None
    return pids


def _parent(pid: int) -> int:
    """The parent of ``pid``; 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            # "PID (COMM) STATE PPID …": COMM may hold spaces and parentheses, so after the last ")"
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _holds_others(group: str, me: int) -> bool:
    """Whether the cgroup holds a process that is neither this agent, one of its descendants
    (its workers and their children) nor one of its ancestors (what launched it: a container's
    init, a wrapper shell; alive, so no OOM victim); True when that cannot be read."""
    pids = _pids_in(group)
    if pids is None:
        return True
    line, up = {me}, me
    while up > 1 and len(line) < 64:
        up = _parent(up)
        line.add(up)
    for pid in pids:
        up, steps = pid, 0
        while up not in (me, 0, 1) and up not in line and steps < 64:
            up, steps = _parent(up), steps + 1
        if pid not in line and up != me:
            return True
    return False


class OomRise:
    """Where the OOM kill count rose, and by how much. (Plain classes here, not dataclasses:
    this module is on the agent's start-up path, and each dataclass costs its import time.)"""

    __slots__ = ("_kills", "_others", "after", "before", "host_wide", "kmsg", "since", "source")

    def __init__(
        self,
        source: str,
        before: int,
        after: int,
        host_wide: bool,
        since: float = 0.0,
        kmsg: str = KMSG,
    ) -> None:
        self.source = source  # the counter's file
        self.before = before
        self.after = after
        self.host_wide = host_wide  # /proc/vmstat: any process of the host
        self.since = since  # time.monotonic() at the attempt's start
        self.kmsg = kmsg
        self._kills: list[tuple[int, str]] | None | bool = False  # False: not read yet
        self._others: bool | None = None

    def killed(self, pid: int) -> tuple[bool, list[int]] | None:
        """What the kernel's log says: whether it killed ``pid`` since the attempt started, and
        the other pids it killed in this cgroup meanwhile; None when it cannot be read. (A pid
        is not reused while its process lives, so a kill of that number after the start is of
        this worker.) Read once."""
        if self._kills is False:
            self._kills = _kmsg_oom_kills(self.since, self.kmsg)
        kills: list[tuple[int, str]] | None = self._kills  # type: ignore[assignment]
        if kills is None:
            return None
        group = self.group()
        here = [
            p
            for p, cg in kills
            if p != pid and cg and (group == "/" or (cg + "/").startswith(group.rstrip("/") + "/"))
        ]
        return any(p == pid for p, _ in kills), list(dict.fromkeys(here))

    def shared(self) -> bool:
        """Whether the counter's cgroup holds processes besides this agent and its workers, so
        that its rise may be another's kill; read once."""
        if self._others is None:
            self._others = self.host_wide or _holds_others(
                os.path.dirname(self.source), os.getpid()
            )
        return self._others

    def group(self) -> str:
        """The cgroup's path as ``/proc/<pid>/cgroup`` and the kernel's log name it."""
        group = os.path.dirname(self.source)
        for top in ("/memory", "/unified", ""):
            if group.startswith(CGROUP_ROOT + top):
                return group[len(CGROUP_ROOT + top) :] or "/"
        return group

    def text(self) -> str:
        if self.host_wide:
            return f"{self.source}: oom_kill {self.before} -> {self.after} on this host"
        return f"memory cgroup {self.group()}: oom_kill {self.before} -> {self.after}"


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

    def rise(self, since: OomSnapshot | None, started: float = 0.0) -> OomRise | None:
        """The first counter that rose since ``since``, taken at monotonic time ``started``."""
        if since is None:
            return None
        for path, before in since:
            after = _oom_kill_count(path)
            if after is not None and after > before:
                return OomRise(path, before, after, path == self.vmstat, started)
        return None

    def covered(self) -> bool:
        """Whether a memory cgroup's counter (not just the host's) is read."""
        return bool(self.files)


def signal_cause(
    signum: int,
    sent_by_agent: tuple[int, ...],
    oom: OomRise | None,
    cgroup_read: bool,
    pid: int = 0,
) -> str:
    """Why a worker (``pid``, 0 unknown) killed by ``signum`` died, in one phrase (no rank, no
    location).

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
        told = oom.killed(pid) if pid and not oom.host_wide else None
        if told is not None and not told[0] and told[1]:  # the kernel names others, not this one
            return (
                f"killed by SIGKILL from outside the agent (kill -9; the kernel's log names pid "
                f"{', '.join(map(str, told[1]))} as the OOM killer's victim in {oom.text()})"
            )
        if oom.host_wide:
            return f"killed by SIGKILL, probably by the OOM killer ({oom.text()})"
        if (told is None or not told[0]) and oom.shared():  # the count is not ours alone
            return (
                f"killed by SIGKILL, probably by the OOM killer ({oom.text()}; the cgroup also "
                f"holds processes other than this agent's)"
            )
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

    __slots__ = ("before", "counter", "started")

    def __init__(self, counter: OomCounter, before: OomSnapshot, started: float = 0.0) -> None:
        self.counter = counter
        self.before = before
        self.started = started  # time.monotonic(): the kernel log's records after it count

    @classmethod
    def start(cls, previous: OomWatch | None) -> OomWatch:
        """A watch from now on; the cgroup files are found once per agent (``previous``)."""
        counter = previous.counter if previous is not None else OomCounter()
        return cls(counter, counter.snapshot(), time.monotonic())

    def rise(self) -> OomRise | None:
        return self.counter.rise(self.before, self.started)
