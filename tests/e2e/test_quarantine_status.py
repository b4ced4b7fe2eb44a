"""The job-wide budget and quarantine seen from ``xrun status`` (local_cwd, the real CLI and
agents): each local_cwd replica is its own node (``XRUN_NODE_ID=<role>/<i>``), so a replica
whose workers keep failing alone is quarantined and the app's error says so. The job is elastic
(``1:2``): a node is quarantined only when the job can form a world without it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.helpers.net import free_port
from tests.helpers.paths import XRUN

BAD_NODE = (
    "import os, time\n"
    "if os.environ['XRUN_NODE_ID'].endswith('/1'):\n"
    "    raise RuntimeError('bad node')\n"
    "if os.environ['WORLD_SIZE'] == '1':\n"  # the good node, on its own once the bad one left
    "    raise SystemExit(0)\n"
    "time.sleep(120)\n"
)


@pytest.mark.timeout(180)
def test_status_names_the_quarantined_replica(tmp_path: Path) -> None:
    script = tmp_path / "bad_node.py"
    script.write_text(BAD_NODE)
    run = subprocess.run(
        [
            XRUN, "run", "-s", "local_cwd", "-cfg", f"log_dir={tmp_path / 'logs'}", "dist.ddp",
            "-j", "1:2x1", "--rdzv_port", str(free_port()), "--max_retries", "3", "--script",
            str(script),
        ],
        cwd=tmp_path, capture_output=True, text=True, timeout=150,
    )  # fmt: skip
    handle = run.stdout.strip().splitlines()[0]
    status = subprocess.run(
        [XRUN, "status", handle], cwd="/", capture_output=True, text=True, timeout=60
    ).stdout
    assert "RuntimeError: bad node" in status, status  # the replica's root cause
    if run.returncode == 0:
        # The elastic job went on without the quarantined replica and ended well on the other.
        assert "SUCCEEDED" in status, status
        assert "quarantined: its workers failed alone 2 times" in status, status
        assert "bad_node/1" in status, status
    else:
        # The bad replica's agent served the store (whichever binds the port first): it is
        # never quarantined, since its leaving would end the job; the budget ends it instead.
        assert "FAILED" in status and "quarantined" not in status, status
        assert "restart budget spent: 3 of 3 restarts used (job-wide)" in status, status
