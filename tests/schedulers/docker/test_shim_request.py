"""Gap N16 on docker, without an engine: a role started without xrun's runtime agent
(``utils.python``) gets the workspace image's copy of the ``torchx.tracker`` stand-in after its
PYTHONPATH, in the request value that --dryrun prints. (The real run: test_tracking.py.)"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from xrun.components import utils
from xrun.contract import JOB_ID_ENV
from xrun.schedulers.docker import DockerScheduler
from xrun.schedulers.docker.options import DockerOptions
from xrun.schedulers.docker.request import SHIM_IN_IMAGE, XRUN_DIR, format_job, materialize
from xrun.schedulers.docker.workspace import DEFAULT_DOCKERFILE, xrun_package_files
from xrun.specs import AppDef

SHIM = "/opt/xrun/xrun/torchx/shim"


def _app(**env: str) -> AppDef:
    """A utils.python app of a job xrun submits (the Runner sets TORCHX_JOB_ID), two roles:
    one with no PYTHONPATH, one with its own."""
    app = utils.python(script="track.py", image="xrun-python:latest")
    plain = app.roles[0]
    plain.env[JOB_ID_ENV] = "docker://default/x-1"
    plain.env.update(env)
    mine = dataclasses.replace(plain, name="mine", env={**plain.env, "PYTHONPATH": "/mine"})
    return AppDef(app.name, [plain, mine])


def test_the_image_holds_the_stand_in_where_the_request_says() -> None:
    assert SHIM_IN_IMAGE == SHIM and XRUN_DIR == "/opt/xrun"
    assert f"COPY xrun {XRUN_DIR}/xrun\n" in DEFAULT_DOCKERFILE
    assert f"ENV PYTHONPATH={XRUN_DIR}$" in DEFAULT_DOCKERFILE
    # the build context's xrun/ tree, which the recipe copies to /opt/xrun/xrun
    assert "xrun/torchx/shim/torchx/tracker/__init__.py" in xrun_package_files()


def test_agentless_roles_get_the_stand_in_after_their_pythonpath() -> None:
    job = materialize(_app(), "x-1", DockerOptions(), xrun_in_image=True)
    plain, mine = job.containers
    # No PYTHONPATH of its own: the image's (/opt/xrun and the base's), read when the container
    # is created; setting one here would replace it.
    assert "PYTHONPATH" not in plain.env and plain.pythonpath_tail == [SHIM]
    assert mine.env["PYTHONPATH"] == f"/mine:{SHIM}" and mine.pythonpath_tail == []
    text = format_job(job)
    assert f"# python/0\n# PYTHONPATH: the image's, then {SHIM}\n" in text
    assert f"--env PYTHONPATH=/mine:{SHIM} " in text


def test_no_stand_in_without_a_workspace_image_or_outside_an_xrun_job() -> None:
    # no workspace: the role images run unchanged, with no xrun in them
    for c in materialize(_app(), "x-1", DockerOptions(), xrun_in_image=False).containers:
        assert c.pythonpath_tail == [] and c.env.get("PYTHONPATH", "/mine") == "/mine"
    app = _app()
    for role in app.roles:
        del role.env[JOB_ID_ENV]  # not a job xrun submitted
    for c in materialize(app, "x-1", DockerOptions(), xrun_in_image=True).containers:
        assert c.pythonpath_tail == [] and c.env.get("PYTHONPATH", "/mine") == "/mine"


def test_dryrun_with_a_workspace_shows_it(tmp_path: Path) -> None:
    (tmp_path / "track.py").write_text("print(1)\n")
    sched = DockerScheduler("s1", state_dir=str(tmp_path / "state"))
    with_ws = str(sched.submit_dryrun(_app(), {}, workspace=str(tmp_path)))
    assert f"# PYTHONPATH: the image's, then {SHIM}" in with_ws
    assert f"--env PYTHONPATH=/mine:{SHIM} " in with_ws
    without = str(sched.submit_dryrun(_app(), {}, workspace=""))
    assert SHIM not in without and "--env PYTHONPATH=/mine " in without
