"""Signals on the slurm scheduler (issue #7 item 3), against the real Slurm 22.05 cluster.

Every job is ``dist.ddp`` of tests/scripts/sigterm_worker.py: one xrun runtime agent per
replica (a Slurm task, inside the batch script's ``xrun_replica`` wrapper), the workers writing
marker files into the test's tmp dir (the cluster's nodes are this host). The behaviour
asserted is the one schedulers/slurm/scheduler.py's docstring documents:

* ``xrun cancel`` (``scancel``) -> every worker gets SIGTERM (from slurmstepd, which signals
  every process of the step, and from its agent), the app and every replica end CANCELLED
  (exit code 143 = 128 + SIGTERM from the agent, or 1 from an agent that saw its peer close
  the rendezvous first), and ``xrun run --wait`` exits 1;
* a worker that ignores SIGTERM lives through the grace period, min(agent shutdown timeout,
  the cluster's KillWait), then dies of SIGKILL: the agent's (the replica exits 143 by itself)
  or slurmstepd's (the whole replica is killed, so it has no exit code).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import slurm as slurm_fixture
from tests.helpers.cli import xrun
from tests.helpers.net import free_port
from tests.helpers.sigterm_job import ROLE, WORKER, SigtermJob, SigtermJobs
from tests.helpers.slurm import SlurmCluster
from xrun.components.dist import ddp
from xrun.schedulers.slurm import SlurmScheduler, create_scheduler
from xrun.specs import AppState

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(120)]

# The session fixture, also when tests/conftest.py does not import it.
slurm_cluster = slurm_fixture.slurm_cluster


def kill_wait_s() -> float:
    """slurmd's KillWait: how long after its SIGTERM it SIGKILLs what is left of a job."""
    out = subprocess.run(
        ["scontrol", "show", "config"], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    m = re.search(r"^KillWait\s*=\s*(\d+)", out, re.MULTILINE)
    assert m, f"no KillWait in `scontrol show config`:\n{out}"
    return float(m.group(1))


def gone(pid: int) -> bool:
    """Not running: absent, or a zombie nobody has reaped yet (it runs no code)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


class Job(SigtermJob):
    """A slurm job of the worker."""

    def __init__(self, sched: SlurmScheduler, marks: Path, app_id: str, j: str) -> None:
        super().__init__(sched, "slurm", marks, app_id, j)


class Jobs(SigtermJobs[Job]):
    scheme = "slurm"

    def __init__(self, tmp: Path) -> None:
        workspace = tmp / "ws"
        workspace.mkdir()
        shutil.copy(WORKER, workspace / WORKER.name)
        super().__init__(create_scheduler("default"), workspace, tmp)

    def make_job(self, marks: Path, app_id: str, j: str) -> Job:
        return Job(self.sched, marks, app_id, j)

    def cancel(self, job: Job) -> None:
        subprocess.run(["scancel", job.app_id], capture_output=True, check=False)

    def submit(self, j: str, stubborn: str = "", env: dict[str, str] | None = None) -> Job:
        """Through the scheduler API; returns once every worker is ready."""
        marks = self.new_marks()
        app = ddp(
            str(marks),
            "--stubborn",
            stubborn or "-",
            script=WORKER.name,
            j=j,
            name=f"sig/{ROLE}",
            cpu=1,
            memMB=256,
            rdzv_port=free_port(),
            env=env,
        )
        return self.adopt(marks, self.sched.submit(app, {}, str(self.workspace)), j)

    def run_cli(self, j: str) -> tuple[subprocess.Popen[str], Job]:
        """``xrun run -s slurm --wait`` from the workspace; returns once every worker is ready."""
        marks = self.new_marks()
        return self.start_cli(
            marks,
            j,
            [
                "-j",
                j,
                "--name",
                f"sig/{ROLE}",
                "--cpu",
                "1",
                "--memMB",
                "256",
                "--rdzv_port",
                str(free_port()),
                "--script",
                WORKER.name,
                "--",
                str(marks),
                "--stubborn",
                "-",
            ],
        )


def check_codes(job: Job, codes: list[int | None]) -> None:
    """The replicas' exit codes after a SIGTERM to every task, and why each is what it is.

    143 (128 + SIGTERM): the agent got the SIGTERM and forwarded it. 1: a dist.ddp agent that
    first saw its peer close the rendezvous (it SIGTERMs its workers all the same, and
    slurmstepd signals them directly too). None: srun's --kill-on-bad-exit SIGKILLed the replica
    after its peer's non-zero exit, wrapper included, before the wrapper wrote the code.
    The first agent to end got the SIGTERM itself: one 143 at least.
    """
    assert set(codes) <= {143, 1, None} and 143 in codes, codes
    for k, code in enumerate(codes):
        if code is not None:
            why = "got SIGTERM: forwarding it to the workers" if code == 143 else "closed by a peer"
            assert why in job.log(k), (k, code, job.log(k))


@pytest.fixture
def jobs(slurm_cluster: SlurmCluster, tmp_path: Path) -> Iterator[Jobs]:
    started = Jobs(tmp_path)
    yield started
    started.cleanup()


def test_cancel_sigterms_every_worker_and_ends_cancelled(jobs: Jobs) -> None:
    run, job = jobs.run_cli("2x1")
    t0 = time.time()
    cancel = xrun("cancel", job.handle)
    assert cancel.returncode == 0, cancel.stderr
    # `xrun run --wait` saw the end: exit 1 (0 only for SUCCEEDED).
    _, err = run.communicate(timeout=60)
    assert run.returncode == 1 and f"{job.handle} ended CANCELLED" in err, err
    for rank in job.ranks:
        assert job.term(rank) >= t0 - 0.5
    # CANCELLED means every process of the job has ended; obedient workers right after their
    # SIGTERM, long before slurmd's SIGKILL.
    for rank in job.ranks:
        assert gone(int(job.mark(rank, "ready") or 0)), f"rank {rank} outlived the job"
        lived = job.lived_after_sigterm(rank)
        assert lived < 1.0, f"rank {rank} beat {lived:.2f} s after SIGTERM"
    # The replicas read CANCELLED, not FAILED, whatever their agents' exit codes.
    reps = job.replicas()
    assert [(k, state) for k, state, _ in reps] == [
        (0, AppState.CANCELLED),
        (1, AppState.CANCELLED),
    ], reps
    codes = [code for _, _, code in reps]
    check_codes(job, codes)
    status = xrun("status", job.handle).stdout
    assert "State: CANCELLED" in status, status
    for k, code in enumerate(codes):
        line = rf"{ROLE}/{k}: CANCELLED host=c\d" + ("" if code is None else f" exit_code={code}")
        assert re.search(line + "$", status, re.MULTILINE), status
    print(f"slurm cancel of 2x1, obedient workers: replica exit codes {codes}")


@pytest.mark.parametrize(
    ("agent_timeout", "by_slurm"),
    [
        # The agent's shutdown timeout is the shorter: the agent SIGKILLs the stubborn worker,
        # then exits 143 by itself.
        (2.0, False),
        # dist.ddp's default (the agent's 30 s) outlasts KillWait (5 s on the test cluster):
        # slurmstepd SIGKILLs every process of the step, the replica's wrapper included, so
        # the replica has no exit code.
        (None, True),
    ],
    ids=["agent-shutdown-timeout", "slurm-killwait"],
)
def test_a_worker_that_ignores_sigterm_is_sigkilled_after_the_grace_period(
    jobs: Jobs, agent_timeout: float | None, by_slurm: bool
) -> None:
    kill_wait = kill_wait_s()
    grace = kill_wait if by_slurm else float(agent_timeout or 0)
    assert grace < 20, f"KillWait={kill_wait:g} s is too long for this test (the cluster sets 5)"
    assert by_slurm or grace < kill_wait - 1, "the agent's timeout must be the shorter here"
    env = {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(agent_timeout)} if agent_timeout else None
    job = jobs.submit("1x2", stubborn="1", env=env)
    pids = [int(job.mark(rank, "ready") or 0) for rank in job.ranks]
    t0 = time.monotonic()
    job.sched.cancel(job.app_id)
    # Slurm says COMPLETING (xrun: RUNNING) while slurmd stops the processes, and CANCELLED
    # once they have all ended: the stubborn worker is gone by then.
    resp = job.sched.wait(job.app_id, timeout=grace + 15)
    elapsed = time.monotonic() - t0
    assert resp is not None and resp.state == AppState.CANCELLED, resp
    assert [p for p in pids if not gone(p)] == [], "workers outlived the CANCELLED state"
    # Well before the agent's own 30 s: the grace acted. Slurm's COMPLETING -> CANCELLED adds
    # up to ~6 s at load 12 (seen: 10.5 s for a 5 s KillWait), so the margin is 12 s.
    assert elapsed < grace + 12.0, f"CANCELLED {elapsed:.1f} s after the cancel"
    # Rank 0 obeyed at once; rank 1 lived on through the grace period, and not much longer.
    assert job.lived_after_sigterm("0") < 1.0
    lived = job.lived_after_sigterm("1")
    assert grace - 1.0 <= lived < grace + 2.0, f"rank 1 lived {lived:.2f} s after SIGTERM"
    if by_slurm:
        # slurmstepd's SIGKILL took the replica's wrapper down too: no exit code was written.
        assert job.replicas() == [(0, AppState.CANCELLED, None)]
        code: int | None = None
    else:
        assert job.replicas() == [(0, AppState.CANCELLED, 143)]
        code = 143
    assert "got SIGTERM: forwarding it to the workers" in job.log(0)
    print(
        f"slurm stubborn worker, grace {grace:g} s ({'KillWait' if by_slurm else 'agent'}): "
        f"lived {lived:.2f} s after SIGTERM, CANCELLED {elapsed:.2f} s after the cancel, "
        f"replica exit code {code}"
    )


def test_sigterm_to_the_steps_without_a_cancel_fails_the_app(jobs: Jobs) -> None:
    """``scancel --signal=TERM`` (what a site's drain script or a user's signal does): Slurm
    signals the tasks and leaves the job alone, so the agents' 143 is a failure, not a cancel."""
    job = jobs.submit("2x1")
    t0 = time.time()
    subprocess.run(["scancel", "--signal=TERM", job.app_id], check=True, timeout=30)
    resp = job.sched.wait(job.app_id, timeout=30)
    elapsed = time.time() - t0
    assert resp is not None and resp.state == AppState.FAILED, resp
    for rank in job.ranks:
        assert job.term(rank) >= t0 - 0.5
        assert job.lived_after_sigterm(rank) < 1.0
    reps = job.replicas()
    assert [(k, state) for k, state, _ in reps] == [(0, AppState.FAILED), (1, AppState.FAILED)]
    codes = [code for _, _, code in reps]
    check_codes(job, codes)
    # The batch script exits with srun's code, the highest of its tasks': 143 when both agents
    # got the SIGTERM themselves (the other cases: see check_codes).
    assert f"exit_code={143 if codes == [143, 143] else ''}" in resp.msg, (resp.msg, codes)
    status = xrun("status", job.handle).stdout
    assert "State: FAILED" in status and "exit_code=143" in status, status
    print(f"scancel --signal=TERM of 2x1: FAILED after {elapsed:.2f} s, replica exit codes {codes}")
