"""Elastic jobs end to end: a node joins mid-run, a killed peer's partner re-forms."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.helpers.net import free_port
from tests.helpers.waiting import wait_for
from tests.runtime.agent.helpers import BEHAVE, FAST, agent, alive, events, popen, serving

# -- elasticity ----------------------------------------------------------------------------------


@pytest.mark.timeout(90)
def test_elastic_join_mid_run(tmp_path: Path, procs: list[subprocess.Popen[str]]) -> None:
    port = free_port()
    common = (
        "--nnodes",
        "1:2",
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        "el",
        "--rdzv-conf",
        FAST,
    )
    actions = (BEHAVE, str(tmp_path), "ready", "sleep-unless-world:4:60")
    first = popen(procs, agent(*common, *actions))
    wait_for(lambda: len(list(tmp_path.glob("ready.*"))) == 2, what="first agent's workers")
    alone = events(tmp_path)
    assert {e["WORLD_SIZE"] for e in alone} == {"2"}
    second = popen(procs, agent(*common, *actions))
    assert second.wait(timeout=60) == 0, second.communicate()[1]
    assert first.wait(timeout=60) == 0, first.communicate()[1]
    evs = events(tmp_path)[len(alone) :]
    # (on a loaded machine the second agent may first form a world alone; it ends at 4)
    assert sorted(int(str(e["RANK"])) for e in evs if e["WORLD_SIZE"] == "4") == [0, 1, 2, 3]
    # a membership change is not a failure restart
    assert {e["TORCHELASTIC_RESTART_COUNT"] for e in evs} == {"0"}
    for e in alone:
        assert not alive(int(str(e["pid"])))


def elastic_pair(port: int, run_id: str, conf: str = FAST) -> tuple[str, ...]:
    """The agent options of a ``--nnodes 1:2`` job of one worker per node."""
    return (
        "--nnodes",
        "1:2",
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        run_id,
        "--rdzv-conf",
        conf,
    )


@pytest.mark.timeout(120)
def test_elastic_peer_killed_the_other_reforms(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    port = free_port()
    # A last call long enough for the second agent to start on a busy machine (python start-up
    # alone can take seconds there): else the first agent forms a world alone, its worker
    # (world 1) exits at once and the job is over before the pair ever forms. Once both are in,
    # the round seals at once (MAX arrived); only the survivor's re-form waits it out.
    common = elastic_pair(
        port, "el2", FAST.replace("last_call_timeout=0.5", "last_call_timeout=10")
    )
    actions = (BEHAVE, str(tmp_path), "ready", "sleep-unless-world:1:60")
    host = popen(procs, agent(*common, *actions))
    # the first agent serves the store; the second is a client we may kill
    wait_for(lambda: serving(port), what="the first agent's rendezvous store", timeout=60)
    other = popen(procs, agent(*common, *actions))
    wait_for(lambda: len(events(tmp_path)) >= 2, what="a two-node world", timeout=60)
    pair = events(tmp_path)
    assert len(pair) == 2, pair  # one world at a time: the pair, nothing before it
    assert sorted((e["WORLD_SIZE"], e["GROUP_WORLD_SIZE"], e["GROUP_RANK"]) for e in pair) == [
        ("2", "2", "0"),
        ("2", "2", "1"),
    ]
    other.kill()
    assert host.wait(timeout=60) == 0, host.communicate()[1]
    # the survivor re-formed once, alone; a membership change is not a failure restart
    (last,) = events(tmp_path)[2:]
    assert (last["WORLD_SIZE"], last["GROUP_WORLD_SIZE"], last["GROUP_RANK"]) == ("1", "1", "0")
    assert last["TORCHELASTIC_RESTART_COUNT"] == "0"
    assert (last["MASTER_ADDR"], last["MASTER_PORT"]) == (
        pair[0]["MASTER_ADDR"],
        pair[0]["MASTER_PORT"],
    )


@pytest.mark.timeout(120)
def test_elastic_joiner_waits_for_the_running_world_to_stop(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    """A node joining a world with room makes it re-form with it, and the new world forms only
    once the old one's workers stopped: here they take 2 s to (a checkpoint on SIGTERM), four
    last calls. The joiner used to form a world alone meanwhile (two worlds of one job at once,
    both group rank 0 on one store), and the two agents then kept re-forming each other's
    world, never together."""
    port = free_port()
    # world 1: work (until stopped, slowly); world 2: done at once, so both agents exit 0
    actions = (BEHAVE, str(tmp_path), "slow-term:2", "sleep-unless-world:2:60")
    host = popen(procs, agent(*elastic_pair(port, "el3"), *actions))
    wait_for(lambda: len(events(tmp_path)) == 1, what="the first agent's world", timeout=60)
    (alone,) = events(tmp_path)
    other = popen(procs, agent(*elastic_pair(port, "el3"), *actions))
    wait_for(lambda: len(events(tmp_path)) >= 3, what="the next world", timeout=60)
    _, *nxt = events(tmp_path)[:3]
    assert sorted((e["WORLD_SIZE"], e["GROUP_RANK"]) for e in nxt) == [("2", "0"), ("2", "1")], nxt
    stopped = json.loads((tmp_path / f"stopped.{alone['pid']}").read_text())
    assert min(float(str(e["time"])) for e in nxt) > stopped  # one world at a time
    assert other.wait(timeout=60) == 0, other.communicate()[1]
    assert host.wait(timeout=60) == 0, host.communicate()[1]
    assert len(events(tmp_path)) == 3
