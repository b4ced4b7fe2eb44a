"""Workers see the same environment under xrun's agent as under torchrun 2.13.

Both launchers run tests/scripts/env_dump.py; every variable of the contract is compared.
Values that are random by design (ports, standalone run ids, temp log dirs) are compared by form.
Both launchers' workers use the agent's store (TORCHELASTIC_USE_AGENT_STORE=True): xrun's agent
serves torch's TCPStore protocol on its rendezvous port.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.net import free_port
from tests.helpers.paths import SCRIPTS, TORCHRUN

SCRIPT = str(SCRIPTS / "env_dump.py")
SAME = (
    "LOCAL_RANK RANK GROUP_RANK ROLE_RANK ROLE_NAME LOCAL_WORLD_SIZE WORLD_SIZE GROUP_WORLD_SIZE "
    "ROLE_WORLD_SIZE TORCHELASTIC_RESTART_COUNT TORCHELASTIC_MAX_RESTARTS "
    "TORCH_NCCL_ASYNC_ERROR_HANDLING OMP_NUM_THREADS PYTHONUNBUFFERED TORCHELASTIC_USE_AGENT_STORE argv"
).split()


def launch(launcher: list[str], flags: list[str], out: Path, nodes: int) -> dict[int, dict]:
    out.mkdir()
    procs = [
        subprocess.Popen(
            [*launcher, *flags, SCRIPT, str(out), "x", "${local_rank}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(nodes)
    ]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    return {int(f.name.split(".")[0]): json.loads(f.read_text()) for f in out.glob("*.0.json")}


def is_local_host(name: str) -> bool:
    local = {"127.0.0.1", "::1"} | {i[4][0] for i in socket.getaddrinfo(socket.gethostname(), None)}
    return bool({i[4][0] for i in socket.getaddrinfo(name, None)} & local)


def compare(ours: dict[int, dict], theirs: dict[int, dict], world: int, run_id: str | None) -> None:
    assert sorted(ours) == sorted(theirs) == list(range(world))
    for rank in range(world):
        a, b = ours[rank], theirs[rank]
        for k in SAME:
            assert a[k] == b[k], (rank, k, a[k], b[k])
        assert a["argv"] == ["x", str(rank % 2)]  # ${local_rank} substituted
        # python -u <script> <out dir> x <local rank>: the same interpreter flags and arguments
        assert a["orig_argv"][:2] + a["orig_argv"][3:] == b["orig_argv"][:2] + b["orig_argv"][3:]
        assert a["MASTER_PORT"].isdigit() and b["MASTER_PORT"].isdigit()
        assert is_local_host(a["MASTER_ADDR"]) and is_local_host(b["MASTER_ADDR"])
        if run_id is None:  # standalone: a random uuid4 each
            assert len(a["TORCHELASTIC_RUN_ID"]) == len(b["TORCHELASTIC_RUN_ID"]) == 36
        else:
            assert a["TORCHELASTIC_RUN_ID"] == b["TORCHELASTIC_RUN_ID"] == run_id
        tail = ["attempt_0", str(rank % 2), "error.json"]
        assert a["TORCHELASTIC_ERROR_FILE"].split("/")[-3:] == tail
        assert b["TORCHELASTIC_ERROR_FILE"].split("/")[-3:] == tail
    # one workers' store per job
    assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in ours.values()}) == 1


@pytest.mark.timeout(120)
def test_standalone_1x2(tmp_path: Path) -> None:
    flags = ["--nproc-per-node", "2"]
    ours = launch([sys.executable, "-m", "xrun.runtime"], flags, tmp_path / "xrun", 1)
    theirs = launch([TORCHRUN], flags, tmp_path / "torchrun", 1)
    compare(ours, theirs, 2, None)


@pytest.mark.timeout(180)
def test_two_agents_x2(tmp_path: Path) -> None:
    def flags() -> list[str]:
        return [
            "--nnodes",
            "2",
            "--nproc-per-node",
            "2",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{free_port()}",
            "--rdzv-id",
            "job",
            "--max-restarts",
            "1",
        ]

    ours = launch([sys.executable, "-m", "xrun.runtime"], flags(), tmp_path / "xrun", 2)
    theirs = launch([TORCHRUN], flags(), tmp_path / "torchrun", 2)
    compare(ours, theirs, 4, "job")
