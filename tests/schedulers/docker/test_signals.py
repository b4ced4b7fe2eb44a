"""Signals on the docker scheduler (issue #7 item 3), against the real Docker Engine.

Every job is ``dist.ddp`` of tests/scripts/sigterm_worker.py: xrun's runtime agent in each
container (``--init``: tini is PID 1 and forwards SIGTERM to the agent), the workers writing
marker files into a bind-mounted host directory (the host cannot see the containers' pids).
The behaviour asserted is the one schedulers/docker/scheduler.py's docstring documents:

* ``xrun cancel`` -> every worker gets SIGTERM, the app and every replica end CANCELLED and
  ``xrun run --wait`` exits 1;
* a worker that ignores SIGTERM lives through the grace period, min(agent shutdown timeout,
  STOP_TIMEOUT), then dies of SIGKILL: the agent's (replica exit code 143) or the engine's
  (137);
* SIGTERM to one container from outside (a node drain) -> that replica FAILED with 143, its
  peer's agent sees the rendezvous closed and exits 1, the app ends FAILED;
* Ctrl-C (SIGINT) on ``xrun run --wait`` -> it cancels the job and exits 130.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.cli import xrun
from tests.helpers.sigterm_job import ROLE, WORKER, SigtermJob, SigtermJobs, wait_for
from xrun.components.dist import ddp
from xrun.schedulers.docker import STOP_TIMEOUT, DockerScheduler
from xrun.schedulers.docker.request import container_name
from xrun.specs import AppState

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

MARKS = "/marks"  # where the host's marker directory is mounted in every container


@pytest.fixture(scope="module")
def sched(docker_engine: str) -> Iterator[DockerScheduler]:
    s = DockerScheduler("default")
    yield s
    s.close()


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Only the worker: the workspace image is cached by content, so every test shares it."""
    ws = tmp_path_factory.mktemp("sigws")
    shutil.copy(WORKER, ws / WORKER.name)
    return ws


class Job(SigtermJob):
    """A docker job of the worker; also what it left on the engine."""

    def __init__(self, sched: DockerScheduler, marks: Path, app_id: str, j: str) -> None:
        super().__init__(sched, "docker", marks, app_id, j)

    def leftovers(self) -> list[str]:
        import docker

        client = docker.from_env()
        try:
            label = {"label": f"xrun.app_id={self.app_id}"}
            return [c.name for c in client.containers.list(all=True, filters=label)]
        finally:
            client.close()


def ddp_args(j: str, marks: Path, stubborn: str = "") -> list[str]:
    """``dist.ddp`` component arguments, as on the command line."""
    return [
        "-j",
        j,
        "--name",
        "sig/trainer",
        "--image",
        "xrun-python:latest",
        "--mounts",
        f"type=bind,src={marks},dst={MARKS}",
        "--script",
        WORKER.name,
        "--",
        MARKS,
        "--stubborn",
        stubborn or "-",
    ]


class Jobs(SigtermJobs[Job]):
    scheme = "docker"

    def make_job(self, marks: Path, app_id: str, j: str) -> Job:
        return Job(self.sched, marks, app_id, j)

    def cancel(self, job: Job) -> None:
        self.sched.cancel(job.app_id)

    def submit(
        self,
        j: str,
        stubborn: str = "",
        env: dict[str, str] | None = None,
        cfg: dict[str, object] | None = None,
    ) -> Job:
        """Through the scheduler API; returns once every worker is ready."""
        marks = self.new_marks()
        app = ddp(
            MARKS,
            "--stubborn",
            stubborn or "-",
            script=WORKER.name,
            j=j,
            name="sig/trainer",
            image="xrun-python:latest",
            env=env,
            mounts=[f"type=bind,src={marks},dst={MARKS}"],
        )
        return self.adopt(marks, self.sched.submit(app, cfg or {}, str(self.workspace)), j)

    def run_cli(self, j: str) -> tuple[subprocess.Popen[str], Job]:
        """``xrun run -s docker --wait`` from the workspace; returns once every worker is ready."""
        marks = self.new_marks()
        return self.start_cli(marks, j, ddp_args(j, marks))


@pytest.fixture
def jobs(sched: DockerScheduler, workspace: Path, tmp_path: Path) -> Iterator[Jobs]:
    started = Jobs(sched, workspace, tmp_path)
    yield started
    started.cleanup()


def test_cancel_sigterms_every_worker_and_ends_cancelled(jobs: Jobs) -> None:
    run, job = jobs.run_cli("2x1")
    t0 = time.time()
    cancel = xrun("cancel", job.handle)
    elapsed = time.time() - t0
    assert cancel.returncode == 0, cancel.stderr
    # `xrun run --wait` saw the end: exit 1 (0 only for SUCCEEDED).
    _, err = run.communicate(timeout=60)
    assert run.returncode == 1 and f"{job.handle} ended CANCELLED" in err, err
    for rank in job.ranks:
        assert job.term(rank) >= t0 - 0.5
    # Obedient workers: the stop ends as soon as they exit, before the engine's SIGKILL (its
    # STOP_TIMEOUT s): the exit codes below say so (137 would be that SIGKILL), not the time
    # the cancel took, which a busy machine stretches (8.9 s of 10 seen at load 15).
    # The replicas read CANCELLED, not FAILED, whatever their exit codes: 143 from an agent that
    # got the stop's SIGTERM, or 1 from one that first saw its peer close the rendezvous (both
    # stops run in parallel; either way that agent SIGTERMed its worker, as checked above).
    reps = job.replicas()
    assert [(k, state) for k, state, _ in reps] == [
        (0, AppState.CANCELLED),
        (1, AppState.CANCELLED),
    ]
    codes = [code for _, _, code in reps]
    # The first agent stopped got SIGTERM; none was SIGKILLed by the engine (137).
    assert set(codes) <= {143, 1} and 143 in codes, reps
    for k, code in enumerate(codes):
        why = "got SIGTERM: forwarding it to the workers" if code == 143 else "closed by a peer"
        assert why in job.log(k), (k, code, job.log(k))
    status = xrun("status", job.handle).stdout
    assert "State: CANCELLED" in status, status
    assert job.leftovers() == []
    print(f"docker cancel of 2x1, obedient workers: {elapsed:.2f} s, exit codes {codes}")


