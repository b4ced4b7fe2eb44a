"""The docker run options against TorchX 0.7.0's (tests/fixtures/torchx/docker-runopts-0.7.0.json,
recorded by record_runopts.py there): every TorchX option exists with its type and default
(differences listed in KNOWN), and ``image_repo`` and ``quiet`` do what they say on the real
Docker Engine."""

# ruff: noqa: F811  (the docker_engine fixture is imported, then named by the tests)
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.docker import docker_engine  # noqa: F401
from tests.helpers.paths import FIXTURES
from xrun.errors import UsageError
from xrun.schedulers.docker import DockerScheduler
from xrun.specs import AppDef, AppState, Role

RECORDED = json.loads((FIXTURES / "torchx" / "docker-runopts-0.7.0.json").read_text())["docker"]
# TorchX's type names -> xrun's (TorchX writes typing's List/Dict)
_TYPES = {"List": "list", "Dict": "dict"}
KNOWN = {
    ("copy_env", "default"): "[] rather than None: the same (nothing copied), as a value",
    ("env", "default"): "{} rather than None: the same (no extra env), as a value",
}


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_every_torchx_docker_option_exists_with_its_type_and_default(name: str) -> None:
    theirs = RECORDED[name]
    ours = DockerScheduler("t").run_opts().get(name)
    assert ours is not None, f"TorchX's docker option {name!r} is missing"
    assert ours.type_.__name__ == _TYPES.get(theirs["type"], theirs["type"])
    assert ours.required == theirs["required"]
    if (name, "default") in KNOWN:
        assert ours.default != theirs["default"]
    else:
        assert ours.default == theirs["default"]


def test_image_repo_must_be_a_repository() -> None:
    opts = DockerScheduler("t").run_opts()
    assert opts.resolve({"image_repo": "localhost:5000/team/ws"}, "docker").image_repo == (
        "localhost:5000/team/ws"
    )
    for bad in ("Team/WS", "ws:tag", "ws@sha256:0", "a//b", ""):
        with pytest.raises(UsageError, match=r"image_repo=.* expected \[HOST\[:PORT\]/\]NAME"):
            opts.resolve({"image_repo": bad}, "docker")


@pytest.mark.docker
@pytest.mark.timeout(300)
def test_image_repo_tags_the_workspace_image_and_quiet_silences_the_build(
    docker_engine: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    import docker

    (tmp_path / "job.sh").write_text(f"echo {tmp_path.name}\n")  # a new image for this test
    sched = DockerScheduler("default")
    client = docker.from_env()
    repo = "xrun-test/parity-ws"
    try:
        app = AppDef("repo", [Role("r", docker_engine, "sh", ["job.sh"])])
        app_id = sched.submit(app, {"image_repo": repo, "quiet": True}, workspace=str(tmp_path))
        assert app.roles[0].image.startswith(f"{repo}:")
        assert client.images.get(app.roles[0].image).tags
        resp = sched.wait(app_id, timeout=60)
        assert resp is not None and resp.state == AppState.SUCCEEDED, resp
        assert "xrun: docker build:" not in capfd.readouterr().err
        (tmp_path / "job.sh").write_text(f"echo {tmp_path.name} again\n")
        app = AppDef("repo", [Role("r", docker_engine, "sh", ["job.sh"])])
        sched.submit(app, {"image_repo": repo}, workspace=str(tmp_path))
        err = capfd.readouterr().err
        assert "xrun: docker build: Step 1/" in err, err
    finally:
        for im in client.images.list(name=repo):
            for tag in im.tags:
                client.images.remove(tag, force=True)
        client.close()
        sched.close()
