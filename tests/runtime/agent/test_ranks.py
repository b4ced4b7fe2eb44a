"""Ranks and the worker env end to end: real agents (`python -m xrun.runtime`), real workers,
loopback; standalone, two agents (c10d, IPv6, gloo all_reduce) and the static backend."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.helpers.net import free_port
from tests.runtime.agent.helpers import (
    ALLREDUCE,
    BEHAVE,
    FAST,
    agent,
    by_rank,
    check_world,
    events,
    popen,
    run,
    two_agents,
)

# -- ranks and env -------------------------------------------------------------------------------


def test_standalone_1x2_env(tmp_path: Path) -> None:
    p = run(agent("--nproc-per-node", "2", "--max-restarts", "3", BEHAVE, str(tmp_path)))
    assert p.returncode == 0, p.stderr
    evs = by_rank(events(tmp_path))
    check_world(evs, [2])
    e = evs[1]
    assert e["TORCHELASTIC_MAX_RESTARTS"] == "3" and e["OMP_NUM_THREADS"] == "1"
    assert e["MASTER_ADDR"] and 0 < int(str(e["MASTER_PORT"])) < 65536
    assert str(e["TORCHELASTIC_ERROR_FILE"]).endswith("/attempt_0/1/error.json")


@pytest.mark.parametrize("nprocs", [(2, 2), (1, 3)], ids=["2x2", "1+3"])
def test_two_agents_env(
    tmp_path: Path, procs: list[subprocess.Popen[str]], nprocs: tuple[int, int]
) -> None:
    agents = two_agents(procs, nprocs, tmp_path, [])
    for a in agents:
        assert a.wait(timeout=60) == 0, a.communicate()[1]
    evs = by_rank(events(tmp_path))
    # group ranks are deterministic but not tied to start order: read each node's size back
    sizes = {int(str(e["GROUP_RANK"])): int(str(e["LOCAL_WORLD_SIZE"])) for e in evs.values()}
    assert sorted(sizes.values()) == sorted(nprocs)
    check_world(evs, [sizes[0], sizes[1]])
    assert {e["TORCHELASTIC_RUN_ID"] for e in evs.values()} == {"job"}


def test_two_agents_over_ipv6(tmp_path: Path, procs: list[subprocess.Popen[str]]) -> None:
    """`--rdzv-endpoint [::1]:PORT`: the store serves and the agents join over IPv6."""
    port = free_port("::1")
    agents = [
        popen(
            procs,
            agent(
                "--nnodes",
                "2",
                "--nproc-per-node",
                "1",
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"[::1]:{port}",
                "--rdzv-id",
                "v6",
                "--rdzv-conf",
                FAST,
                BEHAVE,
                str(tmp_path),
            ),
        )
        for _ in range(2)
    ]
    for a in agents:
        assert a.wait(timeout=60) == 0, a.communicate()[1]
    check_world(by_rank(events(tmp_path)), [1, 1])


@pytest.mark.timeout(120)
def test_gloo_all_reduce_across_two_agents(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    port = free_port()
    agents = [
        popen(
            procs,
            agent(
                "--nnodes",
                "2",
                "--nproc-per-node",
                "1",
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"127.0.0.1:{port}",
                "--rdzv-id",
                "gloo",
                ALLREDUCE,
                str(tmp_path),
            ),
        )
        for _ in range(2)
    ]
    for a in agents:
        assert a.wait(timeout=100) == 0, a.communicate()[1]
    results = sorted(
        (json.loads(f.read_text()) for f in tmp_path.glob("allreduce.*.json")),
        key=lambda r: r["rank"],
    )
    # ranks contribute rank+1: 1 + 2 = 3 on both
    assert results == [{"rank": 0, "sum": 3.0}, {"rank": 1, "sum": 3.0}]


def test_static_backend(tmp_path: Path, procs: list[subprocess.Popen[str]]) -> None:
    port = free_port()
    agents = [
        popen(
            procs,
            agent(
                "--nnodes",
                "2",
                "--nproc-per-node",
                "2",
                "--node-rank",
                str(r),
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                str(port),
                BEHAVE,
                str(tmp_path),
            ),
        )
        for r in (1, 0)  # the non-host starts first: it must wait for the store
    ]
    for a in agents:
        assert a.wait(timeout=60) == 0, a.communicate()[1]
    evs = by_rank(events(tmp_path))
    check_world(evs, [2, 2])
    # --node-rank decides the group rank
    assert {e["GROUP_RANK"] for r, e in evs.items() if r < 2} == {"0"}
