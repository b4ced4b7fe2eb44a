"""Signals on the docker scheduler (issue #7 item 3), against the real Docker Engine.

Every job is ``dist.ddp`` of tests/scripts/sigterm_worker.py: xrun's runtime agent in each
container (``--init``: tini is PID 1 and forwards SIGTERM to the agent), the workers writing
marker files into a bind-mounted host directory (the host cannot see the containers' pids).

The chain under test, as schedulers/docker.py documents it:

* ``xrun cancel``: marks the app cancelled, then ``docker stop --time STOP_TIMEOUT`` on every
  replica. tini -> agent -> SIGTERM to every worker's process group. The agent SIGKILLs the
  workers still alive after its shutdown timeout and exits 143; the engine SIGKILLs the whole
  container (exit code 137) if it still runs STOP_TIMEOUT seconds after the SIGTERM. So a
  worker's grace period is min(agent shutdown timeout, STOP_TIMEOUT). The app ends CANCELLED,
  every replica CANCELLED with the container's exit code.
* SIGTERM to one container from outside (``docker kill -s TERM``, a node drain): that replica's
  agent stops its workers and exits 143, the replica is FAILED with 143 and the app FAILED
  (gang semantics); the other replicas are stopped as by a cancel (their workers get SIGTERM
  too) and read CANCELLED.
"""

# ruff: noqa: F811  (the docker_engine fixture is imported, then named by the tests)
from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from docker_fixture import docker_engine  # noqa: F401

from xrun.components.dist import ddp
from xrun.schedulers.docker import STOP_TIMEOUT, DockerScheduler
from xrun.specs import AppState

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

XRUN = str(Path(sys.executable).with_name("xrun"))
WORKER = Path(__file__).resolve().parent / "scripts" / "sigterm_worker.py"
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


class Job:
    """A running ``dist.ddp`` of the worker whose every rank has installed its SIGTERM handler."""

    def __init__(
        self,
        sched: DockerScheduler,
        workspace: Path,
        marks: Path,
        j: str,
        stubborn: str = "",
        env: dict[str, str] | None = None,
    ) -> None:
        self.sched, self.marks = sched, marks
        marks.mkdir()
        app = ddp(
            MARKS, "--stubborn", stubborn or "-", script=WORKER.name, j=j, name="sig/trainer",
            image="xrun-python:latest", env=env, mounts=[f"type=bind,src={marks},dst={MARKS}"],
        )  # fmt: skip
        nnodes, nproc = (int(x) for x in j.split("x"))
        self.ranks = [str(r) for r in range(nnodes * nproc)]
        self.app_id = sched.submit(app, {}, workspace=str(workspace))
        self.handle = f"docker://default/{self.app_id}"
        wait_for(lambda: all(self.mark(r, "ready") for r in self.ranks), 90, "every worker ready")

    def mark(self, rank: str, kind: str) -> float | None:
        """The number in ``<rank>.<kind>`` (a time or a pid), None while there is none."""
        path = self.marks / f"{rank}.{kind}"
        return float(path.read_text()) if path.exists() else None

    def ended_after_sigterm(self, rank: str) -> float:
        """How long ``rank`` went on beating after its SIGTERM (call it once the app ended)."""
        term, last = self.mark(rank, "term"), self.mark(rank, "alive")
        assert term is not None, f"rank {rank} never got SIGTERM: {sorted(self.marks.iterdir())}"
        assert last is not None
        return last - term

    def replicas(self) -> list[tuple[int, AppState, int | None]]:
        resp = self.sched.describe(self.app_id)
        assert resp is not None
        return [(r.id, r.state, r.exit_code) for r in resp.roles_statuses[0].replicas]

    def log(self, k: int) -> str:
        return "".join(self.sched.log_iter(self.app_id, "trainer", k))

    def leftovers(self) -> list[str]:
        import docker

        client = docker.from_env()
        try:
            label = {"label": f"xrun.app_id={self.app_id}"}
            return [c.name for c in client.containers.list(all=True, filters=label)]
        finally:
            client.close()


def wait_for(cond: Callable[[], object], timeout: float, what: str) -> float:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)
    return time.monotonic()


def xrun(*args: str) -> subprocess.CompletedProcess[str]:
    """The real console script, as another shell would run it (same XDG_STATE_HOME)."""
    return subprocess.run([XRUN, *args], capture_output=True, text=True, timeout=60)


@pytest.fixture
def job_factory(
    sched: DockerScheduler, workspace: Path, tmp_path: Path
) -> Iterator[Callable[..., Job]]:
    """Submits jobs; whatever a failing test leaves running is cancelled after it."""
    jobs: list[Job] = []

    def make(j: str, **kw: object) -> Job:
        jobs.append(Job(sched, workspace, tmp_path / f"marks{len(jobs)}", j, **kw))  # type: ignore[arg-type]
        return jobs[-1]

    yield make
    for job in jobs:
        sched.cancel(job.app_id)


