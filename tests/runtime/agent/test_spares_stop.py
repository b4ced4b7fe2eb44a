"""A spare on a requested stop: it exits as the job's active nodes do (128 + the signal), not 1
as if the job had failed (docs/runtime.md, "Graceful stops")."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from tests.helpers.net import free_port
from tests.helpers.paths import SCRIPTS
from tests.helpers.waiting import wait_for
from tests.runtime.agent.helpers import agent, serving
from tests.runtime.agent.test_spares import ADDR, CONF, spawn, stderr

STOP_WORKER = str(SCRIPTS / "stop_worker.py")


@pytest.mark.timeout(240)
def test_a_spare_exits_like_the_active_nodes_on_a_stop_request(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    port = free_port()

    def start(name: str) -> subprocess.Popen[str]:
        cmd = agent(
            "--nnodes", "2", "--nproc-per-node", "1", "--spares", "1", "--max-restarts", "3",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "ss",
            "--local-addr", ADDR[name], "--shutdown-timeout", "2",
            "--rdzv-conf", CONF.format(join=60), STOP_WORKER, str(tmp_path),
        )  # fmt: skip
        return spawn(procs, cmd, tmp_path, name)

    a = start("a")
    wait_for(lambda: serving(port), what="the first agent's store", timeout=60)
    b = start("b")
    wait_for(lambda: len(list(tmp_path.glob("ready.*"))) == 2, timeout=120, what="2 ranks")
    c = start("c")
    wait_for(lambda: "standing by as a spare" in stderr(tmp_path, "c"), timeout=60, what="a spare")
    b.send_signal(signal.SIGTERM)  # a stop request: a learns it through the store, c too
    stopped = 128 + signal.SIGTERM
    for name, p in (("b", b), ("a", a), ("c", c)):
        assert p.wait(timeout=90) == stopped, (name, stderr(tmp_path, name))
