"""Slurm sweeps without a cluster: the job-array script (goldens, shellcheck, the trial table run
by a real bash), what one array cannot hold, and reading the array's squeue lines and files.

``squeue-array.txt`` was recorded from the real 22.05 cluster (a 6-task ``%2`` array, task 1
failing) with ``squeue -h -r -t all -j ID -o '%F|%K|%A|%T|%r|%N'``. ``XRUN_UPDATE_GOLDEN=1``
rewrites the goldens.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers import paths
from tests.schedulers.slurm.test_unit import CHDIR, PY_BIN, shellcheck  # noqa: F401
from xrun.errors import UsageError
from xrun.runner import Runner
from xrun.schedulers.slurm import create_scheduler
from xrun.schedulers.slurm.array import array_job, array_template
from xrun.schedulers.slurm.request import ClusterInfo, build_request, shell_word, task_env
from xrun.schedulers.slurm.status import SlurmJobRecord
from xrun.schedulers.slurm.sweep import _Replica, _replicas, parse_array_squeue, trial_status
from xrun.specs import AppDef, AppState, Resource, Role
from xrun.sweeps.plan import Sweep, SweepPlan, plan_from_app, plan_from_args

GOLDEN = paths.FIXTURES / "slurm" / "golden"


def ddp_plan(**extra: list[str]) -> SweepPlan:
    runner = Runner()
    args = ["--script", "train.py", "-j", "2x2", "--", "--lr", "{{lr}}", "--wd", "{{wd}}"]
    sweep = Sweep(params={"lr": ["0.1", "0.01", "0.001"], "wd": ["0", "1e-4"], **extra})
    sweep.max_parallel = 2
    return plan_from_args(lambda a: runner.component_app("dist.ddp", a), args, sweep)


def sh_plan() -> SweepPlan:
    """One node per trial, no throttle; a value that needs quoting reaches the env only."""
    runner = Runner()
    sweep = Sweep(params={"seed": ["1", "2"]}, trials=[{"msg": "it's $HOME"}, {"msg": "x"}])
    return plan_from_args(
        lambda a: runner.component_app("utils.sh", a), ["echo seed={{seed}}"], sweep
    )


def script(plan: SweepPlan, cfg: dict[str, object] | None = None) -> str:
    sched = create_scheduler("t")
    resolved = sched.run_opts().resolve(cfg or {}, "slurm")
    template = array_template(plan)
    req = build_request(
        template,
        resolved,
        CHDIR,
        ClusterInfo(),
        PY_BIN,
        array=array_job(plan, template, plan.max_parallel),
    )
    return req.materialize()


# --------------------------------------------------------------------------- the script
@pytest.mark.parametrize("name,make", [("sweep_ddp_2x2", ddp_plan), ("sweep_sh", sh_plan)])
def test_golden_array_script(name: str, make) -> None:  # type: ignore[no-untyped-def]
    text = script(make())
    path = GOLDEN / f"{name}.sbatch"
    if os.environ.get("XRUN_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text(), f"golden {path} changed; XRUN_UPDATE_GOLDEN=1 to accept"


def test_one_array_one_command_per_task() -> None:
    text = script(ddp_plan())
    assert "#SBATCH --array=0-5%2\n" in text and text.count("#SBATCH --array") == 1
    assert "#SBATCH --output=/home/u/proj/slurm-logs/slurm-%A_%a.out" in text
    assert 'XRUN_LOG_DIR=/home/u/proj/slurm-logs/"$SLURM_ARRAY_JOB_ID/$SLURM_ARRAY_TASK_ID"' in text
    assert "#SBATCH --nodes=2\n" in text and text.count("\nsrun ") == 1
    # the placeholders are the task's variables, expanded by the task (not the batch shell)
    assert '--lr \'"${XRUN_SWEEP_LR}"\' --wd \'"${XRUN_SWEEP_WD}"' in text
    assert "{{" not in text.split("# The trial table")[1]
    assert "5) XRUN_SWEEP_LR=0.001 XRUN_SWEEP_WD=1e-4 ;;" in text
    assert "XRUN_RDZV_PORT=$(python3 -c" in text  # concurrent 2-node trials may share nodes
    no_limit = script(sh_plan())
    assert "#SBATCH --array=0-3\n" in no_limit and "XRUN_RDZV_PORT" not in no_limit


@pytest.mark.parametrize("make", [ddp_plan, sh_plan], ids=["ddp", "sh"])
def test_array_scripts_pass_shellcheck(make, shellcheck: str) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    body = script(make()).split("\n", 1)[1]  # after the "# submit:" line
    proc = subprocess.run(
        [shellcheck, "-s", "bash", "-"], input=body, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout


def _table_env(plan: SweepPlan, index: int) -> dict[str, str]:
    """What a real bash exports after the trial table, as array task ``index``."""
    setup = array_job(plan, array_template(plan), None).setup
    out = subprocess.run(
        ["bash", "-c", f"{setup}\nenv -0"],
        env={"PATH": os.environ["PATH"], "SLURM_ARRAY_TASK_ID": str(index), "HOME": "/h"},
        capture_output=True,
        check=True,
    )
    pairs = (kv.split("=", 1) for kv in out.stdout.decode().split("\0") if "=" in kv)
    return {k: v for k, v in pairs if k.startswith("XRUN_")}


def test_the_trial_table_gives_each_task_its_values() -> None:
    plan = sh_plan()
    assert _table_env(plan, 0) == {
        "XRUN_SWEEP_MSG": "it's $HOME",
        "XRUN_SWEEP_SEED": "1",
        "XRUN_TRIAL_INDEX": "0",
        "XRUN_SWEEP_SIZE": "4",
    }
    assert _table_env(plan, 3)["XRUN_SWEEP_MSG"] == "x"
    bad = subprocess.run(
        ["bash", "-c", array_job(plan, array_template(plan), None).setup],
        env={"PATH": os.environ["PATH"], "SLURM_ARRAY_TASK_ID": "4"},
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "no trial 4" in bad.stderr


def test_shell_word_task_env_is_expanded_by_the_task() -> None:
    word = shell_word(f"--x={task_env('XRUN_SWEEP_X')} '{task_env('Y')}'", "/img")
    out = subprocess.run(
        ["bash", "-c", f"printf '%s\\0' {word}"],
        env={"XRUN_SWEEP_X": "a b", "Y": "$HOME"},
        capture_output=True,
        check=True,
    )
    assert out.stdout.decode().split("\0")[:-1] == ["--x=a b '$HOME'"]


# --------------------------------------------------------------------------- refused
def _app(role: Role) -> AppDef:
    return AppDef("a", [role])


def test_what_one_array_cannot_hold() -> None:
    two = AppDef("a", [Role("x", "", "echo", ["{{v}}"]), Role("y", "", "echo")])
    with pytest.raises(UsageError, match="2-role app .* heterogeneous job cannot be an array"):
        array_template(plan_from_app(two, Sweep({"v": ["1"]})))
    mem = _app(Role("x", "", "echo", metadata={"m": "{{v}}"}, resource=Resource(1, 0, 10)))
    with pytest.raises(UsageError, match=r"\{\{v\}\} is in role 'x''s metadata"):
        array_template(plan_from_app(mem, Sweep({"v": ["1"]})))
    runner = Runner()
    per_trial = plan_from_args(
        lambda a: runner.component_app("dist.ddp", a),
        ["--script", "t.py", "-j", "{{n}}x2"],
        Sweep({"n": ["1", "2"]}),
    )
    with pytest.raises(UsageError, match="one command for every trial.*reads a value itself"):
        array_template(per_trial)


# --------------------------------------------------------------------------- status
def test_parse_recorded_array_squeue() -> None:
    text = (paths.FIXTURES / "slurm" / "22.05" / "squeue-array.txt").read_text()
    arrays = parse_array_squeue(text + "77|N/A|77|RUNNING|None|c2\n")  # + a plain job
    assert list(arrays) == ["359"]
    recs = arrays["359"]
    assert sorted(recs) == [0, 1, 2, 3, 4, 5]
    assert recs[1].state == "FAILED" and recs[1].reason == "NonZeroExitCode"
    assert recs[4].state == "PENDING" and recs[4].job_id == "359" and recs[4].app_id == "359_4"
    assert recs[2].nodelist == "c1" and recs[0].job_id == "360"


def _rec(state: str, reason: str = "None") -> SlurmJobRecord:
    return SlurmJobRecord(job_id="9", app_id="5_1", state=state, reason=reason, nodelist="c[2-3]")


def test_trial_status_from_squeue_and_files() -> None:
    done = [_Replica("c2", 10.0, 0, 12.5), _Replica("c3", 10.5, 3, 12.0)]
    t = trial_status(1, {"x": "1"}, _rec("FAILED", "NonZeroExitCode"), done, False, False)
    assert (t.state, t.exit_code, t.host, t.started, t.ended) == (
        AppState.FAILED,
        3,
        "c2",
        10.0,
        12.5,
    )
    assert "reason=NonZeroExitCode" in t.msg and t.app_id == "5_1"
    # squeue has forgotten it: the exit files decide
    ok = trial_status(1, {}, None, [_Replica("c2", 1.0, 0, 2.0)], False, False)
    assert ok.state == AppState.SUCCEEDED and ok.exit_code == 0
    assert trial_status(1, {}, None, [], True, False).state == AppState.CANCELLED
    assert trial_status(1, {}, None, [], False, False).state == AppState.UNKNOWN
    # running: no end yet, host from the node file (else squeue's nodelist)
    run = trial_status(1, {}, _rec("RUNNING"), [_Replica("", 5.0)], False, False)
    assert run.state == AppState.RUNNING and run.ended is None and run.host == "c2"
    # a requeued task shows its old end state for a moment: the marker says PENDING
    assert trial_status(1, {}, _rec("FAILED"), done, False, True).state == AppState.PENDING


def test_replica_files(tmp_path: Path) -> None:
    d = tmp_path / "train"
    d.mkdir()
    (d / "0.node").write_text("c4\n")
    (d / "0.exit").write_text("0\n")
    (d / "1.node").write_text("c1\n")
    reps = _replicas(str(tmp_path), {"train": 2})
    assert [r.node for r in reps] == ["c4", "c1"] and [r.code for r in reps] == [0, None]
    assert reps[0].started is not None and reps[0].ended is not None and reps[1].ended is None
