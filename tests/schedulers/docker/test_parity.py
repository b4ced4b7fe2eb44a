"""The docker scheduler, for real, where the side-by-side comparison with TorchX found xrun
wrong: a static rendezvous over several containers, and ``--max_retries`` applied twice.

Jobs run in ``xrun-python:latest`` (python3, no torch): the workers of the two-agent job
exchange their ranks over TCP instead of a gloo all_reduce.
"""

# ruff: noqa: F811  (the docker_engine fixture is imported, then named by the tests)
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.docker import docker_engine  # noqa: F401
from tests.schedulers.docker.test_integration import WORKER
from xrun.components.dist import ddp
from xrun.schedulers.docker import DockerScheduler
from xrun.specs import AppState

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

ALWAYS_FAILS = """\
import os, sys
with open("/marks/attempts", "a") as f:
    f.write(f"attempt restart={os.environ['TORCHELASTIC_RESTART_COUNT']}\\n")
sys.exit(3)
"""


@pytest.fixture(scope="module")
def sched(docker_engine: str) -> Iterator[DockerScheduler]:
    s = DockerScheduler("default")
    yield s
    s.close()


def test_static_rendezvous_2x2_across_two_containers(
    sched: DockerScheduler, tmp_path: Path
) -> None:
    (tmp_path / "worker.py").write_text(WORKER)
    app = ddp(script="worker.py", j="2x2", image="xrun-python:latest", rdzv_backend="static")
    app_id = sched.submit(app, {}, workspace=str(tmp_path))
    resp = sched.wait(app_id, timeout=120)
    assert resp is not None and resp.state == AppState.SUCCEEDED, resp
    for k, ranks in ((0, (0, 1)), (1, (2, 3))):  # node rank k hosts ranks 2k, 2k+1
        text = "".join(sched.log_iter(app_id, "worker", k))
        for r in ranks:
            assert f"rank {r}/4 on {app_id}-worker-{k} got 6" in text, text


def test_a_job_that_always_fails_runs_max_retries_plus_one_times(
    sched: DockerScheduler, tmp_path: Path
) -> None:
    ws, marks = tmp_path / "ws", tmp_path / "marks"
    ws.mkdir()
    marks.mkdir()
    (ws / "fail.py").write_text(ALWAYS_FAILS)
    app = ddp(
        script="fail.py",
        j="1x1",
        image="xrun-python:latest",
        max_retries=2,
        mounts=[f"type=bind,src={marks},dst=/marks"],
    )
    app_id = sched.submit(app, {}, workspace=str(ws))
    resp = sched.wait(app_id, timeout=120)
    assert resp is not None and resp.state == AppState.FAILED, resp
    lines = (marks / "attempts").read_text().splitlines()
    assert lines == [f"attempt restart={i}" for i in range(3)]  # 2 in-place restarts, no more
    assert resp.num_restarts == 0  # the engine never restarted the container
