"""A job that may lose replicas (elastic, or dist.ddp --spares) survives a lost node on Slurm:
the sbatch script's options and its own judgement of the end (schedulers/slurm/losses.py), run
by a real bash on replica files as the tasks leave them; the real cluster's drill is in
test_spares.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from xrun.components.dist import ddp
from xrun.schedulers.slurm import create_scheduler
from xrun.schedulers.slurm.losses import judge
from xrun.schedulers.slurm.request import ClusterInfo, build_request
from xrun.schedulers.slurm.scheduler import SlurmScheduler
from xrun.specs import AppDef, AppState


def script(app: AppDef) -> str:
    opts = create_scheduler("t").run_opts().resolve({}, "slurm")
    return build_request(app, opts, "/home/u/p", ClusterInfo(), "/opt/bin").script


def spares_app(j: str = "2x1", spares: int = 1) -> AppDef:
    return ddp(script="train.py", j=j, spares=spares, rdzv_port=29500)


def test_spares_job_gets_the_form_that_survives_a_lost_node() -> None:
    s = script(spares_app())
    assert "#SBATCH --no-kill\n" in s  # else a DOWN node ends the job NODE_FAIL
    assert "srun --no-kill --kill-on-bad-exit=0 --ntasks-per-node=1 " in s
    # the spare is one more node, not a maybe: --nodes=3, not 2-3
    assert "#SBATCH --nodes=3\n#SBATCH --ntasks-per-node=1\n" in s
    assert "XRUN_RC=0\n" in s
    # an elastic job with spares: the floor has the spare on top of MIN
    assert "#SBATCH --nodes=2-3\n" in script(spares_app("1:2x1"))


def test_fixed_size_job_without_spares_keeps_the_gang() -> None:
    s = script(ddp(script="train.py", j="2x1", rdzv_port=29500))
    assert "srun --kill-on-bad-exit=1 " in s
    assert "--no-kill" not in s and "XRUN_RC=0\n" not in s


def run_judge(
    tmp_path: Path, app: AppDef, replicas: dict[int, str | None], rc: int
) -> tuple[int, str]:
    """The judge on replica files: ``replicas[k]`` = its .exit text, None = started (.node) but
    no code (lost with its node); a replica not in it never started."""
    role = app.roles[0].name
    (tmp_path / role).mkdir(parents=True)
    for k, code in replicas.items():
        (tmp_path / role / f"{k}.node").write_text(f"c{k + 1}\n")
        if code is not None:
            (tmp_path / role / f"{k}.exit").write_text(code + "\n")
    sh = (
        f"set -u\nXRUN_LOG_DIR={tmp_path}\nXRUN_RC={rc}\nXRUN_PREEMPTED=0\n"
        f'XRUN_ENDED_BY_SLURM=0\n{judge(app)}exit "$XRUN_RC"\n'
    )
    proc = subprocess.run(["bash", "-c", sh], capture_output=True, text=True, timeout=60)
    return proc.returncode, proc.stderr


@pytest.mark.parametrize(
    "replicas,rc,expected",
    [
        ({0: "0", 1: "137", 2: "0"}, 137, 0),  # a replica killed, the spare took over
        ({0: "0", 1: None, 2: "0"}, 137, 0),  # its node went DOWN with it: no code at all
        ({0: "0", 1: "1", 2: "137"}, 137, 137),  # only one left that succeeded: below the floor
        ({0: "0", 1: None, 2: None}, 137, 137),
        ({0: "0", 1: "0"}, 1, 0),  # two of three started (no spare node free): floor 2 kept
    ],
)
def test_judge_counts_the_replicas_that_succeeded(
    tmp_path: Path, replicas: dict[int, str | None], rc: int, expected: int
) -> None:
    code, err = run_judge(tmp_path, spares_app(), replicas, rc)
    assert code == expected, err
    for k, c in replicas.items():
        if c is None:
            role = spares_app().roles[0].name
            assert (tmp_path / role / f"{k}.exit").read_text().strip() == "lost"
            assert f"{role}/{k} on c{k + 1} was lost" in err


def test_lost_replica_shows_failed_with_its_node(tmp_path: Path) -> None:
    base = tmp_path / "w" / "1"
    base.parent.mkdir()
    Path(f"{base}.node").write_text("c2\n")
    Path(f"{base}.exit").write_text("lost\n")
    r = SlurmScheduler._replica(1, "w", str(base), ["c1", "c2"], AppState.SUCCEEDED)
    assert r.state == AppState.FAILED and r.hostname == "c2", r
    assert "node c2 was lost" in r.structured_error_msg
