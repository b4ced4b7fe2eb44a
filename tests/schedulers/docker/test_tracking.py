# ruff: noqa: F811  (the docker_engine fixture is imported, then named by the tests)
"""One tracker run per logical job on the real Docker Engine: a dist.ddp job restarted in place
in its containers, and a plain role the engine itself restarts, each record into ONE run; and a
plain role's `from torchx.tracker import ...` with no TorchX in the image (gap N16)."""

from __future__ import annotations

import dataclasses
import io
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.docker import docker_engine  # noqa: F401
from tests.helpers.paths import SCRIPTS
from xrun.components import utils
from xrun.components.dist import ddp
from xrun.config import Config
from xrun.runner import Runner
from xrun.schedulers.docker import DockerScheduler
from xrun.specs import AppDef, AppState, BindMount
from xrun.tracker.fsspec_backend import create

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

IMAGE = "xrun-python:latest"  # python3 only: no TorchX, so torchx.tracker is xrun's stand-in


@pytest.fixture(scope="module")
def sched(docker_engine: str) -> Iterator[DockerScheduler]:
    s = DockerScheduler("default")
    yield s
    s.close()


@pytest.fixture
def tracked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A host dir mounted at /marks; the fsspec tracker's root is /marks/tracker in the job."""
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv("TORCHX_TRACKERS", "fsspec")
    # a container path: the submit-time check only needs its parent to be creatable here too
    monkeypatch.setenv("TORCHX_TRACKER_FSSPEC_CONFIG", "/tmp/xrun-docker-marks/tracker")
    monkeypatch.delenv("TORCHX_PARENT_RUN_ID", raising=False)
    return marks


def _submit(sched: DockerScheduler, app: AppDef, ws: Path) -> tuple[str, str]:
    job = Runner("default", config=Config()).with_job_env(app, "docker")
    app_id = sched.submit(job, {}, workspace=str(ws))
    return app_id, f"docker://default/{app_id}"


