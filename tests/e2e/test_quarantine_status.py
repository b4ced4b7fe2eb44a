"""The job-wide budget and quarantine seen from ``xrun status`` (local_cwd, the real CLI and
agents): each local_cwd replica is its own node (``XRUN_NODE_ID=<role>/<i>``), so a replica
whose workers keep failing alone is quarantined and the app's error says so."""

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
    "time.sleep(120)\n"
)


@pytest.mark.timeout(180)
def test_status_names_the_quarantined_replica(tmp_path: Path) -> None:
    script = tmp_path / "bad_node.py"
    script.write_text(BAD_NODE)
    run = subprocess.run(
        [
            XRUN, "run", "-s", "local_cwd", "-cfg", f"log_dir={tmp_path / 'logs'}", "dist.ddp",
            "-j", "2x1", "--rdzv_port", str(free_port()), "--max_retries", "3", "--script",
            str(script),
        ],
        cwd=tmp_path, capture_output=True, text=True, timeout=150,
    )  # fmt: skip
    assert run.returncode == 1, run.stderr[-3000:]
    handle = run.stdout.strip().splitlines()[0]
    status = subprocess.run(
        [XRUN, "status", handle], cwd="/", capture_output=True, text=True, timeout=60
    ).stdout
    assert "FAILED" in status, status
    # the replica's root cause, then why it was not restarted again
    assert "RuntimeError: bad node" in status, status
    assert "quarantined: its workers failed alone 2 times" in status, status
    assert "bad_node/1" in status, status
