"""Helpers of the agent tests: the agent's command line, running it, reading what the workers
(tests/scripts/behave.py) report, and a pair of agents that rendezvous."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

from tests.helpers.net import free_port
from tests.helpers.paths import PY, SCRIPTS

BEHAVE = str(SCRIPTS / "behave.py")
ALLREDUCE = str(SCRIPTS / "allreduce.py")
PROBE = str(SCRIPTS / "probe_agent_store.py")
SECRET_ENV = ("XRUN_RDZV_TOKEN", "XRUN_RDZV_TOKEN_FILE")
# Fast failure detection for the multi-agent tests (defaults are 5 s / 15 s / 30 s).
FAST = "heartbeat_interval=0.2,heartbeat_timeout=1.5,last_call_timeout=0.5,join_timeout=30"


def agent(*args: str) -> list[str]:
    return [PY, "-m", "xrun.runtime", *args]


def run(cmd: list[str], timeout: float = 60, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, **kw
    )  # type: ignore[call-overload]


def events(out: Path) -> list[dict[str, object]]:
    path = out / "events.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def serving(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still "exists": look at its state
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


def popen(
    procs: list[subprocess.Popen[str]], cmd: list[str], **kw: object
) -> subprocess.Popen[str]:
    p = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
        **kw,
    )  # type: ignore[call-overload]
    procs.append(p)
    return p


def by_rank(evs: list[dict[str, object]], restart: str = "0") -> dict[int, dict[str, object]]:
    return {int(str(e["RANK"])): e for e in evs if e["TORCHELASTIC_RESTART_COUNT"] == restart}


def check_world(evs: dict[int, dict[str, object]], nprocs: list[int]) -> None:
    """Ranks are contiguous per node, in group-rank order; sizes agree everywhere."""
    world = sum(nprocs)
    assert sorted(evs) == list(range(world))
    offsets = [sum(nprocs[:g]) for g in range(len(nprocs))]
    ports = {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in evs.values()}
    assert len(ports) == 1, ports  # one workers' store per round
    for rank, e in evs.items():
        g = int(str(e["GROUP_RANK"]))
        lr = int(str(e["LOCAL_RANK"]))
        assert rank == offsets[g] + lr
        assert e["LOCAL_WORLD_SIZE"] == str(nprocs[g])
        assert e["WORLD_SIZE"] == e["ROLE_WORLD_SIZE"] == str(world)
        assert e["GROUP_WORLD_SIZE"] == str(len(nprocs))
        assert e["ROLE_RANK"] == str(rank)
        assert e["TORCHELASTIC_USE_AGENT_STORE"] == "True"


def two_agents(
    procs: list[subprocess.Popen[str]],
    nprocs: tuple[int, int],
    out: Path,
    actions: list[str],
    extra: tuple[str, ...] = (),
    nnodes: str = "2",
) -> list[subprocess.Popen[str]]:
    port = free_port()
    return [
        popen(
            procs,
            agent(
                "--nnodes",
                nnodes,
                "--nproc-per-node",
                str(n),
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"127.0.0.1:{port}",
                "--rdzv-id",
                "job",
                "--rdzv-conf",
                FAST,
                *extra,
                BEHAVE,
                str(out),
                *actions,
            ),
        )
        for n in nprocs
    ]
