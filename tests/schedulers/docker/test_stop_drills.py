"""The docker stop drills (issue #33): ``docker stop -t 30`` of the app's containers (a node
drain, a host shutdown) and ``xrun cancel`` (``docker stop`` with the app's ``stop_timeout``).
A real 2x2 DDP job (tests/scripts/stop_drill.py, gloo on CPU; torch comes from the suite's venv,
bind-mounted: the base image has none): every rank sees the stop within a second of the first,
all stop after the same step with a complete checkpoint, and the job submitted again resumes
from it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.paths import TRAIN
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
from xrun.components.dist import ddp
from xrun.schedulers.docker import DockerScheduler
from xrun.schedulers.docker.request import container_name
from xrun.specs import AppState

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]

SITE = sysconfig.get_paths()["purelib"]  # torch, for the containers' python3 (3.11 both)


@pytest.fixture(scope="module")
def sched(docker_engine: str) -> Iterator[DockerScheduler]:
    s = DockerScheduler("default")
    yield s
    s.close()


def _submit(
    sched: DockerScheduler, ws: Path, out: Path, *args: str, script: str = DRILL.name
) -> str:
    """A 2x2 dist.ddp app of ``script`` (in ``ws``) with ``out`` at /out and the suite's torch."""
    app = ddp(
        *args,
        script=script,
        j="2x2",
        image="xrun-python:latest",
        env={"PYTHONPATH": "/opt/xrun:/venv-site"},
        mounts=[f"type=bind,src={out},dst=/out", f"type=bind,src={SITE},dst=/venv-site,readonly"],
    )
    return sched.submit(app, {"stop_timeout": 60}, str(ws))


def _wait_end(sched: DockerScheduler, app_id: str, timeout: float = 300) -> AppState:
    deadline = time.monotonic() + timeout
    while True:
        resp = sched.describe(app_id)
        if resp is not None and resp.state in (
            AppState.SUCCEEDED,
            AppState.FAILED,
            AppState.CANCELLED,
        ):
            return resp.state
        assert time.monotonic() < deadline, f"docker app {app_id} did not end: {resp}"
        time.sleep(0.5)


def _logs(sched: DockerScheduler, app_id: str, role: str = ROLE) -> str:
    return "".join("".join(sched.log_iter(app_id, role, k)) for k in (0, 1))


@pytest.mark.parametrize("how", ["docker-stop", "xrun-cancel"])
def test_a_stop_on_docker_saves_one_step_and_a_resubmit_resumes_from_it(
    sched: DockerScheduler, tmp_path: Path, how: str
) -> None:
    if not Path(SITE, "torch").is_dir():
        pytest.skip(f"no torch in {SITE}")
    ws, out = tmp_path / "ws", tmp_path / "out"
    ws.mkdir()
    out.mkdir()
    shutil.copy(DRILL, ws / DRILL.name)
    app_id = _submit(sched, ws, out, "/out")
    try:
        wait_ready(out, 4, timeout=300)
        t0 = time.time()
        if how == "docker-stop":
            names = [container_name(app_id, ROLE, k) for k in (0, 1)]
            subprocess.run(["docker", "stop", "-t", "30", *names], check=True, timeout=120)
        else:
            sched.cancel(app_id)
        state = _wait_end(sched, app_id)
    finally:
        sched.cancel(app_id)
    logs = _logs(sched, app_id)
    first = check_stopped(out, 4, t0)
    print(
        f"{how}: stopped after step {first.step}; the ranks saw it {first.spread:.2f} s apart, "
        f"the last {max(float(p.read_text()) for p in out.glob('seen.*')) - t0:.2f} s after "
        f"the stop was sent; the app ended {state.name}",
        file=sys.stderr,
    )
    assert drill_lines(logs, "stopping at step") == [first.step] * 4, logs
    # Each agent gave its workers the app's stop_timeout, not its own 30 s shutdown timeout.
    assert logs.count("the workers have 60s to stop") == 2, logs

    app_id = _submit(sched, ws, out, "/out")
    try:
        state = _wait_end(sched, app_id)
    finally:
        sched.cancel(app_id)
    logs = _logs(sched, app_id)
    assert state == AppState.SUCCEEDED, logs
    assert drill_lines(logs, "resuming from step") == [first.step] * 4, logs
    assert logs.count(f"done at step {first.step + 10}") == 4, logs


def test_the_example_stopped_by_docker_stop_resumes_bit_identical(
    sched: DockerScheduler, tmp_path: Path
) -> None:
    """examples/train_ddp.py's recipe on docker: ``docker stop -t 30`` of both containers
    mid-epoch (a node drain); every rank stops after the same step, rank 0 saves it and says so;
    the app submitted again resumes from that step and ends with the parameters of an
    undisturbed run (the same drill as local_cwd's SIGTERM to the supervisor)."""
    reference = example_reference(tmp_path)
    ws, out = tmp_path / "ws", tmp_path / "out"
    ws.mkdir()
    out.mkdir()
    shutil.copy(TRAIN, ws / TRAIN.name)
    args = [*EXAMPLE_ARGS, "--step-sleep", "0.2", "--checkpoint-dir", "/out/ckpt",
            "--out", "/out/result.json"]  # fmt: skip
    role = TRAIN.stem
    app_id = _submit(sched, ws, out, *args, script=TRAIN.name)
    try:
        deadline = time.monotonic() + 300
        while not re.search(r"^(?:\[\w+\]:)?step 5$", _logs(sched, app_id, role), re.M):
            assert time.monotonic() < deadline, _logs(sched, app_id, role)[-3000:]
            time.sleep(0.5)
        names = [container_name(app_id, role, k) for k in (0, 1)]
        subprocess.run(["docker", "stop", "-t", "30", *names], check=True, timeout=120)
        _wait_end(sched, app_id)
    finally:
        sched.cancel(app_id)
    first = _logs(sched, app_id, role)
    assert not (out / "result.json").exists(), "the stopped run finished: the stop came too late"
    app_id = _submit(sched, ws, out, *args, script=TRAIN.name)
    try:
        state = _wait_end(sched, app_id)
    finally:
        sched.cancel(app_id)
    second = _logs(sched, app_id, role)
    assert state == AppState.SUCCEEDED, second[-3000:]
    step = example_stop_and_resume(first + second)
    assert 5 <= step < 60, step
    assert json.loads((out / "result.json").read_text())["params_sha256"] == reference
