"""Slurm's commands when the controller is stuck (schedulers/slurm/commands.py): one line naming
the command and what it said, never a traceback, within the timeout.

Slurm's clients wait for the controller as long as it takes: sbatch sleeps and retries while
the job table is full (MaxJobCount; found when the suite's benchmark smoke run had filled the
test cluster's table, and `xrun run -s slurm` printed a TimeoutExpired traceback after 60 s).
The real cluster cannot be made to hang on demand without starving the other tests, so
stand-ins on PATH say what the real commands say there and then never end; each is ONE process
(exec), as the real client is, so the kill on timeout reaches it.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from xrun.components.dist import ddp
from xrun.errors import SchedulerError
from xrun.schedulers.api import get_scheduler
from xrun.specs import AppDef


def ddp_app() -> AppDef:
    return ddp(script="train.py", j="2x2", rdzv_port=29500)


FULL_TABLE = "sbatch: error: Slurm temporarily unable to accept job, sleeping and retrying"


def _stuck_slurm(bin_dir: Path, **said: str) -> None:
    """``sbatch --version`` answers; every command named in ``said`` prints its text to stderr
    and then hangs."""
    for cmd, text in said.items():
        version = 'if [ "$1" = --version ]; then echo "slurm 22.05.8"; exit 0; fi\n'
        body = (version if cmd == "sbatch" else "") + f"echo '{text}' >&2\nexec sleep 120\n"
        (bin_dir / cmd).write_text("#!/bin/sh\n" + body)
        (bin_dir / cmd).chmod(0o755)


@pytest.fixture
def stuck(tmp_path: Path, monkeypatch):  # type: ignore[no-untyped-def]
    from xrun.schedulers.slurm import commands

    monkeypatch.setattr(commands, "TIMEOUT_S", 0.5)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    monkeypatch.chdir(tmp_path)  # a submission makes ./slurm-logs before it calls sbatch
    (tmp_path / "train.py").write_text("")  # the dry run checks the job will find it
    (tmp_path / "bin").mkdir()
    return tmp_path / "bin"


def test_a_full_job_table_is_one_line_saying_nothing_was_submitted(stuck: Path) -> None:
    _stuck_slurm(stuck, sbatch=FULL_TABLE)
    sched = get_scheduler("slurm", "t")
    info = sched.submit_dryrun(ddp_app(), {})
    t0 = time.monotonic()
    with pytest.raises(SchedulerError) as e:
        sched.schedule(info)
    assert time.monotonic() - t0 < 10
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(
        "`sbatch --parsable '--comment=xrun:train;train=2'` did not finish in 0.5 s"
    )
    assert f"(it said: {FULL_TABLE})" in msg
    assert "not accepting jobs" in msg and "MaxJobCount" in msg and "nothing was submitted" in msg


def test_xrun_run_against_a_full_job_table_exits_1_with_one_line(stuck: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    from xrun.cli import main

    _stuck_slurm(stuck, sbatch=FULL_TABLE)
    rc = main(["run", "-s", "slurm", "utils.echo", "--msg", "hi"])
    err = capsys.readouterr().err
    assert rc == 1, err
    assert "Traceback" not in err and err.count("\n") == 1
    assert err.startswith("xrun: error: `sbatch --parsable") and "nothing was submitted" in err


def test_status_of_a_controller_that_does_not_answer_says_so(stuck: Path) -> None:
    said = "squeue: error: slurm_load_jobs error: Socket timed out on send/recv operation"
    _stuck_slurm(stuck, squeue=said)
    with pytest.raises(SchedulerError) as e:
        get_scheduler("slurm", "t").describe("4242")
    msg = str(e.value)
    assert msg.startswith("`squeue ") and "did not finish in 0.5 s" in msg
    assert f"(it said: {said})" in msg and "`scontrol ping`" in msg


def test_an_sbatch_that_prints_no_job_id_is_an_error_not_a_handle(stuck: Path) -> None:
    (stuck / "sbatch").write_text(
        '#!/bin/sh\n[ "$1" = --version ] && echo "slurm 22.05.8"\nexit 0\n'
    )
    (stuck / "sbatch").chmod(0o755)
    sched = get_scheduler("slurm", "t")
    with pytest.raises(SchedulerError, match=r"exited 0 but printed no job id \(stdout ''\)"):
        sched.schedule(sched.submit_dryrun(ddp_app(), {}))


def test_a_dry_run_does_not_need_sinfo_to_answer(stuck: Path) -> None:
    # Node memory (sinfo) is optional for the script: a stuck sinfo only drops --mem's check.
    _stuck_slurm(stuck, sbatch=FULL_TABLE, sinfo="sinfo: error: Unable to contact controller")
    assert "#SBATCH" in str(get_scheduler("slurm", "t").submit_dryrun(ddp_app(), {}))
