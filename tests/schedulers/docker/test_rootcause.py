"""docker status names a failed rank's root cause (issue #24, item 4), the OOM killer's kill
under the container's memory limit (``--memMB``, ``docker run --memory``) included: the
replica's runtime agent reads its memory cgroup's ``oom_kill`` count inside the container, and
its last stderr line is what the status keeps."""

from __future__ import annotations

# ruff: noqa: F811  (the docker_engine fixture is imported, then named by the tests)
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.docker import docker_engine  # noqa: F401
from tests.helpers.paths import REPO
from xrun.components.dist import ddp
from xrun.schedulers.docker import DockerScheduler
from xrun.specs import AppState

pytestmark = [pytest.mark.docker, pytest.mark.timeout(240)]
XRUN = str(Path(sys.executable).parent / "xrun")


@pytest.fixture(scope="module")
def sched(docker_engine: str) -> Iterator[DockerScheduler]:
    s = DockerScheduler("default")
    yield s
    s.close()


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ws = tmp_path_factory.mktemp("ws")
    shutil.copy(REPO / "benchmarks" / "workers" / "faults.py", ws / "faults.py")
    return ws


@pytest.mark.parametrize(
    ("fault", "mem", "cause"),
    [
        ("raise", 1024, "ValueError: bad shape in batch 7 (rank 1, faults.py:22)"),
        ("oom", 256, "killed by the OOM killer: out of memory (SIGKILL; memory cgroup /: oom_kill"),
    ],
)
def test_status_names_the_rank_and_cause(
    sched: DockerScheduler, workspace: Path, fault: str, mem: int, cause: str
) -> None:
    app = ddp(
        fault, "1", script="faults.py", j="1x2", image="xrun-python:latest", memMB=mem, name=fault
    )
    app_id = sched.submit(app, {}, workspace=str(workspace))
    resp = sched.wait(app_id, timeout=120)
    assert resp is not None and resp.state == AppState.FAILED, resp
    rep = resp.roles_statuses[0].replicas[0]
    assert rep.structured_error_msg.startswith(cause), rep
    assert rep.structured_error_msg.endswith("(rank 1)") or fault == "raise"
    # another process's `xrun status`: the first screen names it
    out = subprocess.run(
        [XRUN, "status", f"docker://default/{app_id}"], capture_output=True, text=True, timeout=60
    ).stdout
    assert f"error: {cause}" in out and f"Error: {cause}" in out, out
    assert f"replica faults/0 exited with code 1: {cause}" in out, out
