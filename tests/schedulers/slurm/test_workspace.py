"""The Slurm workspace: what ``--dryrun`` shows is what submit copies (issue #27, item 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.cli import Env
from xrun.config import Config
from xrun.runner import Runner
from xrun.specs import AppDef, Role


def _echo() -> AppDef:
    return AppDef("echo", [Role("echo", "", "echo", ["hi"])])


@pytest.fixture
def cli(tmp_path: Path) -> Env:
    return Env(tmp_path)


def test_dryrun_shows_the_workspace_given_not_the_cwd(cli: Env, tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    job_dir = tmp_path / "D"
    r = cli.run(
        "run", "--dryrun", "-s", "slurm", "-cfg", f"job_dir={job_dir}",
        "--workspace", "../sub", "utils.echo",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert f"# copy workspace {tmp_path / 'sub'} -> {job_dir} first\n" in r.stdout
    assert str(cli.cwd) not in r.stdout.split("# copy workspace", 1)[1].split("\n", 1)[0]


def test_a_sweep_s_dryrun_shows_the_workspace_given(cli: Env, tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    r = cli.run(
        "run", "--dryrun", "-s", "slurm", "-cfg", f"job_dir={tmp_path / 'D'}",
        "--workspace", str(tmp_path / "sub"), "--sweep", "m=a,b", "utils.echo", "--msg", "{{m}}",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert f"# copy workspace {tmp_path / 'sub'} -> {tmp_path / 'D'} first\n" in r.stdout


def test_runner_dryrun_takes_the_workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with Runner(config=Config()) as runner:
        cfg = {"job_dir": str(tmp_path / "D")}
        info = runner.dryrun(_echo(), "slurm", cfg, workspace=str(tmp_path / "ws"))
        assert info.request.workspace == str(tmp_path / "ws")
        # no workspace: the cwd, as submit copies it
        assert runner.dryrun(_echo(), "slurm", cfg).request.workspace == str(tmp_path)
