"""The docker workspace from any fsspec folder (issue #27, item 3) on the real Docker Engine:
the image holds the files of the one walk (schedulers/workspace.py), and ``--dryrun`` names
the workspace and the ignore set the build uses."""

# ruff: noqa: F811  (the docker_engine fixture is imported, then named by the tests)
from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest

from tests.helpers.cli import Env
from tests.helpers.docker import docker_engine  # noqa: F401
from xrun.schedulers.docker import DockerScheduler
from xrun.schedulers.workspace import open_workspace
from xrun.specs import AppDef, AppState, Role

FILES = {
    "job.sh": "cat data.txt; ls -a | tr '\\n' ' '\n",
    "data.txt": "v1\n",
    "ckpt/model.bin": "x",
    ".gitignore": "ckpt/\n",
}


@pytest.fixture
def memory_ws() -> Iterator[str]:
    fs = fsspec.filesystem("memory")
    root = f"/docker-ws-{uuid.uuid4().hex}"
    for rel, text in FILES.items():
        fs.pipe(f"{root}/{rel}", text.encode())
    yield f"memory://{root}"
    fs.rm(root, recursive=True)


@pytest.mark.docker
@pytest.mark.timeout(300)
def test_a_memory_workspace_is_built_into_the_image(docker_engine: str, memory_ws: str) -> None:
    sched = DockerScheduler("default")
    try:
        app = AppDef("memws", [Role("r", docker_engine, "sh", ["job.sh"])])
        dry = str(sched.submit_dryrun(app, {}, memory_ws))
        assert dry.startswith(f"# workspace {memory_ws} -> each image below")
        assert "#   leaving out .gitignore: ckpt/; always: .git/ " in dry
        app_id = sched.submit(app, {}, workspace=memory_ws)
        assert app.roles[0].image.startswith("xrun-workspace:")
        resp = sched.wait(app_id, timeout=60)
        assert resp is not None and resp.state == AppState.SUCCEEDED, resp
        out = "".join(sched.log_iter(app_id, "r", 0))
        assert out.startswith("v1\n") and "job.sh" in out and "ckpt" not in out, out
    finally:
        sched.close()


def test_the_cli_dry_run_names_the_workspace_and_ignore_set(tmp_path: Path) -> None:
    cli = Env(tmp_path)
    (cli.cwd / ".gitignore").write_text("*.ckpt\n")
    r = cli.run("run", "--dryrun", "-s", "docker", "utils.echo")  # the cwd by default
    assert r.returncode == 0, r.stderr
    request = r.stdout.split("docker request ----\n", 1)[1].splitlines()
    assert request[0] == f"# workspace {cli.cwd} -> each image below, as xrun-workspace:<hash>"
    assert request[1] == f"#   {open_workspace(str(cli.cwd)).describe_ignored()}"
    assert request[1].startswith("#   leaving out .gitignore: *.ckpt; always:")
    # B14: the repository the images are tagged in is the image_repo run option's
    repo = "reg.example:5000/team/ws"
    r = cli.run("run", "--dryrun", "-s", "docker", "-cfg", f"image_repo={repo}", "utils.echo")
    assert r.returncode == 0, r.stderr
    request = r.stdout.split("docker request ----\n", 1)[1].splitlines()
    assert request[0] == f"# workspace {cli.cwd} -> each image below, as {repo}:<hash>"
    r = cli.run("run", "--dryrun", "-s", "docker", "--workspace", "", "utils.echo")
    assert "# no workspace (--workspace ''): the role images run unchanged" in r.stdout
    r = cli.run("run", "--dryrun", "-s", "docker", "--workspace", "memory://none", "utils.echo")
    assert r.returncode == 2 and "workspace 'memory://none' is not a directory" in r.stderr