def test_in_place_restarts_in_containers_are_one_run(
    sched: DockerScheduler, tracked: Path, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    shutil.copy(SCRIPTS / "track_worker.py", ws / "track_worker.py")
    app = ddp(
        "2",
        "/tmp/xrun-docker-marks",
        script="track_worker.py",
        j="1x2",
        image=IMAGE,
        max_retries=2,
        mounts=[f"type=bind,src={tracked},dst=/tmp/xrun-docker-marks"],
    )
    app_id, handle = _submit(sched, app, ws)
    resp = sched.wait(app_id, timeout=150)
    assert resp is not None and resp.state == AppState.SUCCEEDED, resp
    assert resp.num_restarts == 0  # the agent restarted the workers, not the engine
    ready = sorted(p.name for p in tracked.glob("ready.*"))
    assert ready == [f"ready.{r}.{a}" for r in range(2) for a in range(3)]
    assert {p.read_text() for p in tracked.glob("ready.*")} == {f"docker_default_{app_id} {handle}"}
    tracker = create(str(tracked / "tracker"))
    assert list(tracker.run_ids()) == [handle]
    md = tracker.metadata(handle)
    assert sorted(k for k in md if k.startswith("attempt.")) == [f"attempt.0.{a}" for a in range(3)]
    assert md["restart_count"] == 2 and md["done"] is True


# A plain role runs without the runtime agent, so without its torchx.tracker stand-in: xrun's
# own import.
ENGINE_RETRIED = """\
import os, sys
from xrun.tracker import app_run_from_env
run = app_run_from_env()
marks = "/tmp/xrun-docker-marks"
n = len([p for p in os.listdir(marks) if p.startswith("try.")])
open(f"{marks}/try.{n}", "w").write(os.environ["XRUN_RUN_ID"] + " " + run.job_id())
run.add_metadata(**{f"try.{n}": n})
sys.exit(0 if n == 1 else 5)
"""


def test_an_engine_retry_is_the_same_run(
    sched: DockerScheduler, tracked: Path, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "retried.py").write_text(ENGINE_RETRIED)
    app = utils.python(script="retried.py", image=IMAGE)
    app.roles[0].max_retries = 1  # a plain role: the engine's restart policy retries it
    app.roles[0].mounts = [BindMount(str(tracked), "/tmp/xrun-docker-marks")]
    app_id, handle = _submit(sched, app, ws)
    resp = sched.wait(app_id, timeout=150)
    assert resp is not None and resp.state == AppState.SUCCEEDED, resp
    assert resp.num_restarts == 1  # the engine ran the container again
    ids = {p.read_text() for p in tracked.glob("try.*")}
    assert ids == {f"docker_default_{app_id} {handle}"} and len(list(tracked.glob("try.*"))) == 2
    tracker = create(str(tracked / "tracker"))
    assert list(tracker.run_ids()) == [handle]
    md = tracker.metadata(handle)
    assert (md["try.0"], md["try.1"]) == (0, 1)


# TorchX's documented import, in a role the agent does not start (gap N16): the stand-in comes
# from the workspace image's copy of xrun, after the role's PYTHONPATH (or the image's).
TRACK_TORCHX = """\
import os
from torchx.tracker import app_run_from_env
run = app_run_from_env()
role = os.environ["WHO"]
open(f"/tmp/xrun-docker-marks/{role}.path", "w").write(os.environ["PYTHONPATH"])
run.add_metadata(**{f"{role}.tracked": run.job_id()})
"""


def test_a_plain_role_imports_torchx_tracker_unchanged(
    sched: DockerScheduler, tracked: Path, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "track.py").write_text(TRACK_TORCHX)
    plain = utils.python(script="track.py", image=IMAGE, name="plain").roles[0]
    plain.env["WHO"] = "plain"
    plain.mounts = [BindMount(str(tracked), "/tmp/xrun-docker-marks")]
    mine = dataclasses.replace(
        plain, name="mine", env={"WHO": "mine", "PYTHONPATH": "/opt/xrun:/mine"}
    )
    app_id, handle = _submit(sched, AppDef("n16", [plain, mine]), ws)
    resp = sched.wait(app_id, timeout=150)
    assert resp is not None and resp.state == AppState.SUCCEEDED, resp
    shim = "/opt/xrun/xrun/torchx/shim"
    # the image's own PYTHONPATH kept (xrun-python sets none; the recipe adds /opt/xrun)
    assert (tracked / "plain.path").read_text() == f"/opt/xrun:{shim}"
    assert (tracked / "mine.path").read_text() == f"/opt/xrun:/mine:{shim}"
    tracker = create(str(tracked / "tracker"))
    assert list(tracker.run_ids()) == [handle]
    md = tracker.metadata(handle)
    assert (md["plain.tracked"], md["mine.tracked"]) == (handle, handle)


# A base image with a TorchX of its own: a `torchx` package in its site-packages.
OWN_TORCHX = """\
FROM {image}
RUN d=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/torchx \\
    && mkdir -p "$d" && echo 'OWN = True' > "$d/__init__.py"
"""


def test_an_image_with_its_own_torchx_keeps_it(
    sched: DockerScheduler, tracked: Path, tmp_path: Path
) -> None:
    """The stand-in goes on PYTHONPATH by what the submitter sees (no TorchX here); the
    workspace build drops it from an image that has TorchX, which it would shadow."""
    import docker

    base = "xrun-test-own-torchx:latest"
    client = docker.from_env()
    try:
        client.images.build(
            fileobj=io.BytesIO(OWN_TORCHX.format(image=IMAGE).encode()), tag=base, rm=True
        )
    finally:
        client.close()
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "which.py").write_text(
        "import os, torchx\n"
        "open('/tmp/xrun-docker-marks/which', 'w').write(torchx.__file__ + ' '"
        " + os.environ['PYTHONPATH'])\n"
    )
    app = utils.python(script="which.py", image=base)
    app.roles[0].mounts = [BindMount(str(tracked), "/tmp/xrun-docker-marks")]
    app_id, _ = _submit(sched, app, ws)
    resp = sched.wait(app_id, timeout=150)
    assert resp is not None and resp.state == AppState.SUCCEEDED, resp
    module, path = (tracked / "which").read_text().split(" ")
    assert path == "/opt/xrun:/opt/xrun/xrun/torchx/shim"  # on PYTHONPATH, but empty
    assert module.endswith("-packages/torchx/__init__.py"), module