@pytest.mark.parametrize(
    ("agent_timeout", "stop_timeout", "grace", "exit_code"),
    [
        # The agent's shutdown timeout is the shorter: the agent SIGKILLs the stubborn worker,
        # then exits 143 by itself.
        (2.0, None, 2.0, 143),
        # dist.ddp's default (the agent's 30 s) outlasts the stop: the engine SIGKILLs the whole
        # container STOP_TIMEOUT s after the SIGTERM, agent included (137 = 128 + SIGKILL).
        (None, None, float(STOP_TIMEOUT), 137),
        # The same with the run option stop_timeout=3 (stored in the container: a cancel from
        # any process honours it).
        (None, 3, 3.0, 137),
    ],
    ids=["agent-shutdown-timeout", "engine-stop-timeout", "stop_timeout-run-option"],
)
def test_a_worker_that_ignores_sigterm_is_sigkilled_after_the_grace_period(
    jobs: Jobs, agent_timeout: float | None, stop_timeout: int | None, grace: float, exit_code: int
) -> None:
    env = {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(agent_timeout)} if agent_timeout else None
    cfg = {"stop_timeout": stop_timeout} if stop_timeout else None
    job = jobs.submit("1x2", stubborn="1", env=env, cfg=cfg)
    t0 = time.monotonic()
    job.sched.cancel(job.app_id)
    elapsed = time.monotonic() - t0
    # Rank 0 obeyed at once; rank 1 lived on through the grace period, and not much longer.
    assert job.lived_after_sigterm("0") < 1.0
    lived = job.lived_after_sigterm("1")
    assert grace - 0.5 <= lived < grace + 2.0, f"rank 1 lived {lived:.2f} s after SIGTERM"
    # cancel returns once the container has stopped: every process in it is gone by then.
    assert elapsed < grace + 4.0, f"cancel took {elapsed:.1f} s"
    beat = job.mark("1", "alive")
    time.sleep(0.3)
    assert job.mark("1", "alive") == beat, "the stubborn worker still beats after the cancel"
    assert job.replicas() == [(0, AppState.CANCELLED, exit_code)]
    assert job.leftovers() == []
    print(
        f"stubborn worker, grace {grace:g} s: lived {lived:.2f} s after SIGTERM, "
        f"cancel took {elapsed:.2f} s, replica exit code {exit_code}"
    )


def test_sigterm_to_one_container_fails_the_app(no_watcher: None, jobs: Jobs) -> None:
    import docker

    job = jobs.submit("2x1")
    client = docker.from_env()
    try:
        label = {"label": f"xrun.app_id={job.app_id}"}
        t0 = time.monotonic()
        # As a node drain would: SIGTERM to one container's PID 1 (tini), nothing else.
        client.containers.get(container_name(job.app_id, ROLE, 1)).kill(signal="SIGTERM")

        # Nobody asks xrun meanwhile (no watcher either), so no gang stop can race the agents:
        # the drained agent closes the (fixed-size) rendezvous and its peer ends by itself.
        def all_exited() -> bool:
            return {c.status for c in client.containers.list(all=True, filters=label)} == {"exited"}

        elapsed = wait_for(all_exited, 30, "both replicas to exit") - t0
    finally:
        client.close()
    resp = job.sched.describe(job.app_id)
    assert resp is not None and resp.state == AppState.FAILED, resp
    # The drained replica: its agent's 128 + SIGTERM. Its peer: 1, "closed by a peer".
    assert job.replicas() == [(0, AppState.FAILED, 1), (1, AppState.FAILED, 143)]
    assert f"replica {ROLE}/1 exited with code 143" in resp.msg, resp.msg
    assert "the job was closed by a peer" in resp.msg, resp.msg
    # Both workers were stopped with SIGTERM (the peer's by its own agent), the drained one first.
    assert job.term("1") <= job.term("0")
    assert elapsed < STOP_TIMEOUT - 2, f"the replicas took {elapsed:.1f} s to exit"
    status = xrun("status", job.handle).stdout
    assert "State: FAILED" in status and "exit_code=143" in status, status
    assert job.leftovers() == []
    print(f"SIGTERM to one of 2 containers: both exited after {elapsed:.2f} s, app FAILED")


def test_ctrl_c_on_xrun_run_wait_cancels_the_job(jobs: Jobs) -> None:
    """SIGINT to ``xrun run --wait`` (Ctrl-C in its terminal) is a cancel: documented in
    src/xrun/cli/cmd_run.py, exit 130 (128 + SIGINT)."""
    run, job = jobs.run_cli("1x2")
    t0 = time.time()
    run.send_signal(signal.SIGINT)
    _, err = run.communicate(timeout=60)
    assert run.returncode == 130 and f"interrupted: cancelling {job.handle}" in err, err
    for rank in job.ranks:
        assert job.term(rank) >= t0 - 0.5
    # One agent, no peer to race: it got the stop's SIGTERM and exited 143.
    assert job.replicas() == [(0, AppState.CANCELLED, 143)]
    assert "State: CANCELLED" in xrun("status", job.handle).stdout
    assert job.leftovers() == []
