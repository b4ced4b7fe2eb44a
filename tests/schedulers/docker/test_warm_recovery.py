"""``dist.ddp --recover warm`` on the real Docker Engine (issue #34): examples/train_ddp.py as a
2x2 job (one container per node; torch from the suite's venv, bind-mounted: the base image has
none). Once both containers' pools are full, ``docker exec`` into the second one SIGKILLs a
worker; its agent replaces the workers from the pool, the ranks restore their state from the
snapshots in the container's /dev/shm, 0 steps lost, bit-identical, and the app SUCCEEDS
(tests/helpers/warm_drill.py says what is asserted)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import warm_drill
from tests.helpers.paths import TRAIN
from xrun.components.dist import ddp
from xrun.schedulers.docker import DockerScheduler
from xrun.schedulers.docker.request import container_name
from xrun.specs import AppState

pytestmark = [pytest.mark.docker, pytest.mark.timeout(900)]

SITE = sysconfig.get_paths()["purelib"]  # torch, for the containers' python3 (3.11 both)
ROLE = TRAIN.stem


@pytest.fixture(scope="module")
def sched(docker_engine: str) -> Iterator[DockerScheduler]:
    s = DockerScheduler("default")
    yield s
    s.close()


def _logs(sched: DockerScheduler, app_id: str) -> str:
    return "".join("".join(sched.log_iter(app_id, ROLE, k)) for k in (0, 1))


def _wait_end(sched: DockerScheduler, app_id: str, timeout: float) -> AppState:
    deadline = time.monotonic() + timeout
    while True:
        resp = sched.describe(app_id)
        if resp is not None and resp.state in (AppState.SUCCEEDED, AppState.FAILED):
            return resp.state
        assert time.monotonic() < deadline, f"docker app {app_id} did not end: {resp}"
        time.sleep(0.5)


def _in(app_id: str, replica: int, *args: str) -> subprocess.CompletedProcess[str]:
    """tests/scripts/kill_worker.py (copied to /out) run in the replica's container."""
    name = container_name(app_id, ROLE, replica)
    cmd = ["docker", "exec", name, "python3", "/out/kill_worker.py", "/out/ckpt", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=400)


def _memory(app_id: str) -> str:
    """Each container's memory use and peak so far (cgroup v1 or v2), for the eye: a pool
    interpreter per worker must fit in the replica's memMB beside the workers."""
    out = []
    for k in (0, 1):
        read = (
            "cat /sys/fs/cgroup/memory/memory.usage_in_bytes "
            "/sys/fs/cgroup/memory/memory.max_usage_in_bytes 2>/dev/null || "
            "cat /sys/fs/cgroup/memory.current /sys/fs/cgroup/memory.peak 2>/dev/null"
        )
        got = subprocess.run(
            ["docker", "exec", container_name(app_id, ROLE, k), "sh", "-c", read],
            capture_output=True, text=True, timeout=60,
        ).stdout.split()  # fmt: skip
        mib = [f"{int(x) / 2**20:.0f} MiB" for x in got if x.isdigit()]
        out.append(f"replica {k}: {' / peak '.join(mib) or 'n/a'}")
    return "; ".join(out)


def test_a_killed_worker_recovers_warm_in_its_container(
    sched: DockerScheduler, tmp_path: Path
) -> None:
    if not Path(SITE, "torch").is_dir():
        pytest.skip(f"no torch in {SITE}")
    ref = warm_drill.reference(tmp_path)
    ws, out = tmp_path / "ws", tmp_path / "out"
    ws.mkdir()
    out.mkdir()
    shutil.copy(TRAIN, ws / TRAIN.name)
    shutil.copy(warm_drill.KILLER, out / warm_drill.KILLER.name)
    app = ddp(
        *warm_drill.ARGS, *warm_drill.SLEEP, "--checkpoint-dir", "/out/ckpt",
        "--out", "/out/result.json",
        script=TRAIN.name, j="2x2", recover="warm", max_retries=2, image="xrun-python:latest",
        env={"PYTHONPATH": "/opt/xrun:/venv-site"},
        mounts=[f"type=bind,src={out},dst=/out", f"type=bind,src={SITE},dst=/venv-site,readonly"],
    )  # fmt: skip
    app_id = sched.submit(app, {}, str(ws))
    try:
        deadline = time.monotonic() + 300
        step = re.compile(rf"(?:^|\]:)step {warm_drill.WAIT_STEP}$", re.M)
        while not step.search(_logs(sched, app_id)):
            assert time.monotonic() < deadline, "the job did not train:\n" + _logs(sched, app_id)
            time.sleep(0.5)
        waited = _in(app_id, 0, "--ready", "2", "--wait-only")
        assert waited.returncode == 0, waited.stdout + waited.stderr
        print(f"memory with full pools: {_memory(app_id)}", file=sys.stderr)
        killed = _in(app_id, 1, "--ready", "2")
        assert killed.returncode == 0, killed.stdout + killed.stderr
        print(f"container 1: {killed.stdout}", file=sys.stderr)
        state = _wait_end(sched, app_id, timeout=600)
        logs = _logs(sched, app_id)
    finally:
        sched.cancel(app_id)
    assert state == AppState.SUCCEEDED, logs[-4000:]
    resumed = warm_drill.check(logs, out / "result.json", ref)
    print(f"resumed after step {resumed}", file=sys.stderr)
