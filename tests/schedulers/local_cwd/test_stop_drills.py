"""The local_cwd stop drills (issue #33): SIGTERM to the supervisor, and ``xrun cancel`` (the
same SIGTERM, sent by the CLI), with ``stop_grace_s`` as the grace. A real 2x2 DDP job
(tests/scripts/stop_drill.py, gloo on CPU): every rank sees the stop within a second, all stop
after the same step with a complete checkpoint, and running the job again resumes from it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.paths import TRAIN, XRUN
from tests.helpers.stop_drill import (
    DRILL,
    EXAMPLE_ARGS,
    ROLE,
    check_stopped,
    drill_lines,
    example_reference,
    example_stop_and_resume,
    wait_ready,
)
from xrun.schedulers.local_cwd import create_scheduler, statedir
from xrun.specs import AppState

pytestmark = pytest.mark.timeout(600)


def _run(
    tmp: Path, out: Path, script: Path = DRILL, *args: str
) -> tuple[subprocess.Popen[str], str]:
    """``xrun run`` of a 2x2 drill (it waits for the job on local_cwd); the handle."""
    proc = subprocess.Popen(
        [XRUN, "run", "-s", "local_cwd", "-cfg", "stop_grace_s=60", "dist.ddp", "-j", "2x2",
         "--script", str(script), "--", *(args or [str(out)])],
        cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    handle = proc.stdout.readline().strip()
    assert handle.startswith("local_cwd://"), handle
    return proc, handle


def _logs(app_id: str, role: str = ROLE) -> str:
    sched = create_scheduler("test")
    return "".join("".join(sched.log_iter(app_id, role, k)) for k in (0, 1))


@pytest.mark.parametrize("how", ["sigterm-supervisor", "xrun-cancel"])
def test_a_stop_on_local_cwd_saves_one_step_and_a_rerun_resumes_from_it(
    tmp_path: Path, how: str
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    proc, handle = _run(tmp_path, out)
    app_id = handle.rsplit("/", 1)[1]
    try:
        wait_ready(out, 4)
        t0 = time.time()
        if how == "sigterm-supervisor":
            paths = statedir.find(app_id)
            assert paths is not None
            st = statedir.read_state(paths.state)
            assert st is not None
            os.kill(st["supervisor"]["pid"], signal.SIGTERM)
        else:
            subprocess.run([XRUN, "cancel", handle], check=True, capture_output=True, timeout=120)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            subprocess.run([XRUN, "cancel", handle], capture_output=True, timeout=120)
    assert f"{handle} ended CANCELLED" in err, err
    # `xrun cancel` sends its SIGTERM once the CLI has started (seconds on a busy machine):
    # from there, as from the test's own SIGTERM, the ranks are timed by the first to see it.
    first = check_stopped(out, 4, t0 if how == "sigterm-supervisor" else None)
    print(f"{how}: stopped after step {first.step}; seen {first.spread:.2f} s apart")
    logs = _logs(app_id)
    assert drill_lines(logs, "stopping at step") == [first.step] * 4, logs
    # Each agent gave its workers stop_grace_s, not its own 30 s shutdown timeout.
    assert logs.count("the workers have 60s to stop") == 2, logs

    # The same job again: every rank resumes from the agreed step and finishes.
    proc, handle = _run(tmp_path, out)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    logs = _logs(handle.rsplit("/", 1)[1])
    assert drill_lines(logs, "resuming from step") == [first.step] * 4, logs
    assert logs.count(f"done at step {first.step + 10}") == 4, logs
    assert create_scheduler("test").describe(handle.rsplit("/", 1)[1]).state == AppState.SUCCEEDED


def test_the_example_stopped_by_sigterm_to_the_supervisor_resumes_bit_identical(
    tmp_path: Path,
) -> None:
    # examples/train_ddp.py's recipe: SIGTERM to the supervisor mid-epoch; rank 0 saves the
    # agreed step and says so; the same command again resumes from it and ends with the
    # parameters of an undisturbed run.
    reference = example_reference(tmp_path)
    args = [*EXAMPLE_ARGS, "--step-sleep", "0.2", "--checkpoint-dir", str(tmp_path / "ckpt"),
            "--out", str(tmp_path / "result.json")]  # fmt: skip
    role = TRAIN.stem
    proc, handle = _run(tmp_path, tmp_path, TRAIN, *args)
    app_id = handle.rsplit("/", 1)[1]
    try:
        deadline = time.monotonic() + 180
        while not re.search(r"^(?:\[\w+\]:)?step 5$", _logs(app_id, role), re.M):
            assert time.monotonic() < deadline and proc.poll() is None, "the job did not train"
            time.sleep(0.3)
        paths = statedir.find(app_id)
        assert paths is not None
        st = statedir.read_state(paths.state)
        assert st is not None
        os.kill(st["supervisor"]["pid"], signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            subprocess.run([XRUN, "cancel", handle], capture_output=True, timeout=120)
    assert f"{handle} ended CANCELLED" in err, err
    first = _logs(app_id, role)
    proc, handle = _run(tmp_path, tmp_path, TRAIN, *args)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    step = example_stop_and_resume(first + _logs(handle.rsplit("/", 1)[1], role))
    assert 5 <= step < 60, step
    assert json.loads((tmp_path / "result.json").read_text())["params_sha256"] == reference
