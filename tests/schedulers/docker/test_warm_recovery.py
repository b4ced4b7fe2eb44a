"""``dist.ddp --recover warm`` on the real Docker Engine (issue #34): examples/train_ddp.py as a
2x2 job (one container per node; torch from the suite's venv, bind-mounted: the base image has
none). Once both containers' pools are full, ``docker exec`` into the second one SIGKILLs a
worker; its agent replaces the workers from the pool, the ranks restore their state from the
snapshots in the container's /dev/shm, 0 steps lost, bit-identical, and the app SUCCEEDS
(tests/helpers/warm_drill.py says what is asserted)."""

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


def _submit(sched: DockerScheduler, tmp_path: Path, j: str) -> tuple[str, Path, str]:
    """The drill's job (``-j j``, ``--recover warm``) submitted; its app id, the /out folder
    (checkpoints, result, the killer script) and the undisturbed run's parameters."""
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
        script=TRAIN.name, j=j, recover="warm", max_retries=2, image="xrun-python:latest",
        env={"PYTHONPATH": "/opt/xrun:/venv-site"},
        mounts=[f"type=bind,src={out},dst=/out", f"type=bind,src={SITE},dst=/venv-site,readonly"],
    )  # fmt: skip
    return sched.submit(app, {}, str(ws)), out, ref


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
    app_id, out, ref = _submit(sched, tmp_path, "2x2")
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


def test_a_pool_that_does_not_fit_the_memory_limit_waits_instead_of_an_oom(
    sched: DockerScheduler, tmp_path: Path
) -> None:
    """1x4 with dist.ddp's default memMB (1024): four workers and four warm interpreters do
    not fit (before: the pool's imports got the container OOM-killed with no fault at all,
    the app FAILED). The pool waits for room instead, says so once, and a killed worker's
    restart starts cold, from the snapshots: 0 steps lost, bit-identical, SUCCEEDED."""
    app_id, out, ref = _submit(sched, tmp_path, "1x4")
    log0 = lambda: "".join(sched.log_iter(app_id, ROLE, 0))  # noqa: E731
    try:
        deadline = time.monotonic() + 300
        step = re.compile(rf"(?:^|\]:)step {warm_drill.WAIT_STEP}$", re.M)
        while "no room for a warm interpreter" not in log0() or not step.search(log0()):
            desc = sched.describe(app_id)
            assert desc is not None and desc.state == AppState.RUNNING, log0()[-4000:]
            assert time.monotonic() < deadline, "the pool never said it waits:\n" + log0()
            time.sleep(0.5)
        print(f"memory: {_memory(app_id)}", file=sys.stderr)
        killed = subprocess.run(
            ["docker", "exec", container_name(app_id, ROLE, 0), "python3", "/out/kill_worker.py",
             "/out/ckpt"],
            capture_output=True, text=True, timeout=400,
        )  # fmt: skip
        assert killed.returncode == 0, killed.stdout + killed.stderr + log0()[-4000:]
        state = _wait_end(sched, app_id, timeout=600)
        logs = log0()
    finally:
        sched.cancel(app_id)
    assert state == AppState.SUCCEEDED, logs[-4000:]
    assert "killed by the OOM killer" not in logs and "killed by SIGKILL" in logs, logs[-4000:]
    assert logs.count("no room for a warm interpreter") == 1, logs[-4000:]
    assert len(re.findall(r"rank 0: resuming after step \d+ from shared memory", logs)) == 1
    assert warm_drill.steps(logs) == list(range(1, warm_drill.EPOCHS * warm_drill.SPE + 1))
    assert json.loads((out / "result.json").read_text())["params_sha256"] == ref
