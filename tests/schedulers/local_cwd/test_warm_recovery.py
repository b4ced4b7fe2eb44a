"""``dist.ddp --recover warm`` on local_cwd (issue #34): a real 2x2 job of examples/train_ddp.py
(two agents, real gloo), a worker of the second replica SIGKILLed mid-training; it comes back
from the warm pool with its state from shared memory, 0 steps lost, bit-identical
(tests/helpers/warm_drill.py says what is asserted)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import warm_drill
from tests.helpers.paths import PY, TRAIN, XRUN
from xrun.schedulers.local_cwd import create_scheduler
from xrun.specs import AppState

pytestmark = pytest.mark.timeout(900)


def _logs(app_id: str) -> str:
    sched = create_scheduler("test")
    return "".join("".join(sched.log_iter(app_id, TRAIN.stem, k)) for k in (0, 1))


def test_a_killed_rank_on_the_second_node_recovers_warm_from_shared_memory(
    tmp_path: Path,
) -> None:
    ref = warm_drill.reference(tmp_path)
    marker = str(tmp_path / "ckpt")
    args = [*warm_drill.ARGS, *warm_drill.SLEEP, "--checkpoint-dir", marker,
            "--out", str(tmp_path / "result.json")]  # fmt: skip
    proc = subprocess.Popen(
        [XRUN, "run", "-s", "local_cwd", "dist.ddp", "-j", "2x2", "--recover", "warm",
         "--max_retries", "2", "--script", str(TRAIN), "--", *args],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    handle = proc.stdout.readline().strip()
    assert handle.startswith("local_cwd://"), handle
    app_id = handle.rsplit("/", 1)[1]
    try:
        deadline = time.monotonic() + 300
        step = re.compile(rf"(?:^|\]:)step {warm_drill.WAIT_STEP}$", re.M)
        while not step.search(_logs(app_id)):
            assert time.monotonic() < deadline and proc.poll() is None, "the job did not train"
            time.sleep(0.3)
        # both agents' pools full, then a worker of replica 1 (its agent's XRUN_NODE_ID)
        wait = [PY, str(warm_drill.KILLER), marker, "--ready", "2"]
        ready = subprocess.run([*wait, "--wait-only"], capture_output=True, text=True, timeout=400)
        assert ready.returncode == 0, ready.stdout + ready.stderr
        killed = subprocess.run(
            [*wait, "--env", f"XRUN_NODE_ID={TRAIN.stem}/1"],
            capture_output=True, text=True, timeout=400,
        )  # fmt: skip
        assert killed.returncode == 0, killed.stdout + killed.stderr
        print(killed.stdout, file=sys.stderr)
        _, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            subprocess.run([XRUN, "cancel", handle], capture_output=True, timeout=120)
    assert proc.returncode == 0, err[-3000:]
    resp = create_scheduler("test").describe(app_id)
    assert resp is not None and resp.state == AppState.SUCCEEDED, resp
    resumed = warm_drill.check(_logs(app_id), tmp_path / "result.json", ref)
    print(f"resumed after step {resumed}", file=sys.stderr)
    warm_drill.check_gone(warm_drill.armed(ready.stdout))
    warm_drill.check_gone(warm_drill.armed(killed.stdout))
