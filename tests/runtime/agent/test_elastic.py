"""Elastic jobs end to end: a node joins mid-run, a killed peer's partner re-forms."""

from __future__ import annotations

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


@pytest.mark.timeout(90)
def test_elastic_peer_killed_the_other_reforms(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    port = free_port()
    common = (
        "--nnodes",
        "1:2",
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        "el2",
        "--rdzv-conf",
        FAST,
    )
    actions = (BEHAVE, str(tmp_path), "ready", "sleep-unless-world:1:60")
    host = popen(procs, agent(*common, *actions))
    # the first agent serves the store; the second is a client we may kill
    wait_for(lambda: serving(port), what="the first agent's rendezvous store")
    other = popen(procs, agent(*common, *actions))
    wait_for(
        lambda: {e["WORLD_SIZE"] for e in events(tmp_path)} == {"2"} and len(events(tmp_path)) == 2,
        what="a two-node world",
    )
    other.kill()
    assert host.wait(timeout=30) == 0, host.communicate()[1]
    last = events(tmp_path)[-1]
    assert (last["WORLD_SIZE"], last["GROUP_WORLD_SIZE"], last["TORCHELASTIC_RESTART_COUNT"]) == (
        "1",
        "1",
        "0",
    )
