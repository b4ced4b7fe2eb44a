"""``kill -9`` of one training worker of a runtime agent, once its ``--recover warm`` pool is full.

The recovery tests of every scheduler run it where the agent runs: on this host (local_cwd,
Slurm: its nodes are this host) or in the agent's container (``docker exec``). Standard library
only (a container's python3 has nothing else).

    kill_worker.py MARKER [--env K=V] [--ready N] [--wait-only] [--timeout S]

The agents are the ``python3 -m xrun.runtime`` processes whose command line contains ``MARKER``
(and whose environment holds ``K=V``, to pick one node of several on one host). It waits until
each has ``N`` ready warm interpreters (a pool child whose ``ready.<pid>`` mark is in the pool's
folder: the folder is on the child's command line), then, unless ``--wait-only``, SIGKILLs the
lowest-pid worker (a child of the agent that is not an idle pool child, whose process name is
``xrun-warm``) of the first agent. Either way it prints one JSON line: the agents' children
(``pool``: workers and idle interpreters), the snapshot folders the workers have mapped
(``snapshots``) and the pid it killed (``killed``), for the test to check they go with the job.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def _ppid(pid: int) -> int:
    stat = _read(f"/proc/{pid}/stat")
    rest = stat[stat.rfind(b")") + 2 :].split()
    return int(rest[1]) if len(rest) > 1 and rest[0] not in (b"Z", b"X") else -1


def _argv(pid: int) -> list[str]:
    return [a.decode(errors="replace") for a in _read(f"/proc/{pid}/cmdline").split(b"\0") if a]


def _pids() -> list[int]:
    return sorted(int(d) for d in os.listdir("/proc") if d.isdigit())


def agents(marker: str, env: list[str]) -> list[int]:
    out = []
    for pid in _pids():
        argv = _argv(pid)
        if "xrun.runtime" not in argv or not any(marker in a for a in argv):
            continue
        environ = _read(f"/proc/{pid}/environ").split(b"\0")
        if all(e.encode() in environ for e in env) and _ppid(pid) > 0:
            out.append(pid)
    return out


def children(agent: int) -> list[int]:
    return [p for p in _pids() if _ppid(p) == agent]


def ready(agent: int) -> int:
    n = 0
    for pid in children(agent):
        argv = _argv(pid)
        i = next((k for k, a in enumerate(argv) if a.endswith("warm_child.py")), -1)
        if i >= 0 and len(argv) > i + 3 and os.path.exists(f"{argv[i + 3]}/ready.{pid}"):
            n += 1
    return n


def workers(agent: int) -> list[int]:
    return [p for p in children(agent) if _read(f"/proc/{p}/comm").strip() != b"xrun-warm"]


def snapshots(pids: list[int]) -> list[str]:
    """The ``.../rank-R`` folders of the snapshot slots the processes have mapped."""
    found = set()
    for pid in pids:
        for line in _read(f"/proc/{pid}/maps").decode(errors="replace").splitlines():
            path = line.split(None, 5)[-1] if line.count(" ") >= 5 else ""
            if "/slot-" in path and "xrun-snapshots" in path:
                found.add(path.rsplit("/", 1)[0])
    return sorted(found)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("marker")
    p.add_argument("--env", action="append", default=[])
    p.add_argument("--ready", type=int, default=0)
    p.add_argument("--wait-only", action="store_true")
    p.add_argument("--timeout", type=float, default=300)
    args = p.parse_args()
    deadline = time.monotonic() + args.timeout
    while True:
        found = agents(args.marker, args.env)
        counts = {a: ready(a) for a in found}
        if found and all(n >= args.ready for n in counts.values()):
            break
        if time.monotonic() > deadline:
            print(f"no full pool in {args.timeout} s: agents {found}, ready {counts}")
            return 1
        time.sleep(0.2)
    pool = [p for a in found for p in children(a)]
    report: dict[str, object] = {"agents": found, "ready": list(counts.values()), "pool": pool}
    report["snapshots"] = snapshots([p for a in found for p in workers(a)])
    if not args.wait_only:
        victims = workers(found[0])
        if not victims:
            print(f"agent {found[0]} has no worker")
            return 1
        os.kill(victims[0], signal.SIGKILL)
        report["killed"] = victims[0]
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
