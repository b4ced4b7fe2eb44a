"""``xrun stacks``: asking a running app's runtime agents for their workers' stacks.

Each replica that runs xrun's agent holds a FIFO open, ``<its log dir>/<run_id>/stacks.request``
(``xrun.runtime.diagnose.watch``): a byte written to it asks the agent to read its own workers'
stacks and write them to ``stacks.json`` beside it. A scheduler reaches the agents' host its own
way (here for local_cwd, ``docker exec``, ``srun --overlap`` into the job) and :func:`ask_here`
or :func:`gather` writes the requests and waits for the answers: every node collects its own
ranks in parallel with the others.

No signal is ever sent. A signal can end the job it was meant to inspect: SIGUSR1 ends any
agent whose ``--signals-to-handle`` lists it (every Slurm job submitted with
``-cfg signal=USR1@90``), and any signal kills an agent of an older xrun, or one whose handler is
not in place yet. The FIFO is found in the agent's own open files (``/proc/PID/fd``), so the
request reaches that agent and no other; an agent without one (still starting, or an older
xrun) is not asked, and a FIFO nobody holds open any more refuses the write (ENXIO).
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from xrun.contract import (
    MAX_DURATION_S,
    REPLICA_ID_ENV,
    ROLE_ENV,
    STACKS_FILE,
    STACKS_REQUEST_FIFO,
)
from xrun.errors import UsageError
from xrun.limits import shown

__all__ = [
    "STACKS_TIMEOUT_S",
    "AppStacks",
    "NodeStacks",
    "ask",
    "ask_here",
    "check_timeout",
    "gather",
    "is_agent",
]

# How long the CLI waits for every agent: an agent answers within about 5 s (its own bound on
# py-spy), plus the time to notice the signal.
STACKS_TIMEOUT_S = 10.0
# The shortest wait worth asking for: an agent notices the request at once, but py-spy needs a
# few tenths of a second per node (0.38 s for 64 ranks) and srun a second to start its task.
MIN_TIMEOUT_S = 1.0
_POLL_S = 0.05


@dataclass
class NodeStacks:
    """One replica's answer (``doc``: the agent's stacks.json) or why there is none."""

    replica: str  # "role/replica_id"
    doc: dict[str, Any] | None = None
    note: str = ""


@dataclass
class AppStacks:
    """An app's stacks: per role, global rank -> that rank's stacks (``host`` included)."""

    app_id: str
    roles: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, app_id: str, nodes: Iterable[NodeStacks]) -> AppStacks:
        out = cls(app_id)
        for n in nodes:
            if n.doc is None:
                out.notes.append(f"replica {n.replica}: {n.note}")
                continue
            role = n.replica.rsplit("/", 1)[0]
            ranks = out.roles.setdefault(role, {})
            for r, v in (n.doc.get("ranks") or {}).items():
                ranks[int(r)] = {**v, "host": v.get("host") or n.doc.get("host", "")}
            if not n.doc.get("ranks"):
                out.notes.append(f"replica {n.replica}: no workers running (between attempts?)")
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "app_id": self.app_id,
            "roles": {
                role: {str(r): v for r, v in sorted(ranks.items())}
                for role, ranks in self.roles.items()
            },
            "notes": self.notes,
        }


def is_agent(pid: int) -> bool:
    """Whether ``pid`` runs xrun's runtime agent (``python -m xrun.runtime`` or ``xrun-agent``):
    not the ``sh -c`` that is about to exec it, nor any other command."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    if argv and os.path.basename(argv[0]) == b"xrun-agent":
        return True
    return any(
        a == b"-m" and b == b"xrun.runtime" for a, b in zip(argv[:-1], argv[1:], strict=True)
    )


