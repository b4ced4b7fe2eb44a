"""Issue #32 item 3 (R12): one ``Workspace`` value, opened once at the edge, carried into the
request; None means "no workspace" everywhere; a scheduler that builds images declares it.

No backend is needed: every request here is a dry run, and the sweep's supervisor is not
started (the build is what is checked). The docker and Slurm end-to-end runs of a workspace
are in tests/schedulers/{docker,slurm}/test_workspace.py."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from xrun.config import Config
from xrun.runner import Runner
from xrun.schedulers.api import AppDryRunInfo, WorkspaceBuilder
from xrun.schedulers.docker import DockerScheduler
from xrun.schedulers.local_cwd import LocalCwdScheduler
from xrun.schedulers.slurm import SlurmScheduler
from xrun.schedulers.workspace import Workspace, open_workspace
from xrun.specs import AppDef, Role
from xrun.sweeps import trials
from xrun.sweeps.plan import plan_from_app, sweep_from_cli
from xrun.sweeps.trials import TrialsBackend

from .test_api import _Echo


def _app(image: str = "img:1") -> AppDef:
    return AppDef("echo", [Role("echo", image, "echo", ["hi"])])


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / ".gitignore").write_text("data/\n")
    return open_workspace(str(tmp_path / "ws"))


def test_a_builder_declares_itself() -> None:
    """The trials backend and the CLI ask this, not ``getattr(sched, "resolve_workspace")``."""
    assert isinstance(DockerScheduler("s"), WorkspaceBuilder)
    assert not isinstance(SlurmScheduler("s"), WorkspaceBuilder)
    assert not isinstance(LocalCwdScheduler("s"), WorkspaceBuilder)


def test_the_opened_value_is_the_one_in_the_request(ws: Workspace, tmp_path: Path) -> None:
    """Slurm and docker take the value as it is: no second open, no attribute set around the
    call (the old ``self._workspace``)."""
    slurm = SlurmScheduler("s")
    info = slurm.submit_dryrun(_app(""), {"job_dir": str(tmp_path / "D")}, ws)
    assert info.request.workspace is ws
    assert not hasattr(slurm, "_workspace") and not hasattr(slurm, "_array")
    head = str(DockerScheduler("s").submit_dryrun(_app(), {}, ws)).splitlines()[:2]
    assert head == [
        f"# workspace {ws.url} -> each image below, as xrun-workspace:<hash>",
        f"#   {ws.describe_ignored()}",
    ]


def test_none_is_no_workspace_on_docker_too(
    ws: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Python API's None is no workspace (the cwd default is the CLI's, at the edge)."""
    monkeypatch.chdir(tmp_path)
    with Runner(config=Config()) as runner:
        none = str(runner.dryrun(_app(), "docker"))
        given = str(runner.dryrun(_app(), "docker", workspace=ws.url))
    assert none.startswith("# no workspace (--workspace ''): the role images run unchanged\n")
    assert given.startswith(f"# workspace {ws.url} -> ")


def test_a_plugin_that_knows_no_workspace_is_given_none() -> None:
    """TorchX-style ``_submit_dryrun(app, cfg)``: a workspace is not opened for it."""
    info = _Echo("s").submit_dryrun(AppDef("a", [Role("r", "i", "echo", ["x"])]), {}, "/nope")
    assert str(info) == "> echo x"


def test_a_plain_folder_is_opened_without_fsspec(tmp_path: Path) -> None:
    """The Runner opens every workspace now: a Slurm job that runs in a plain folder still
    imports no fsspec (benchmark 5's light dry run); the first walk does."""
    (tmp_path / "train.py").write_text("")
    code = textwrap.dedent(
        f"""
        import sys
        from xrun.config import Config
        from xrun.runner import Runner
        from xrun.specs import AppDef, Role
        from xrun.schedulers.workspace import walk
        app = AppDef("a", [Role("r", "", "echo", ["hi"])])
        with Runner(config=Config()) as runner:
            info = runner.dryrun(app, "slurm", {{}}, workspace={str(tmp_path)!r})
            assert "fsspec" not in sys.modules, "fsspec was imported"
            ws = runner.scheduler("slurm").open_workspace({str(tmp_path)!r})
        print(info.request.chdir, [f.rel for f in walk(ws)], "fsspec" in sys.modules)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path
    ).stdout
    assert out == f"{tmp_path} ['train.py'] True\n"


class _Builder(WorkspaceBuilder, _Echo):
    """A plugin that builds images: the trials backend finds it by its base, nothing else."""

    def __init__(self, session_name: str) -> None:
        super().__init__(session_name)
        self.builds: list[tuple[list[str], Workspace, Any]] = []

    def build_workspace(self, roles: Iterable[Role], workspace: Workspace, cfg: Any) -> None:
        roles = list(roles)
        self.builds.append(([r.image for r in roles], workspace, cfg))
        for r in roles:
            r.image = f"built-{r.image}"

    def _submit_dryrun(
        self, app: AppDef, cfg: Any, workspace: Workspace | None = None
    ) -> AppDryRunInfo[list[str]]:
        info = super()._submit_dryrun(app, cfg)
        return AppDryRunInfo(
            [*info.request, f"ws={workspace.url if workspace else None}"], " ".join
        )


def test_a_sweep_builds_once_through_the_declared_builder(
    ws: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setattr(trials, "_start_supervisor", lambda path: None)
    app = AppDef("sw", [Role("a", "img:2", "echo", ["{{m}}"]), Role("b", "img:1", "echo", [])])
    plan = plan_from_app(app, sweep_from_cli(["m=x,y"], None, None))
    sched = _Builder("s")
    backend = TrialsBackend(sched)
    dry = backend.dryrun(plan, {}, ws)
    assert dry.endswith(f"> echo x ws={ws.url}") and sched.builds == []  # a dry run builds none
    backend.submit(plan, {}, None)  # no workspace: nothing built
    assert sched.builds == []
    backend.submit(plan, {}, ws)
    assert sched.builds == [(["img:1", "img:2"], ws, {"prefix": ">"})]  # once, every image
    assert {r.image for a in (plan.template, *(plan.apps or [])) if a for r in a.roles} == {
        "built-img:1",
        "built-img:2",
    }
