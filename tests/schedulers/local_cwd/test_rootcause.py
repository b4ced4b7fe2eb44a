"""``xrun run`` and ``xrun status`` on local_cwd name a failed rank's root cause (issue #24,
item 4): the replica's runtime agent writes it to its error file, which status reads."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.helpers.cli import Env
from tests.helpers.paths import REPO, SCRIPTS

FAULTS = REPO / "benchmarks" / "workers" / "faults.py"


@pytest.mark.parametrize(
    ("fault", "cause"),
    [
        ("raise", "ValueError: bad shape in batch 7 (rank 1, faults.py:22)"),
        ("segv", "crashed with SIGSEGV: segmentation fault"),
        ("exit3", "exited with code 3 (rank 1)"),
        # the worker's @record file is the cause; the rank comes from the agent's last line
        ("record", "RuntimeError: recorded failure (rank 1)"),
    ],
)
def test_run_and_status_name_the_rank_and_cause(tmp_path: Path, fault: str, cause: str) -> None:
    env = Env(tmp_path)
    shutil.copy(FAULTS, env.cwd / "faults.py")
    run = env.run(
        "run", "-s", "local_cwd", "dist.ddp", "-j", "1x2", "--script", "faults.py", fault, "1"
    )
    assert run.returncode != 0
    assert f"xrun-agent: root cause: {cause}" in run.stderr, run.stderr
    # and xrun's own last line, where the terminal shows it
    assert f" ended FAILED: {cause}" in run.stderr.rstrip().splitlines()[-1]
    handle = next(x for x in run.stdout.split() if x.startswith("local_cwd://"))
    status = env.run("status", handle)
    lines = status.stdout.splitlines()
    assert "State: FAILED" in lines
    # the replica's error and the app's, on the first screen of status
    assert any(x.strip().startswith(f"error: {cause}") for x in lines), status.stdout
    assert any(x.startswith(f"Error: {cause}") for x in lines), status.stdout


def test_a_ddp_workers_rank_prefixed_traceback_names_its_frame(tmp_path: Path) -> None:
    # B12: after init_process_group torch prints "[rank1]: " before every traceback line; the
    # cause still names the exception and the frame that raised it, as for a plain script
    env = Env(tmp_path)
    shutil.copy(SCRIPTS / "valerr.py", env.cwd / "valerr.py")
    run = env.run("run", "-s", "local_cwd", "dist.ddp", "-j", "1x2", "--script", "valerr.py")
    assert run.returncode != 0
    cause = "ValueError: bad shape in batch 3 (rank 1, valerr.py:12)"
    assert f"xrun-agent: root cause: {cause}" in run.stderr, run.stderr
    assert f" ended FAILED: {cause}" in run.stderr.rstrip().splitlines()[-1]
    # the summary's traceback is the worker's, without the prefix
    root = run.stderr.split("Root Cause (first observed failure):")[1]
    assert 'valerr.py", line 12, in load' in root and "[rank1]" not in root.split("====")[0]


def test_the_replica_that_failed_first_is_failed_and_named(tmp_path: Path) -> None:
    # P11/B13: rank 0 (replica race/0) fails 0.25 s before the others. Its peer's agent often
    # exits first ("closed by a peer") while race/0's agent still writes its summary; the
    # supervisor must still name race/0, and call CANCELLED only a replica it stopped. The race
    # goes either way from run to run: three runs, so that a wrong ordering shows.
    env = Env(tmp_path)
    shutil.copy(SCRIPTS / "race.py", env.cwd / "race.py")
    cause = "ValueError: boom from rank 0 (rank 0, race.py:9)"
    for _ in range(3):
        run = env.run("run", "-s", "local_cwd", "dist.ddp", "-j", "2x2", "--script", "race.py")
        assert run.returncode != 0 and f" ended FAILED: {cause}" in run.stderr, run.stderr
        handle = next(x for x in run.stdout.split() if x.startswith("local_cwd://"))
        lines = env.run("status", handle).stdout.splitlines()
        assert "Msg: replica race/0 exited with code 1" in lines, lines
        assert f"Error: {cause}" in lines, lines
        rows = {x.split(":")[0].strip(): x for x in lines if x.strip().startswith("race/")}
        assert rows["race/0"].strip() == "race/0: FAILED host=localhost exit_code=1", lines
        peer = rows["race/1"].strip()
        # stopped by the supervisor, or failed by itself (closed by the peer, or its own rank)
        stopped = [f"race/1: CANCELLED host=localhost exit_code={c}" for c in (-15, -9, 143, 137)]
        assert peer in (*stopped, "race/1: FAILED host=localhost exit_code=1"), lines
