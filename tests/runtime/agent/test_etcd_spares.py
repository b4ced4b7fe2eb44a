"""Warm spares on the etcd rendezvous with real agents and real gloo workers (issue #35): the
node that holds group rank 0 - with c10d the store's host, which cannot be replaced - is lost
(SIGKILL of its agent's process group); the spare takes group rank 0 and its RANKs, the world
re-forms with the survivor on its own slot and the job finishes 0; an agent of the lost node
that comes back is refused in one line."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.helpers.paths import SCRIPTS
from tests.helpers.waiting import wait_for
from tests.runtime.agent.helpers import agent
from tests.runtime.agent.test_spares import lose, spawn, stderr, warm_children, world

WORKER = str(SCRIPTS / "spare_worker.py")
# etcd's shortest lease is 2 s: a lost node is seen in ~2-3 s
CONF = "heartbeat_interval=0.2,heartbeat_timeout=2,last_call_timeout=5,join_timeout=60"


@pytest.fixture
def procs() -> object:
    started: list[subprocess.Popen[str]] = []
    yield started
    for p in started:
        if p.poll() is None:
            os.killpg(p.pid, 9)
        p.wait(timeout=30)


def _start(
    procs: list[subprocess.Popen[str]], etcd: str, rid: str, out: Path, name: str, recover: str
) -> subprocess.Popen[str]:
    cmd = agent(
        "--nnodes", "2", "--nproc-per-node", "1", "--spares", "1", "--max-restarts", "3",
        "--rdzv-backend", "etcd", "--rdzv-endpoint", etcd, "--rdzv-id", rid,
        "--local-addr", "127.0.0.1", "--rdzv-conf", CONF, "--recover", recover,
        WORKER, str(out),
    )  # fmt: skip
    return spawn(procs, cmd, out, name)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("recover", ["off", "warm"])
def test_a_spare_replaces_the_node_of_group_rank_0(
    etcd: str, tmp_path: Path, procs: list[subprocess.Popen[str]], recover: str
) -> None:
    rid = f"s{uuid.uuid4().hex[:12]}"
    agents = {n: _start(procs, etcd, rid, tmp_path, n, recover) for n in "ab"}
    first = world(tmp_path, 1)
    agents["c"] = _start(procs, etcd, rid, tmp_path, "c", recover)
    wait_for(lambda: "standing by as a spare" in stderr(tmp_path, "c"), timeout=60, what="spare")
    if recover == "warm":  # its pool's child imported torch (slow on a busy host)
        wait_for(lambda: warm_children(agents["c"].pid), timeout=180, what="a warm child")
    zero = next(e for e in first if e["GROUP_RANK"] == "0")
    one = next(e for e in first if e["GROUP_RANK"] == "1")
    lose(agents[str(zero["XRUN_NODE_ID"])])
    second = world(tmp_path, 2)
    place = {str(e["XRUN_NODE_ID"]): (e["RANK"], e["GROUP_RANK"]) for e in second}
    assert place == {"c": ("0", "0"), str(one["XRUN_NODE_ID"]): ("1", "1")}, second
    assert [e["sum"] for e in second] == [3.0, 3.0]  # a real gloo world of ranks 0 and 1
    # the lost node's agent comes back: refused at its first join, in one line, exit 1
    back = _start(procs, etcd, rid, tmp_path, f"{zero['XRUN_NODE_ID']}", recover)
    assert back.wait(timeout=60) != 0
    last = stderr(tmp_path, str(zero["XRUN_NODE_ID"])).strip().splitlines()[-1]
    assert f"node {zero['XRUN_NODE_ID']} (host 127.0.0.1) is quarantined" in last, last
    (tmp_path / "go").touch()
    for name in ("c", str(one["XRUN_NODE_ID"])):
        assert agents[name].wait(timeout=120) == 0, stderr(tmp_path, name)
    warm = "1 of 1 workers started warm (--recover warm)" in stderr(tmp_path, "c")
    assert warm == (recover == "warm"), stderr(tmp_path, "c")
