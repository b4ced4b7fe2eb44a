"""``xrun stacks`` on docker: each of the app's running containers that runs xrun's agent is
asked from inside (``docker exec``: ``schedulers.stacks.ask_here`` writes to the agent's request
FIFO there, never a signal, and prints its answer), all at once. The containers get
``CAP_SYS_PTRACE`` (see request.py), which py-spy needs to read the workers; the base image
carries py-spy (scripts/docker-engine.sh)."""

from __future__ import annotations

import json
from typing import Any

from ..stacks import NodeStacks
from .engine import parallel
from .request import LABEL_REPLICA, LABEL_ROLE

# The container runs xrun's agent: the dist components' `sh -c 'exec python3 -m xrun.runtime'`,
# or the agent's console script.
_AGENT_MARKS = ("-m xrun.runtime", "xrun-agent")


def _runs_agent(container: Any) -> bool:
    cfg = container.attrs.get("Config") or {}
    argv = " ".join([*(cfg.get("Entrypoint") or []), *(cfg.get("Cmd") or [])])
    return any(m in argv for m in _AGENT_MARKS)


def gather_stacks(containers: list[Any], timeout: float) -> list[NodeStacks]:
    """One ``NodeStacks`` per container of the app (running agents answer; the others say
    why not)."""
    out: dict[str, NodeStacks] = {}
    asked = []
    for c in containers:
        labels = c.attrs.get("Config", {}).get("Labels") or {}
        name = f"{labels.get(LABEL_ROLE, '?')}/{labels.get(LABEL_REPLICA, '?')}"
        if c.status != "running":
            out[name] = NodeStacks(name, note=f"not running ({c.status})")
        elif not _runs_agent(c):
            out[name] = NodeStacks(name, note="not an xrun runtime agent (no stacks)")
        else:
            out[name] = NodeStacks(name)
            asked.append((name, c))

    def ask(item: tuple[str, Any]) -> None:
        name, c = item
        code = f"from xrun.schedulers.stacks import ask_here; ask_here({timeout!r})"
        try:
            res = c.exec_run(["python3", "-c", code], demux=True)
            stdout = (res.output[0] or b"").decode(errors="replace")
            answers = json.loads(stdout.strip().splitlines()[-1]) if stdout.strip() else []
        except Exception as e:  # the engine's or the container's: one line per replica
            out[name].note = f"could not ask its agent: {str(e).splitlines()[0][:200]}"
            return
        docs = [a for a in answers if a.get("doc")]
        if docs:
            out[name].doc = docs[0]["doc"]
        else:
            notes = [a.get("note") for a in answers if a.get("note")]
            out[name].note = notes[0] if notes else "no agent answered in the container"

    parallel(ask, asked)
    return list(out.values())