def check_timeout(value: float, given: object = None) -> float:
    """``value`` seconds, or a UsageError naming ``given`` (the text it was read from, when
    not ``value`` itself): from :data:`MIN_TIMEOUT_S` to a day."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (number and math.isfinite(value) and MIN_TIMEOUT_S <= value <= MAX_DURATION_S):
        raise UsageError(
            f"--timeout {shown(value if given is None else given)} is invalid: expected a "
            f"number of seconds from {MIN_TIMEOUT_S:g} to {MAX_DURATION_S:g}, e.g. 10"
        )
    return value


def request_fifo(pid: int) -> str:
    """The stack-request FIFO that agent ``pid`` holds open ("" when it holds none: it is
    still starting, keeps no log dir, or is an older xrun's)."""
    fd_dir = f"/proc/{pid}/fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return ""
    for name in names:
        try:
            target = os.readlink(os.path.join(fd_dir, name))
        except OSError:
            continue  # closed meanwhile
        # A removed FIFO reads "PATH (deleted)": not a name, and not ours to write to.
        if os.path.basename(target) == STACKS_REQUEST_FIFO:
            return target
    return ""


def ask(fifo: str) -> None:
    """Write one request to ``fifo``; RuntimeError when nobody reads it (the agent ended) or
    the path is no FIFO. Never blocks: a full FIFO holds requests enough."""
    try:
        if not stat.S_ISFIFO(os.lstat(fifo).st_mode):
            raise RuntimeError(f"{fifo} is not a FIFO")
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ENXIO:
            raise RuntimeError("its agent has ended (nothing reads its request FIFO)") from None
        raise RuntimeError(f"{fifo}: {e.strerror or e}") from None
    try:
        os.write(fd, b"?")
    except BlockingIOError:
        pass  # requests the agent has not read yet: it answers them all at once
    finally:
        os.close(fd)


def target_of(pid: int) -> tuple[Callable[[], None], str] | str:
    """How to ask agent ``pid`` (send the request, the dir of its answer), or why it cannot be
    asked."""
    fifo = request_fifo(pid)
    if not fifo:
        return (
            "its agent takes no stack requests yet (its workers have not started), or it is an "
            "older xrun's (not asked: the request it knew was SIGUSR1, which can stop a job)"
        )
    return partial(ask, fifo), os.path.dirname(fifo)


def _answer(run_dir: str, since: float) -> dict[str, Any] | None:
    """The agent's answer in ``run_dir`` if it is newer than ``since``."""
    try:
        with open(os.path.join(run_dir, STACKS_FILE)) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None  # not there yet, or being replaced: read it on the next turn
    if isinstance(doc, dict) and float(doc.get("answered_at", 0)) >= since:
        return doc
    return None


def gather(
    targets: Mapping[str, tuple[Callable[[], None], str]],
    timeout: float = STACKS_TIMEOUT_S,
    read: Callable[[str, float], dict[str, Any] | None] = _answer,
) -> list[NodeStacks]:
    """Ask every target (replica -> (send the request, its agent's run dir)) and wait up to
    ``timeout`` s for the answers; ``read`` reads one run dir's answer newer than a time."""
    # No slack: the answers are read on the agents' own host (here, or by ask_here there), and
    # an answer written before this request is an earlier request's.
    since = time.time()
    nodes: dict[str, NodeStacks] = {}
    for replica, (send, _) in targets.items():
        try:
            send()
            nodes[replica] = NodeStacks(replica)
        except (OSError, RuntimeError) as e:
            nodes[replica] = NodeStacks(replica, note=f"could not ask its agent: {e}")
    deadline = time.monotonic() + timeout
    waiting = [r for r, n in nodes.items() if not n.note]
    while waiting:
        for replica in list(waiting):
            doc = read(targets[replica][1], since)
            if doc is not None:
                nodes[replica].doc = doc
                waiting.remove(replica)
        if not waiting or time.monotonic() >= deadline:
            break
        time.sleep(_POLL_S)
    for replica in waiting:
        nodes[replica].note = f"its agent did not answer within {timeout:g}s"
    return list(nodes.values())


def _environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read().split(b"\0")
    except OSError:
        return {}
    pairs = (kv.decode(errors="replace").partition("=") for kv in raw if b"=" in kv)
    return {k: v for k, _, v in pairs}


def ask_here(timeout: float = STACKS_TIMEOUT_S, same: tuple[str, ...] = ()) -> None:
    """Ask every runtime agent on this host (inside a container, or a Slurm node) and print
    their answers as one JSON list: what ``docker exec`` / ``srun`` runs on a replica's host,
    so that only agents are asked and no shared file system is needed. ``same``: env vars
    an agent must share with this process (a Slurm job id and node name: other jobs' agents,
    or other nodes' on a host that plays several, are not ours to ask)."""
    mine = {k: os.environ.get(k) for k in same}
    targets: dict[str, tuple[Callable[[], None], str]] = {}
    hosts: dict[str, str] = {}
    notes = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid() or not is_agent(int(name)):
            continue
        pid = int(name)
        env = _environ(pid)
        if any(env.get(k) != v for k, v in mine.items()):
            continue
        replica = f"{env.get(ROLE_ENV, 'pid')}/{env.get(REPLICA_ID_ENV, pid)}"
        if env.get("SLURMD_NODENAME"):  # a node's name, where one host may play several
            hosts[replica] = env["SLURMD_NODENAME"]
        how = target_of(pid)
        if isinstance(how, str):
            notes.append({"replica": replica, "note": how})
        else:
            targets[replica] = how
    answers = []
    for n in gather(targets, timeout):
        if n.doc is not None and n.replica in hosts:
            n.doc["host"] = hosts[n.replica]
            for r in (n.doc.get("ranks") or {}).values():
                r["host"] = hosts[n.replica]
        answers.append({"replica": n.replica, "doc": n.doc, "note": n.note})
    print(json.dumps(answers + notes))
