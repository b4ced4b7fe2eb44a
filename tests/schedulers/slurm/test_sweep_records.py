"""Issue #26: a Slurm sweep's record (sweep.json) of the wrong shape is one line naming it
(exit 1), and `xrun list -s slurm` still lists (the damaged sweep as UNKNOWN)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.helpers import slurm as slurm_fixture
from tests.helpers.cli import Env
from tests.helpers.slurm import SlurmCluster
from xrun.sweeps import records

slurm_cluster = slurm_fixture.slurm_cluster
GOOD = {
    "kind": "slurm-array",
    "scheduler": "slurm",
    "session": "default",
    "plan": {"name": "x", "params": ["w"], "trials": [{"w": "1"}]},
    "job_id": "999999",
    "log_dir": "/nonexistent",
    "roles": {"x": 1},
}


@pytest.mark.parametrize(
    "damage",
    [{"job_id": 999999}, {"roles": {"x": "1"}}, {"roles": 3}, {"log_dir": None}, {"plan": []}],
    ids=lambda d: json.dumps(d)[:30],
)
def test_a_damaged_slurm_sweep_record_is_one_line(
    slurm_cluster: SlurmCluster, tmp_path: Path, damage: dict[str, object]
) -> None:
    env = Env(tmp_path)
    sweep_id = f"9{abs(hash(tmp_path.name)) % 10**8}"
    path = Path(records.sweep_dir("slurm", sweep_id))
    path.mkdir(parents=True)
    (path / records.SPEC_FILE).write_text(json.dumps({**GOOD, **damage}))
    handle = f"slurm://default/{sweep_id}"
    try:
        _check(env, handle, path)
    finally:  # the suite's state dir is shared: other tests' lists must not see it
        shutil.rmtree(path)


def _check(env: Env, handle: str, path: Path) -> None:
    r = env.run("status", handle)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and "damaged" in lines[0] and str(path) in lines[0], lines
    listed = env.run("list", "-s", "slurm")
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr[-2000:]
    assert f"{handle}\tUNKNOWN" in listed.stdout, listed.stdout