def test_cancel_sigterms_every_worker_and_ends_cancelled(job_factory: Callable[..., Job]) -> None:
    job = job_factory("2x1")
    t0 = time.time()
    cancel = xrun("cancel", job.handle)
    elapsed = time.time() - t0
    assert cancel.returncode == 0, cancel.stderr
    for rank in job.ranks:
        term = job.mark(rank, "term")
        assert term is not None and term >= t0 - 0.5, f"rank {rank} got no SIGTERM from cancel"
    # Obedient workers: the stop ends as soon as they exit, long before the engine's SIGKILL.
    assert elapsed < STOP_TIMEOUT - 2, f"cancel took {elapsed:.1f} s"
    # Each agent forwarded SIGTERM and exited 128 + 15; the replicas read CANCELLED, not FAILED.
    assert job.replicas() == [(0, AppState.CANCELLED, 143), (1, AppState.CANCELLED, 143)]
    for k in (0, 1):
        assert "got SIGTERM: forwarding it to the workers" in job.log(k)
    status = xrun("status", job.handle).stdout
    assert "State: CANCELLED" in status, status
    assert job.leftovers() == []
    print(f"docker cancel of 2x1, obedient workers: {elapsed:.2f} s")


@pytest.mark.parametrize(
    ("agent_timeout", "grace", "exit_code"),
    [
        # The agent's shutdown timeout is the shorter: the agent SIGKILLs the stubborn worker,
        # then exits 143 by itself.
        (2.0, 2.0, 143),
        # dist.ddp's default (the agent's 30 s) outlasts the stop: the engine SIGKILLs the whole
        # container STOP_TIMEOUT s after the SIGTERM, agent included (137 = 128 + SIGKILL).
        (None, float(STOP_TIMEOUT), 137),
    ],
    ids=["agent-shutdown-timeout", "engine-stop-timeout"],
)
def test_a_worker_that_ignores_sigterm_is_sigkilled_after_the_grace_period(
    job_factory: Callable[..., Job], agent_timeout: float | None, grace: float, exit_code: int
) -> None:
    env = {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(agent_timeout)} if agent_timeout else None
    job = job_factory("1x2", stubborn="1", env=env)
    t0 = time.monotonic()
    job.sched.cancel(job.app_id)
    elapsed = time.monotonic() - t0
    # Rank 0 obeyed at once; rank 1 lived on through the grace period, and not much longer.
    assert job.ended_after_sigterm("0") < 1.0
    lived = job.ended_after_sigterm("1")
    assert grace - 0.3 <= lived < grace + 2.0, f"rank 1 lived {lived:.2f} s after SIGTERM"
    # cancel returns once the container has stopped: every process in it is gone by then.
    assert elapsed < grace + 4.0, f"cancel took {elapsed:.1f} s"
    beat = job.mark("1", "alive")
    time.sleep(0.3)
    assert job.mark("1", "alive") == beat, "the stubborn worker still beats after the cancel"
    assert job.replicas() == [(0, AppState.CANCELLED, exit_code)]
    assert job.leftovers() == []
    print(f"stubborn worker, grace {grace:g} s: lived {lived:.2f} s after SIGTERM, "
          f"cancel took {elapsed:.2f} s, replica exit code {exit_code}")


def test_sigterm_to_one_container_fails_the_app_and_stops_the_rest(
    job_factory: Callable[..., Job],
) -> None:
    import docker

    job = job_factory("2x1")
    client = docker.from_env()
    try:
        # As a node drain would: SIGTERM to the container's PID 1 (tini), nothing else.
        client.containers.get(f"{job.app_id}-trainer-1").kill(signal="SIGTERM")
    finally:
        client.close()
    t0 = time.monotonic()
    resp = job.sched.wait(job.app_id, timeout=60)
    elapsed = time.monotonic() - t0
    assert resp is not None and resp.state == AppState.FAILED, resp
    assert "replica trainer/1 exited with code 143" in resp.msg, resp.msg
    # The drained replica failed with its agent's 128 + SIGTERM; the gang stopped the other.
    assert job.replicas() == [(0, AppState.CANCELLED, 143), (1, AppState.FAILED, 143)]
    for rank in job.ranks:
        assert job.mark(rank, "term") is not None, f"rank {rank} got no SIGTERM"
    assert job.mark("1", "term") <= job.mark("0", "term")  # type: ignore[operator]
    assert elapsed < STOP_TIMEOUT - 2, f"the app took {elapsed:.1f} s to end"
    status = xrun("status", job.handle).stdout
    assert "State: FAILED" in status and "exit_code=143" in status, status
    assert job.leftovers() == []
    print(f"SIGTERM to one of 2 containers: FAILED after {elapsed:.2f} s")
