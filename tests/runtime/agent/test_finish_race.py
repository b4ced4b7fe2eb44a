"""The exit barrier against a newcomer: once a node of the round finished, a node that arrives
(an elastic job's late node, a spare) waits for the job to end instead of re-forming the round
under the finished node's exit barrier."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers.net import free_port
from tests.helpers.waiting import wait_for
from tests.runtime.agent.helpers import FAST, agent, popen, serving
from xrun.runtime.store.client import StoreClient

# Node "b"'s worker runs until the test writes OUT/go; the others' exit at once.
WORKER = """
import json, os, sys, time
out = sys.argv[1]
with open(os.path.join(out, "runs.jsonl"), "a") as f:
    f.write(json.dumps({"node": os.environ["NODE"], "pid": os.getpid()}) + "\\n")
if os.environ["NODE"] == "b":
    while not os.path.exists(os.path.join(out, "go")):
        time.sleep(0.05)
"""


@pytest.mark.timeout(180)
def test_a_newcomer_does_not_reform_a_round_whose_host_finished(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    port, run_id = free_port(), "finrace"
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    # 2:3 nodes: the round of a and b has room, so a third node asks it to re-form. A long
    # exit barrier: the bug made the job end only when it ran out (then failed).
    conf = f"{FAST},exit_barrier_timeout=120"
    cmd = agent(
        "--nnodes", "2:3", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run_id, "--rdzv-conf", conf,
        str(script), str(tmp_path),
    )  # fmt: skip

    def start(node: str) -> subprocess.Popen[str]:
        return popen(procs, cmd, env={**os.environ, "NODE": node})

    a = start("a")
    wait_for(lambda: serving(port), what="the host's store")
    b = start("b")
    c = StoreClient("127.0.0.1", port, read_timeout=150.0)
    try:
        # a's worker exited: a is at the exit barrier of round 0 (its fin is in), b still runs.
        fins = [f"{run_id}/rdzv/0/fin/{i}" for i in (1, 2)]
        assert c.wait(fins, want_all=False, timeout=90) is not None, "a never finished"
        newcomer = start("c")
        # The newcomer took its place in round 1: it has said what it had to say about round 0.
        assert c.wait([f"{run_id}/rdzv/1/node/1"], timeout=90) is not None
        assert c.get(f"{run_id}/rdzv/0/stale") is None, "the newcomer re-formed a finished round"
    finally:
        c.close()
    (tmp_path / "go").write_text("")
    for p in (a, b, newcomer):
        assert p.wait(timeout=60) == 0, p.communicate()[1]
    runs = [json.loads(x)["node"] for x in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert sorted(runs) == ["a", "b"]  # b's script ran once; the newcomer ran nothing
