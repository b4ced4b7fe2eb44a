"""``xrun stacks``: asking a running app's runtime agents for their workers' stacks.

Each replica that runs xrun's agent answers a ``SIGUSR1`` (``xrun.runtime.diagnose.watch``)
by reading its own workers' stacks and writing them to ``<its log dir>/<run_id>/stacks.json``.
A scheduler sends the signal its own way (``os.kill``, ``docker kill --signal``, ``scancel
--signal``) to the replicas it can see, and :func:`gather` waits for the answers in the app's
log dirs: no new channel between the CLI and the job, and every node collects its own ranks in
parallel with the others.

Only a process that *is* an agent gets the signal (SIGUSR1 kills a process without a handler),
and only once its run dir exists: the agent creates it after installing the handler.
"""

from __future__ import annotations

import glob
import json
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "STACKS_FILE",
    "STACKS_TIMEOUT_S",
    "AppStacks",
    "NodeStacks",
    "ask_here",
    "gather",
    "is_agent",
]

# The agent's answer file (xrun.runtime.diagnose.watch.STACKS_FILE; not imported from there:
# the CLI need not load the agent's modules).
STACKS_FILE = "stacks.json"
# How long the CLI waits for every agent: an agent answers within about 5 s (its own bound on
# py-spy), plus the time to notice the signal.
STACKS_TIMEOUT_S = 10.0
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


def _answer(log_dir: str, since: float) -> dict[str, Any] | None:
    for path in glob.glob(os.path.join(glob.escape(log_dir), "*", STACKS_FILE)):
        try:
            with open(path) as f:
                doc = json.load(f)
        except (OSError, ValueError):
            continue  # being replaced: read it on the next turn
        if isinstance(doc, dict) and float(doc.get("answered_at", 0)) >= since:
            return doc
    return None


def started(log_dir: str) -> bool:
    """The agent's run dir exists under ``log_dir``: it handles the request signal by now."""
    return any(os.path.isdir(p) for p in glob.glob(os.path.join(glob.escape(log_dir), "*")))


def gather(
    targets: Mapping[str, tuple[Callable[[], None], str]],
    timeout: float = STACKS_TIMEOUT_S,
    read: Callable[[str, float], dict[str, Any] | None] = _answer,
) -> list[NodeStacks]:
    """Ask every target (replica -> (send the request, its agent's log dir)) and wait up to
    ``timeout`` s for the answers; ``read`` reads one log dir's answer newer than a time."""
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


def _agent_log_dir(pid: int) -> str:
    """Where agent ``pid`` keeps its run dir: its ``PET_LOG_DIR`` (the scheduler's), else the
    temp dir it made (``<tmp>/xrun_*``)."""
    from xrun.contract import AGENT_LOG_DIR_ENV

    key = AGENT_LOG_DIR_ENV.encode() + b"="
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
    except OSError:
        env = []
    for kv in env:
        if kv.startswith(key):
            return kv[len(key) :].decode(errors="replace")
    import tempfile

    dirs = sorted(glob.glob(os.path.join(tempfile.gettempdir(), "xrun_*")), key=os.path.getmtime)
    return dirs[-1] if dirs else ""


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
    so that only agents get the signal and no shared file system is needed. ``same``: env vars
    an agent must share with this process (a Slurm job id and node name: other jobs' agents,
    or other nodes' on a host that plays several, are not ours to ask)."""
    import signal
    from functools import partial

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
        replica = f"{env.get('XRUN_ROLE', 'pid')}/{env.get('XRUN_REPLICA_ID', pid)}"
        if env.get("SLURMD_NODENAME"):  # a node's name, where one host may play several
            hosts[replica] = env["SLURMD_NODENAME"]
        log_dir = _agent_log_dir(pid)
        if log_dir and started(log_dir):
            targets[replica] = (partial(os.kill, pid, signal.SIGUSR1), log_dir)
        else:
            notes.append({"replica": replica, "note": "its agent is still starting"})
    answers = []
    for n in gather(targets, timeout):
        if n.doc is not None and n.replica in hosts:
            n.doc["host"] = hosts[n.replica]
            for r in (n.doc.get("ranks") or {}).values():
                r["host"] = hosts[n.replica]
        answers.append({"replica": n.replica, "doc": n.doc, "note": n.note})
    print(json.dumps(answers + notes))
