"""The Slurm workspace: what ``--dryrun`` shows is what submit copies (issue #27, item 2), from
any fsspec folder (item 3), on the real cluster."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest

from tests.helpers import slurm as slurm_fixture
from tests.helpers.cli import Env
from tests.helpers.slurm import SlurmCluster
from xrun.config import Config
from xrun.errors import UsageError
from xrun.runner import Runner
from xrun.schedulers.slurm import create_scheduler
from xrun.schedulers.workspace import open_workspace
from xrun.specs import AppDef, AppState, Resource, Role

# The session fixture, also when tests/conftest.py does not import it.
slurm_cluster = slurm_fixture.slurm_cluster


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
        (tmp_path / "ws").mkdir()
        info = runner.dryrun(_echo(), "slurm", cfg, workspace=str(tmp_path / "ws"))
        assert info.request.workspace.url == str(tmp_path / "ws")
        # no workspace: the cwd, as submit copies it
        assert runner.dryrun(_echo(), "slurm", cfg).request.workspace.url == str(tmp_path)


# --------------------------------------------------------------------------- fsspec workspaces
MAIN = "cat data.txt; ls -a | tr '\\n' ' '\n"


@pytest.fixture
def memory_ws() -> Iterator[str]:
    fs = fsspec.filesystem("memory")
    root = f"/slurm-ws-{uuid.uuid4().hex}"
    files = {"main.sh": MAIN, "data.txt": "v1\n", "big.bin": "x", ".gitignore": "*.bin\n"}
    for rel, text in files.items():
        fs.pipe(f"{root}/{rel}", text.encode())
    yield f"memory://{root}"
    fs.rm(root, recursive=True)


@pytest.mark.slurm
@pytest.mark.timeout(180)
def test_a_memory_workspace_runs_on_the_real_cluster(
    slurm_cluster: SlurmCluster, memory_ws: str, tmp_path: Path
) -> None:
    sched = create_scheduler("test")
    job_dir = tmp_path / "job"
    app = AppDef("memws", [Role("w", "", "bash", ["main.sh"], resource=Resource(1, 0, 100))])
    cfg = {"job_dir": str(job_dir)}
    dry = str(sched.submit_dryrun(app, cfg, memory_ws))
    assert f"# copy workspace {memory_ws} -> {job_dir} first\n" in dry
    assert "#   leaving out .gitignore: *.bin; always: .git/ " in dry
    app_id = sched.submit(app, cfg, workspace=memory_ws)
    resp = sched.wait(app_id, timeout=90)
    assert resp is not None and resp.state == AppState.SUCCEEDED, resp
    out = (job_dir / "slurm-logs" / app_id / "w" / "0.stdout").read_text()
    assert out.startswith("v1\n") and "main.sh" in out and "big.bin" not in out, out


def test_a_url_workspace_without_job_dir_is_refused_in_the_dry_run(cli: Env) -> None:
    r = cli.run("run", "--dryrun", "-s", "slurm", "--workspace", "memory://proj", "utils.echo")
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert "workspace 'memory://proj' is not a directory" in r.stderr
    with pytest.raises(UsageError, match="add -cfg job_dir=DIR"):
        with fsspec.open("memory://urlws/a.txt", "w") as f:
            f.write("a")
        create_scheduler("t").submit_dryrun(_echo(), {}, "memory://urlws")


def test_a_file_url_dry_run_prints_the_ignore_set_the_copy_uses(cli: Env) -> None:
    ws = cli.cwd / "proj"
    ws.mkdir()
    (ws / ".xrunignore").write_text("# outputs\nout/\n")
    r = cli.run(
        "run", "--dryrun", "-s", "slurm", "-cfg", f"job_dir={cli.cwd / 'J'}",
        "--workspace", f"file://{ws}", "utils.echo",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split("# copy workspace ", 1)[1].splitlines()
    assert lines[0] == f"file://{ws} -> {cli.cwd / 'J'} first"
    assert lines[1] == f"#   {open_workspace(f'file://{ws}').describe_ignored()}"
    assert lines[1].startswith("#   leaving out .xrunignore: out/; always: .git/")
