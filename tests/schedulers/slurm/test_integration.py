"""The slurm scheduler against a real Slurm 22.05 cluster (four nodes on this host).

Every job runs for real: sbatch, srun, xrun's runtime agent, torch's gloo backend. The first
test pays for the cluster start (tests/helpers/slurm.py). Jobs run in the test's tmp dir (the
``workspace`` of ``submit``), so their ``slurm-logs`` stay there.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import slurm as slurm_fixture
from tests.helpers.net import free_port
from tests.helpers.slurm import SlurmCluster
from xrun.components.dist import ddp
from xrun.errors import AppNotFoundError, UsageError
from xrun.schedulers.api import DescribeAppResponse, Stream
from xrun.schedulers.slurm import SlurmScheduler, create_scheduler
from xrun.specs import AppDef, AppState, Resource, Role

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(180)]

# The session fixture, also when tests/conftest.py does not import it.
slurm_cluster = slurm_fixture.slurm_cluster

XRUN = str(Path(sys.executable).parent / "xrun")

ALLREDUCE = """\
import os
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print(f"rank {dist.get_rank()}/{dist.get_world_size()} sum={t.item():.0f} "
      f"node={os.environ['SLURMD_NODENAME']}", flush=True)
dist.barrier()
os._exit(0)  # skip torch 2.13's gloo teardown, which can deadlock (see examples/train_ddp.py)
"""


@pytest.fixture
def sched(slurm_cluster: SlurmCluster) -> Iterator[SlurmScheduler]:
    """A scheduler whose jobs are cancelled at the end of the test if still alive."""
    s = create_scheduler("test")
    submitted: list[str] = []
    real_schedule = s.schedule

    def schedule(info):  # type: ignore[no-untyped-def]
        app_id = real_schedule(info)
        submitted.append(app_id)
        return app_id

    s.schedule = schedule  # type: ignore[method-assign]
    yield s
    for app_id in submitted:
        resp = s.describe(app_id)
        if resp is not None and resp.state in (AppState.PENDING, AppState.RUNNING):
            subprocess.run(["scancel", app_id], check=False)


def wait(sched: SlurmScheduler, app_id: str, timeout: float = 90) -> DescribeAppResponse:
    resp = sched.wait(app_id, timeout=timeout)
    assert resp is not None, f"job {app_id} vanished"
    return resp


def shell_role(name: str, script: str, replicas: int = 1, **kw: object) -> Role:
    return Role(
        name=name,
        image="",
        entrypoint="bash",
        args=["-c", script],
        num_replicas=replicas,
        resource=Resource(cpu=1, gpu=0, memMB=100),
        **kw,  # type: ignore[arg-type]
    )


def read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


# --------------------------------------------------------------------------- ddp
def test_ddp_2x2_allreduce_through_the_cli(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    (tmp_path / "allreduce.py").write_text(ALLREDUCE)
    t0 = time.monotonic()
    run = subprocess.run(
        [
            XRUN,
            "run",
            "-s",
            "slurm",
            "dist.ddp",
            "-j",
            "2x2",
            "--cpu",
            "1",
            "--memMB",
            "512",
            "--rdzv_port",
            str(free_port()),
            "--script",
            "allreduce.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    handle = run.stdout.strip().splitlines()[-1]
    assert handle.startswith("slurm://"), run.stdout
    app_id = handle.rsplit("/", 1)[1]
    resp = wait(create_scheduler("other"), app_id)
    elapsed = time.monotonic() - t0
    logs = tmp_path / "slurm-logs" / app_id / "allreduce"
    assert resp.state == AppState.SUCCEEDED, (
        resp.msg,
        read(logs / "0.stderr"),
        read(logs / "1.stderr"),
    )

    # Status and logs from other processes: the real console script.
    status = subprocess.run([XRUN, "status", handle], capture_output=True, text=True, timeout=30)
    assert status.returncode == 0, status.stderr
    assert "SUCCEEDED" in status.stdout
    # Two different nodes (Slurm picks which: on a cluster other tests share, not always c1/c2).
    hosts = re.findall(r"allreduce/[01]: SUCCEEDED host=(c[1-4]) exit_code=0", status.stdout)
    assert len(hosts) == 2 and hosts[0] != hosts[1], status.stdout
    out = ""
    for k in (0, 1):
        log = subprocess.run(
            [XRUN, "log", f"{handle}/allreduce/{k}"], capture_output=True, text=True, timeout=30
        )
        assert log.returncode == 0, log.stderr
        out += log.stdout
    # Four workers on two "nodes", each saw the sum 1+2+3+4.
    for rank in range(4):
        assert f"rank {rank}/4 sum=10" in out, out
    assert f"node={hosts[0]}" in out and f"node={hosts[1]}" in out
    # Another user's shell (no xrun state): the log dir comes from the job's StdOut path.
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "elsewhere")}
    status2 = subprocess.run(
        [XRUN, "status", handle], capture_output=True, text=True, timeout=30, env=env
    )
    assert f"allreduce/1: SUCCEEDED host={hosts[1]} exit_code=0" in status2.stdout, status2
    print(f"ddp 2x2 submit->SUCCEEDED: {elapsed:.1f}s")


# --------------------------------------------------------------------------- het job
def test_two_role_het_job_gets_ids_env_and_rank0_host(
    sched: SlurmScheduler, tmp_path: Path
) -> None:
    echo = 'echo "role=$XRUN_ROLE id=${replica_id} app=${app_id} r0=$${${rank0_env}} v=$V"; echo "$XRUN_RDZV_TOKEN" >&2'
    app = AppDef(
        name="het",
        roles=[
            shell_role("ps", echo, replicas=1, env={"V": "ps-${replica_id}"}),
            shell_role("worker", echo, replicas=2, env={"V": "w-${replica_id} 'q'"}),
        ],
    )
    app_id = sched.submit(app, {}, workspace=str(tmp_path))
    resp = wait(sched, app_id)
    assert resp.state == AppState.SUCCEEDED, resp.msg
    logs = tmp_path / "slurm-logs" / app_id
    # The rank-0 host (as in TorchX: the first node of het group 0) is where the first role's
    # replica 0 ran, for every role. Slurm picks the nodes: on a cluster other tests share,
    # not always c1.
    r0 = {rs.role: rs.replicas[0].hostname for rs in resp.roles_statuses}["ps"]
    assert r0 in {"c1", "c2", "c3", "c4"}, resp
    assert read(logs / "ps" / "0.stdout") == f"role=ps id=0 app={app_id} r0={r0} v=ps-0\n"
    for k in (0, 1):
        assert read(logs / "worker" / f"{k}.stdout") == (
            f"role=worker id={k} app={app_id} r0={r0} v=w-{k} 'q'\n"
        )
    # Every task of the job shares one per-job rendezvous secret, made at run time.
    tokens = {
        read(logs / role / f"{k}.stderr") for role, k in (("ps", 0), ("worker", 0), ("worker", 1))
    }
    assert len(tokens) == 1 and re.fullmatch(r"[0-9a-f]{32}\n", tokens.pop())
    assert [r.args for r in resp.roles] == [r.args for r in app.roles]  # the submitted spec
    roles = {r.role: r.replicas for r in resp.roles_statuses}
    assert [r.hostname for r in roles["ps"]] == [r0]
    workers = {r.hostname for r in roles["worker"]}  # one node per replica, Slurm's pick
    assert len(workers) == 2 and workers <= {"c1", "c2", "c3", "c4"}, resp


# --------------------------------------------------------------------------- failures
def test_failing_job_is_failed_with_its_exit_code(sched: SlurmScheduler, tmp_path: Path) -> None:
    app = AppDef(
        name="fails",
        roles=[shell_role("w", 'echo "oops ${replica_id}" >&2; exit $((3 + ${replica_id}))', 2)],
    )
    app_id = sched.submit(app, {}, workspace=str(tmp_path))
    resp = wait(sched, app_id)
    assert resp.state == AppState.FAILED
    assert "FAILED" in resp.msg and "exit_code=" in resp.msg, resp.msg
    codes = {r.id: r.exit_code for r in resp.roles_statuses[0].replicas}
    # --kill-on-bad-exit may stop the second replica before it writes its code.
    assert codes[0] == 3 or codes[1] == 4, codes
    assert all(r.state == AppState.FAILED for r in resp.roles_statuses[0].replicas)
    # The replica whose code was recorded ran to its end (the other may have been stopped
    # before its first line): its stderr is there, whole.
    k = 0 if codes[0] == 3 else 1
    stderr = "".join(sched.log_iter(app_id, "w", k, streams=Stream.STDERR))
    assert stderr == f"oops {k}\n"
    # The fallbacks give the same answer: text squeue + scontrol, and the jobcomp file
    # (what is left once the job has aged out of slurmctld).
    text_only = create_scheduler("text")
    text_only._json_ok = False
    again = text_only.describe(app_id)
    assert again is not None and again.state == AppState.FAILED and "exit_code=" in again.msg
    (rec,) = text_only._sacct(app_id)
    assert rec.state == "FAILED"


def test_rejected_submission_shows_slurms_words(sched: SlurmScheduler, tmp_path: Path) -> None:
    app = AppDef(name="bad", roles=[shell_role("w", "true")])
    with pytest.raises(UsageError, match=r"sbatch --parsable.*invalid partition"):
        sched.submit(app, {"partition": "nope"}, workspace=str(tmp_path))
    cli = subprocess.run(
        [XRUN, "run", "-s", "slurm", "-cfg", "time=bogus", "utils.echo"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 2, (cli.stdout, cli.stderr)
    assert "Invalid --time specification" in cli.stderr and "Traceback" not in cli.stderr


# --------------------------------------------------------------------------- cancel, list
def test_cancel_ends_cancelled_and_list_shows_the_job(
    sched: SlurmScheduler, tmp_path: Path
) -> None:
    app = AppDef(name="sleeper", roles=[shell_role("w", "echo started; sleep 120", 2)])
    app_id = sched.submit(app, {}, workspace=str(tmp_path))
    deadline = time.monotonic() + 30
    while "started" not in "".join(sched.log_iter(app_id, "w", 1)):
        assert time.monotonic() < deadline, "job did not start"
        time.sleep(0.2)
    listed = {r.app_id: r for r in sched.list()}
    assert listed[app_id].state == AppState.RUNNING
    assert listed[app_id].name == "sleeper"
    assert listed[app_id].app_handle == f"slurm://test/{app_id}"
    handle = f"slurm://test/{app_id}"
    cli_list = subprocess.run([XRUN, "list", "-s", "slurm"], capture_output=True, text=True)
    assert f"slurm://default/{app_id}\tRUNNING\tsleeper" in cli_list.stdout, cli_list
    t0 = time.monotonic()
    cancel = subprocess.run([XRUN, "cancel", handle], capture_output=True, text=True, timeout=30)
    assert cancel.returncode == 0, cancel.stderr
    resp = wait(sched, app_id, timeout=30)
    print(f"cancel -> CANCELLED: {time.monotonic() - t0:.2f}s")
    assert resp.state == AppState.CANCELLED
    sched.cancel(app_id)  # idempotent
    with pytest.raises(AppNotFoundError):
        sched.cancel("999999")
    assert sched.describe("999999") is None


# --------------------------------------------------------------------------- logs
def test_follow_logs_while_running(sched: SlurmScheduler, tmp_path: Path) -> None:
    app = AppDef(
        name="ticker",
        roles=[shell_role("w", "for i in 1 2 3 4 5; do echo tick $i; sleep 0.3; done")],
    )
    app_id = sched.submit(app, {}, workspace=str(tmp_path))
    # A follower in another process (the real CLI) and one here, both while the job runs.
    cli = subprocess.Popen(
        [XRUN, "log", "-f", f"slurm://test/{app_id}/w/0"], stdout=subprocess.PIPE, text=True
    )
    lines = list(sched.log_iter(app_id, "w", 0, should_tail=True, regex="tick"))
    assert lines == [f"tick {i}\n" for i in range(1, 6)]
    out, _ = cli.communicate(timeout=30)
    assert cli.returncode == 0
    assert [ln for ln in out.splitlines() if "tick" in ln][-1].endswith("tick 5"), out
    resp = sched.describe(app_id)
    assert resp is not None and resp.state == AppState.SUCCEEDED
    with pytest.raises(UsageError, match="no role 'x'"):
        list(sched.log_iter(app_id, "x", 0))


# --------------------------------------------------------------------------- requeue
def _release_begin_time(app_id: str) -> None:
    """Slurm holds a requeued job ~120 s (BeginTime); real clusters wait, the test does not."""
    subprocess.run(["scontrol", "update", f"JobId={app_id}", "StartTime=now"], check=False)


def _wait_requeued(sched: SlurmScheduler, app_id: str, timeout: float = 60) -> DescribeAppResponse:
    """Wait for the end of a job that requeues once, cutting Slurm's hold short.

    Not at once: slurmd refuses to start a job id it killed a moment ago ("already killed,
    do not launch batch job"), which is what the hold protects against; 3 s is plenty here.
    """
    deadline = time.monotonic() + timeout
    held_since: float | None = None
    while True:
        resp = sched.describe(app_id)
        assert resp is not None
        if resp.num_restarts >= 1 and "reason=BeginTime" in resp.msg:
            held_since = held_since or time.monotonic()
            if time.monotonic() - held_since > 3:
                _release_begin_time(app_id)
        if resp.state in (AppState.SUCCEEDED, AppState.FAILED, AppState.CANCELLED):
            return resp
        assert time.monotonic() < deadline, f"job {app_id} stuck: {resp}"
        time.sleep(0.3)


def test_requeue_until_max_retries(sched: SlurmScheduler, tmp_path: Path) -> None:
    script = 'echo "attempt ${SLURM_RESTART_COUNT:-0}"; [ "${SLURM_RESTART_COUNT:-0}" -ge 1 ]'
    app = AppDef(name="retry", roles=[shell_role("w", script, 1, max_retries=1)])
    app_id = sched.submit(app, {}, workspace=str(tmp_path))
    resp = _wait_requeued(sched, app_id)
    assert resp.state == AppState.SUCCEEDED, resp.msg
    assert resp.num_restarts == 1
    lines = "".join(sched.log_iter(app_id, "w", 0)).splitlines()
    # a requeued attempt's stdout and stderr each start with a marker naming it (issue #33)
    marks = [ln for ln in lines if ln.startswith("==== xrun: attempt ")]
    assert [ln for ln in lines if ln not in marks] == ["attempt 0", "attempt 1"], lines
    assert marks and all("attempt 1 of job " in m and "(requeued)" in m for m in marks), marks
    assert lines.index("attempt 0") < lines.index(marks[0]) < lines.index("attempt 1"), lines


def test_preemption_signal_reaches_workers_and_requeues(
    sched: SlurmScheduler, tmp_path: Path
) -> None:
    # A worker that checkpoints on SIGUSR2 and finishes on the next attempt.
    (tmp_path / "work.py").write_text(
        "import os, signal, sys, time\n"
        "attempt = os.environ.get('SLURM_RESTART_COUNT', '0')\n"
        "def on_usr2(signum, frame):\n"
        "    print(f'worker got USR2 in attempt {attempt}', flush=True)\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGUSR2, on_usr2)\n"
        "print(f'worker started attempt {attempt}', flush=True)\n"
        "if attempt == '0':\n"
        "    time.sleep(60)\n"
    )
    app = ddp(script="work.py", j="1x1", cpu=1, memMB=256, max_retries=1)
    app_id = sched.submit(app, {}, workspace=str(tmp_path))
    role = app.roles[0].name
    deadline = time.monotonic() + 60
    while "worker started" not in "".join(sched.log_iter(app_id, role, 0)):
        assert time.monotonic() < deadline, "worker did not start"
        time.sleep(0.2)
    # What Slurm does before preemption/time limit with --signal=B:USR2@90.
    subprocess.run(["scancel", "--batch", "--signal=USR2", app_id], check=True)
    resp = _wait_requeued(sched, app_id)
    assert resp.state == AppState.SUCCEEDED, resp.msg
    assert resp.num_restarts == 1
    assert "preempted 1 time(s)" in resp.msg
    out = "".join(sched.log_iter(app_id, role, 0, streams=Stream.STDOUT))
    assert "worker got USR2 in attempt 0" in out, out
    assert "worker started attempt 1" in out, out


# --------------------------------------------------------------------------- job_dir
def test_job_dir_isolates_the_job_from_later_edits(sched: SlurmScheduler, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "main.sh").write_text("sleep 1; cat data.txt; ls\n")
    (ws / "data.txt").write_text("v1\n")
    (ws / "big.bin").write_text("x")
    (ws / ".xrunignore").write_text("*.bin\n")
    job_dir = tmp_path / "job"
    app = AppDef(name="iso", roles=[shell_role("w", "bash main.sh")])
    app_id = sched.submit(app, {"job_dir": str(job_dir)}, workspace=str(ws))
    (ws / "data.txt").write_text("v2\n")  # an edit after submission
    resp = wait(sched, app_id)
    assert resp.state == AppState.SUCCEEDED, resp.msg
    out = read(job_dir / "slurm-logs" / app_id / "w" / "0.stdout")
    assert out.startswith("v1\n"), out
    assert "big.bin" not in out and "main.sh" in out
    assert not (ws / "slurm-logs").exists()


# --------------------------------------------------------------------------- elastic
def test_elastic_job_gets_max_nodes_when_they_are_free(
    sched: SlurmScheduler, tmp_path: Path
) -> None:
    (tmp_path / "allreduce.py").write_text(ALLREDUCE)
    app = ddp(script="allreduce.py", j="1:2x1", cpu=1, memMB=256, rdzv_port=free_port())
    app_id = sched.submit(app, {}, workspace=str(tmp_path))
    resp = wait(sched, app_id)
    assert resp.state == AppState.SUCCEEDED, resp.msg
    out = "".join("".join(sched.log_iter(app_id, "allreduce", k)) for k in (0, 1))
    assert out.count("/2 sum=3") == 2, out  # two nodes joined: world size 2, 1+2
