"""A bad tracker config is known at submit: one line naming where it was given, exit 2."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.helpers.cli import Env, xrun
from tests.helpers.net import free_port


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Env:
    for var in ("TORCHX_TRACKERS", "TORCHX_TRACKER_FSSPEC_CONFIG", "TORCHX_TRACKER_MLFLOW_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    return Env(tmp_path)


def _fails(cli: Env, config: str, *args: str, env: dict[str, str] | None = None) -> str:
    (cli.cwd / ".xrunconfig").write_text(config)
    args = args or ("run", "--dryrun", "-s", "local_cwd", "utils.echo")
    r = xrun(*args, cwd=cli.cwd, env={**cli.env, **(env or {})})
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("xrun: error: "), r.stderr
    assert "Traceback" not in r.stderr
    return lines[0]


def test_unknown_backend(cli: Env) -> None:
    line = _fails(cli, "[torchx:tracker]\nmlfow =\n")
    assert ".xrunconfig [torchx:tracker] mlfow: unknown tracker backend 'mlfow'" in line
    assert "did you mean 'mlflow'" in line


def test_unknown_backend_stops_a_real_submit_too(cli: Env, tmp_path: Path) -> None:
    own = {"XDG_STATE_HOME": str(tmp_path / "state")}  # an empty state dir: nothing listed yet
    args = ("run", "-s", "local_cwd", "utils.echo")
    line = _fails(cli, "[torchx:tracker]\nwandb =\n", *args, env=own)
    assert "[torchx:tracker] wandb" in line
    r = xrun("list", "-s", "local_cwd", cwd=cli.cwd, env={**cli.env, **own})
    assert r.returncode == 0 and "echo" not in r.stdout, r.stdout  # nothing was started


def test_unknown_backend_from_the_environment(cli: Env) -> None:
    args = ("run", "--dryrun", "-s", "local_cwd", "utils.echo")
    line = _fails(cli, "", *args, env={"TORCHX_TRACKERS": "fsspec,nope"})
    assert "TORCHX_TRACKERS=fsspec,nope: unknown tracker backend 'nope'" in line


def test_unreadable_fsspec_config_file(cli: Env) -> None:
    bad = cli.cwd / "tracker.conf"
    bad.write_bytes(b"\xff\xfe protocol=file\n")  # not text (we run as root: no mode bits)
    line = _fails(cli, f"[torchx:tracker]\nfsspec =\n[tracker:fsspec]\nconfig = {bad}\n")
    assert f".xrunconfig [tracker:fsspec] config={bad}: cannot read the tracker config" in line


def test_fsspec_config_file_without_root(cli: Env) -> None:
    bad = cli.cwd / "tracker.conf"
    bad.write_text("protocol=file\n")
    line = _fails(cli, f"[torchx:tracker]\nfsspec =\n[tracker:fsspec]\nconfig = {bad}\n")
    assert "[tracker:fsspec] config" in line and "root_path=" in line


def test_fsspec_root_that_cannot_be_a_dir(cli: Env) -> None:
    f = cli.cwd / "a-file"
    f.write_text("")
    line = _fails(cli, f"[torchx:tracker]\nfsspec =\n[tracker:fsspec]\nconfig = {f}/sub\n")
    assert "[tracker:fsspec] config" in line and "not a directory" in line


def test_unreachable_mlflow_server(cli: Env) -> None:
    uri = f"http://127.0.0.1:{free_port()}"
    line = _fails(cli, f"[torchx:tracker]\nmlflow =\n[tracker:mlflow]\nconfig = {uri}\n")
    assert f"[tracker:mlflow] config={uri}: the MLflow server at {uri} is unreachable" in line


@pytest.mark.parametrize(
    ("config", "said"),
    [
        ("/proc/nope", "cannot be created under /proc"),  # mode bits say writable (root)
        ("nosuchproto://x", "fsspec knows no protocol 'nosuchproto'"),
    ],
)
def test_fsspec_roots_no_job_could_use(cli: Env, config: str, said: str) -> None:
    """M4: caught at submit, as docs/tracking.md says (were: rc 0, then every rank's line)."""
    line = _fails(
        cli, "", env={"TORCHX_TRACKERS": "fsspec", "TORCHX_TRACKER_FSSPEC_CONFIG": config}
    )
    assert f"TORCHX_TRACKER_FSSPEC_CONFIG={config}: " in line and said in line


def test_mlflow_server_that_accepts_and_never_answers(cli: Env) -> None:
    """M4: a hung server is refused at submit too (the TCP connection alone used to pass)."""
    with socket.create_server(("127.0.0.1", 0)) as srv:
        uri = f"http://127.0.0.1:{srv.getsockname()[1]}"
        line = _fails(cli, f"[torchx:tracker]\nmlflow =\n[tracker:mlflow]\nconfig = {uri}\n")
    assert f"the MLflow server at {uri} accepts connections but gave no answer within 3 s" in line


def test_mlflow_password_is_masked(cli: Env) -> None:
    """M5: an MLflow URL's user:password is never echoed."""
    uri = f"http://alice:s3cr3t@127.0.0.1:{free_port()}"
    line = _fails(cli, "", env={"TORCHX_TRACKERS": "mlflow", "TORCHX_TRACKER_MLFLOW_CONFIG": uri})
    assert "s3cr3t" not in line and "http://alice:***@127.0.0.1" in line and "unreachable" in line


def test_tracker_list_with_tracking_turned_off(cli: Env) -> None:
    line = _fails(cli, "[torchx:tracker]\n", "tracker", "list", "jobs")
    assert "tracking is turned off" in line


def test_tracker_list_usage_errors(cli: Env) -> None:
    for args in (("tracker",), ("tracker", "list"), ("tracker", "list", "metadata")):
        r = cli.run(*args)
        assert r.returncode == 2 and r.stderr.startswith("xrun: error: "), r.stderr
        assert len(r.stderr.splitlines()) == 1
