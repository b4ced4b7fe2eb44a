"""torch's collectives over xrun's store: two real processes form a gloo group whose
store is a TCPStore client of it (its own process), and reduce across it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.runtime.store.torch_fixtures import ServerProcess

WORKER = Path(__file__).with_name("torch_pg_worker.py")


def test_gloo_group_over_the_server(tserver: ServerProcess, tmp_path: Path) -> None:
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(tserver.port), str(rank), "2", str(tmp_path)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    outputs = [p.communicate(timeout=180)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(outputs)
    for rank in range(2):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert seen["sum"] == 3.0  # 1 + 2
        assert seen["group_sum"] == 2.0
        assert seen["objects"] == [{"rank": 0}, {"rank": 1}]
    assert tserver.dropped() == []
    assert tserver.alive()
