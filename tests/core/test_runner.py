"""The Python API (``xrun.runner``) against the real local_cwd scheduler."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from xrun.config import Config
from xrun.errors import AppNotFoundError, UsageError
from xrun.runner import Runner, get_runner
from xrun.specs import AppDef, AppState, Role


@pytest.fixture
def runner() -> Iterator[Runner]:
    # An empty Config: the developer's own ~/.xrunconfig must not change the test.
    with get_runner("rt", config=Config()) as r:
        yield r


def echo_app(msg: str = "hello", replicas: int = 1) -> AppDef:
    return AppDef(
        name="echo",
        roles=[Role(name="echo", image="", entrypoint="echo", args=[msg], num_replicas=replicas)],
    )


@pytest.mark.timeout(60)
def test_run_wait_status_logs_describe_list(runner: Runner, tmp_path: Path) -> None:
    cfg = {"log_dir": str(tmp_path / "logs")}
    handle = runner.run(echo_app("hi ${replica_id}", 2), "local_cwd", cfg)
    assert handle.startswith("local_cwd://rt/echo-")
    final = runner.wait(handle, timeout=30)
    assert final is not None and final.state == AppState.SUCCEEDED
    status = runner.status(handle)
    assert status is not None and status.state == AppState.SUCCEEDED
    assert [r.id for r in status.roles[0].replicas] == [0, 1]
    assert [line.rstrip("\n") for line in runner.log_lines(handle, "echo", k=1)] == ["hi 1"]
    assert list(runner.log_lines(handle, "echo", k=0, regex="nomatch")) == []
    app = runner.describe(handle)
    assert app is not None and app.roles[0].entrypoint == "echo"
    assert app.roles[0].num_replicas == 2
    # TorchX's Runner: an app this runner submitted keeps its own name (gap N12); another
    # runner knows it from the scheduler only, named by its app id
    assert app.name == "echo"
    with get_runner("rt", config=Config()) as other:
        seen = other.describe(handle)
        assert seen is not None and seen.name == handle.rsplit("/", 1)[1]
        assert seen.roles[0].num_replicas == 2
    assert handle.rsplit("/", 1)[1] in [a.app_id for a in runner.list("local_cwd")]
    assert (tmp_path / "logs").is_dir()  # the run option reached the scheduler


@pytest.mark.timeout(60)
def test_run_component_and_failure(runner: Runner) -> None:
    handle = runner.run_component("utils.sh", ["exit 3"], "local_cwd")
    final = runner.wait(handle, timeout=30)
    assert final is not None and final.state == AppState.FAILED
    assert final.roles[0].replicas[0].exit_code == 3


@pytest.mark.timeout(60)
def test_cancel_a_running_app(runner: Runner) -> None:
    handle = runner.run_component("utils.sh", ["sleep 30"], "local_cwd", {"stop_grace_s": "1"})
    deadline = time.monotonic() + 20
    while (st := runner.status(handle)) is not None and st.state != AppState.RUNNING:
        assert time.monotonic() < deadline, st
        time.sleep(0.05)
    t0 = time.monotonic()
    runner.cancel(handle)
    final = runner.wait(handle, timeout=20)
    assert final is not None and final.state == AppState.CANCELLED
    assert time.monotonic() - t0 < 10


def test_dryrun_submits_nothing_and_schedule_executes_it(runner: Runner) -> None:
    before = {a.app_id for a in runner.list("local_cwd")}
    info = runner.dryrun_component("utils.echo", ["--msg", "dry"], "local_cwd")
    assert "echo" in str(info) and info.scheduler == "local_cwd"
    assert {a.app_id for a in runner.list("local_cwd")} == before
    handle = runner.schedule(info)
    final = runner.wait(handle, timeout=30)
    assert final is not None and final.state == AppState.SUCCEEDED


def test_unknown_and_malformed_handles(runner: Runner) -> None:
    missing = "local_cwd://rt/no-such-app-42"
    assert runner.status(missing) is None
    assert runner.describe(missing) is None
    assert runner.wait(missing, timeout=1) is None
    assert runner.cancel(missing) is None  # TorchX's: an unknown app is nothing to stop
    with pytest.raises(AppNotFoundError):
        runner.cancel(missing, missing_ok=False)  # `xrun cancel`'s exit 1
    with pytest.raises(UsageError, match="malformed app handle"):
        runner.status("local_cwd/oops")
    with pytest.raises(UsageError, match="unknown scheduler 'nosuch'"):
        runner.status("nosuch://rt/x")


def test_invalid_app_is_a_usage_error(runner: Runner) -> None:
    with pytest.raises(UsageError, match="has no roles"):
        runner.dryrun(AppDef(name="empty"), "local_cwd")
    with pytest.raises(UsageError, match="unknown run option 'nope'"):
        runner.dryrun(echo_app(), "local_cwd", {"nope": 1})
