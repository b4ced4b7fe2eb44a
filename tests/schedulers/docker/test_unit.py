"""The docker scheduler without an engine: request values, naming, status rules, state files,
the workspace build context, and the two setup errors (no SDK, no engine)."""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from xrun.components.dist import ddp
from xrun.contract import RANK0_HOST_ENV
from xrun.errors import UsageError
from xrun.schedulers.docker import DockerScheduler
from xrun.schedulers.docker.options import DockerOptions
from xrun.schedulers.docker.request import (
    app_state,
    container_name,
    make_app_id,
    materialize,
    replica_state,
)
from xrun.schedulers.docker.statedir import StateDir, split_timestamp
from xrun.schedulers.docker.status import (
    end_message,
    job_from_containers,
    role_statuses,
    split_lines,
)
from xrun.schedulers.docker.workspace import (
    DEFAULT_DOCKERFILE,
    BuildContext,
    build_context,
    image_tag,
)
from xrun.specs import AppDef, AppState, BindMount, DeviceMount, Resource, Role, VolumeMount

DNS_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


def _role(**kw: object) -> Role:
    base: dict[str, object] = {"name": "worker", "image": "img:1", "entrypoint": "echo"}
    base.update(kw)
    return Role(**base)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- naming
def test_container_name_is_app_role_index() -> None:
    assert container_name("ddp-1a2b", "trainer", 3) == "ddp-1a2b-trainer-3"


def test_container_name_sanitizes_to_a_dns_label() -> None:
    name = container_name("ddp-1a2b", "My_Role.v2", 0)
    assert name == "ddp-1a2b-my-role-v2-0"
    assert DNS_LABEL.match(name)


def test_long_names_are_truncated_unique_and_keep_the_index() -> None:
    long_a, long_b = "a" * 80 + "x", "a" * 80 + "y"
    names = {container_name("app-12345678", r, i) for r in (long_a, long_b) for i in (0, 11)}
    assert len(names) == 4
    for n in names:
        assert len(n) <= 63 and DNS_LABEL.match(n), n
    assert container_name("app-12345678", long_a, 11).endswith("-11")


def test_app_id_is_a_short_dns_label() -> None:
    app_id = make_app_id("My Very_Long Application Name That Goes On And On", "ab12cd34")
    assert DNS_LABEL.match(app_id) and app_id.endswith("-ab12cd34") and len(app_id) <= 39


# ----------------------------------------------------------------------------- materialize
def test_ddp_2x2_materializes_one_container_per_replica() -> None:
    app = ddp("--lr", "0.1 x", script="train.py", j="2x2", image="xrun-python:latest", name="t")
    job = materialize(app, "t-abc", DockerOptions(shm_size="2g"))
    assert job.network == "t-abc"
    assert [c.name for c in job.containers] == ["t-abc-train-0", "t-abc-train-1"]
    for i, c in enumerate(job.containers):
        # Every replica finds the rendezvous host through the same env var: replica 0's name.
        assert c.env[RANK0_HOST_ENV] == "t-abc-train-0"
        assert c.command[:2] == ["sh", "-c"]
        assert "--rdzv-endpoint ${XRUN_RANK0_HOST}:${XRUN_RDZV_PORT:-29500}" in c.command[2]
        assert "--rdzv-id t-abc" in c.command[2]
        assert c.command[2].endswith("train.py --lr '0.1 x'")
        assert c.labels == {
            "xrun.app": "t",
            "xrun.app_id": "t-abc",
            "xrun.role": "train",
            "xrun.replica": str(i),
            "xrun.session": "default",
        }
        assert c.nano_cpus == 2_000_000_000 and c.mem_limit == "1024m" and c.shm_size == "2g"
        assert c.ports == [29500] and c.gpus == 0 and c.restart_policy() is None


def test_macros_env_mounts_resources_and_retries() -> None:
    role = _role(
        args=["${app_id}", "${replica_id}", "$$HOME"],
        env={"WHO": "${replica_id}", "A": "role"},
        num_replicas=2,
        max_retries=3,
        resource=Resource(cpu=-1, gpu=2, memMB=-1),
        mounts=[
            BindMount("/data", "/mnt/data", read_only=True),
            VolumeMount("vol", "/cache"),
            DeviceMount("/dev/fuse", "/dev/fuse", "rw"),
        ],
    )
    job = materialize(
        AppDef("x", [role]),
        "x-1",
        DockerOptions(env={"A": "cfg", "B": "cfg"}, copy_env=["XR_*"]),
        environ={"XR_TOKEN": "t", "A": "shell", "OTHER": "no"},
    )
    c = job.containers[1]
    assert c.command == ["echo", "x-1", "1", "$HOME"]
    # The role's own env beats the run option, which beats the copied shell env.
    assert c.env == {
        "WHO": "1",
        "A": "role",
        "B": "cfg",
        "XR_TOKEN": "t",
        RANK0_HOST_ENV: "x-1-worker-0",
        "TORCHX_RANK0_HOST": "x-1-worker-0",  # TorchX's name for it (gap N17)
        "XRUN_STOP_GRACE": "10",  # the stop_timeout: a graceful stop's grace (runtime/stopping.py)
    }
    assert c.mounts == [BindMount("/data", "/mnt/data", True), VolumeMount("vol", "/cache")]
    assert c.devices == ["/dev/fuse:/dev/fuse:rw"]
    assert c.nano_cpus is None and c.mem_limit is None and c.gpus == 2
    assert c.restart_policy() == {"Name": "on-failure", "MaximumRetryCount": 3}
    assert role.args[0] == "${app_id}"  # the AppDef itself is not touched


def test_roles_that_collide_after_sanitizing_are_rejected() -> None:
    app = AppDef("x", [_role(name="a_b"), _role(name="a.b")])
    with pytest.raises(UsageError, match="rename one of the roles"):
        materialize(app, "x-1", DockerOptions())


def test_dryrun_prints_docker_run_lines_without_sdk_or_engine(tmp_path: Path) -> None:
    """--dryrun needs neither the docker SDK nor an engine (the SDK import is lazy)."""
    code = textwrap.dedent(
        """
        import sys
        from xrun.components.dist import ddp
        from xrun.schedulers.docker import create_scheduler
        info = create_scheduler("s1").submit_dryrun(ddp(script="t.py", j="2x1"), {})
        assert "docker" not in sys.modules, "the docker SDK was imported"
        print(info)
        """
    )
    env = {**os.environ, "DOCKER_HOST": "unix:///nonexistent/docker.sock"}
    (tmp_path / "t.py").write_text("")  # the workspace (the cwd) holds the script (N11)
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        cwd=tmp_path,
    ).stdout
    assert out.count("docker run --detach --init") == 2
    assert "--env XRUN_RANK0_HOST=t-" in out and "--label xrun.session=s1" in out
    assert "--entrypoint sh" in out and "'exec python3 -m xrun.runtime" in out


def test_runopts_reject_unknown_keys_and_convert_strings() -> None:
    sched = DockerScheduler("default")
    with pytest.raises(UsageError, match="shm_size"):
        sched.run_opts().resolve({"shm_sise": "1g"}, "docker")
    cfg = sched.run_opts().resolve({"env": "A:1;B:2", "copy_env": "X_*,Y", "privileged": "yes"})
    assert cfg == DockerOptions(env={"A": "1", "B": "2"}, copy_env=["X_*", "Y"], privileged=True)
    assert cfg.shm_size == "1g" and cfg.stop_timeout == 10
    with pytest.raises(UsageError, match="run option env: env var name 'BAD-NAME' is invalid"):
        sched.run_opts().resolve({"env": "BAD-NAME:1"}, "docker")


def test_a_role_without_image_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="has no image"):
        DockerScheduler("default").submit_dryrun(AppDef("x", [_role(image="")]), {})


# ----------------------------------------------------------------------------- setup errors
def test_missing_sdk_is_a_usage_error_naming_the_extra() -> None:
    # The SDK is installed here; hiding it is the only way to see this path.
    code = textwrap.dedent(
        """
        import sys
        sys.modules["docker"] = None
        from xrun.errors import UsageError
        from xrun.schedulers.docker import create_scheduler
        try:
            create_scheduler("default").list()
        except UsageError as e:
            print(e)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert (
        out.stdout.strip()
        == "the docker scheduler needs the docker SDK: pip install 'xrun[docker]'"
    )


def test_unreachable_engine_is_one_line_naming_docker_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/xrun/docker.sock")
    with pytest.raises(UsageError) as e:
        DockerScheduler("default").describe("x-1")
    msg = str(e.value)
    assert "\n" not in msg
    assert (
        "unix:///nonexistent/xrun/docker.sock (DOCKER_HOST)" in msg and "docker-engine.sh up" in msg
    )


# ----------------------------------------------------------------------------- status rules
def _attrs(status: str, code: int = 0, restarts: int = 0, retries: int = 0) -> dict[str, object]:
    policy = {"Name": "on-failure", "MaximumRetryCount": retries} if retries else {"Name": ""}
    return {
        "State": {"Status": status, "ExitCode": code},
        "RestartCount": restarts,
        "HostConfig": {"RestartPolicy": policy},
    }


@pytest.mark.parametrize(
    ("attrs", "expected"),
    [
        (_attrs("created"), (AppState.PENDING, None)),
        (_attrs("running"), (AppState.RUNNING, None)),
        (_attrs("restarting"), (AppState.RUNNING, None)),
        (_attrs("exited", 0), (AppState.SUCCEEDED, 0)),
        (_attrs("exited", 1), (AppState.FAILED, 1)),
        (_attrs("dead", 137), (AppState.FAILED, 137)),
        # The engine is about to restart it: not a failure yet.
        (_attrs("exited", 1, restarts=1, retries=2), (AppState.RUNNING, 1)),
        (_attrs("exited", 1, restarts=2, retries=2), (AppState.FAILED, 1)),
    ],
)
def test_replica_state(attrs: dict[str, object], expected: tuple[AppState, int | None]) -> None:
    assert replica_state(attrs) == expected


def test_app_state_gang_rules() -> None:
    S = AppState

    def one_role(*states: AppState) -> list[tuple[str, AppState]]:
        return [("r", st) for st in states]

    assert app_state(one_role(S.SUCCEEDED, S.RUNNING), False) == S.RUNNING
    assert app_state(one_role(S.SUCCEEDED, S.SUCCEEDED), False) == S.SUCCEEDED
    assert app_state(one_role(S.FAILED, S.RUNNING), False) == S.FAILED
    assert app_state(one_role(S.PENDING, S.PENDING), False) == S.PENDING
    assert app_state(one_role(S.FAILED, S.RUNNING), True) == S.CANCELLED
    assert app_state([], False) == S.UNKNOWN


def test_app_state_lets_an_elastic_role_lose_replicas_down_to_its_minimum() -> None:
    S = AppState
    may_lose = {"trainer": 2}  # -j 1:3x..: 3 replicas, at least 1 must survive
    lost_two = [("trainer", S.FAILED), ("trainer", S.FAILED), ("trainer", S.RUNNING)]
    assert app_state(lost_two, False, may_lose) == S.RUNNING
    assert app_state([*lost_two[:2], ("trainer", S.SUCCEEDED)], False, may_lose) == S.SUCCEEDED
    assert app_state([*lost_two[:2], ("trainer", S.FAILED)], False, may_lose) == S.FAILED
    # The allowance is per role: another role's failure still fails the gang.
    assert app_state([*lost_two, ("ps", S.FAILED)], False, may_lose) == S.FAILED
    assert app_state(lost_two, False) == S.FAILED  # no allowance given: fixed-size rules


def test_only_an_elastic_role_gets_an_allowance_label() -> None:
    elastic = materialize(
        ddp(script="t.py", j="1:3x2", image="i:1", name="e"), "e-1", DockerOptions()
    )
    assert {c.labels.get("xrun.may_lose") for c in elastic.containers} == {"2"}
    assert "--label xrun.may_lose=2" in str(elastic)  # --dryrun shows it
    fixed = materialize(ddp(script="t.py", j="3x2", image="i:1", name="f"), "f-1", DockerOptions())
    assert all("xrun.may_lose" not in c.labels for c in fixed.containers)


# ----------------------------------------------------------------------------- state files
def test_saved_logs_merge_streams_by_time_and_filter_since_until(tmp_path: Path) -> None:
    store = StateDir(tmp_path)
    store.save_log(
        "a-1",
        "r",
        0,
        "stdout",
        b"2026-01-01T00:00:01.5Z out1\n2026-01-01T00:00:03.000000001Z out3\n",
    )
    store.save_log("a-1", "r", 0, "stderr", b"2026-01-01T00:00:02Z err2\n")
    lines = list(store.read_logs("a-1", "r", 0, ["stdout", "stderr"], None, None))
    assert lines == ["out1\n", "err2\n", "out3\n"]
    t2 = split_timestamp("2026-01-01T00:00:02Z x")[0]
    assert list(store.read_logs("a-1", "r", 0, ["stdout", "stderr"], t2, t2 + 0.5)) == ["err2\n"]
    assert list(store.read_logs("a-1", "r", 0, ["stderr"], None, None)) == ["err2\n"]


def test_split_timestamp_keeps_sub_second_precision() -> None:
    a = split_timestamp("2026-11-22T09:28:40.250000000Z hello world")
    b = split_timestamp("2026-11-22T09:28:40Z x")
    assert a[1] == "hello world" and abs(a[0] - b[0] - 0.25) < 1e-6


def test_a_path_like_app_id_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="malformed"):
        StateDir(tmp_path).load_final("../../etc")


def test_lines_reassembles_chunks_cut_anywhere() -> None:
    chunks = [b"ab", b"c\nde", b"f\n\ng", b"h"]
    assert list(split_lines(chunks)) == ["abc\n", "def\n", "\n", "gh\n"]


# ----------------------------------------------------------------------------- workspace
def _names(context: BuildContext) -> set[str]:
    with tarfile.open(fileobj=io.BytesIO(b"".join(context.chunks()))) as tar:
        return set(tar.getnames())


def test_build_context_has_workspace_and_xrun_but_no_caches(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("")
    for junk in (".git", "__pycache__", ".venv"):
        (tmp_path / junk).mkdir()
        (tmp_path / junk / "f").write_text("x")
    context, dockerfile = build_context(tmp_path)
    names = _names(context)
    assert dockerfile == "Dockerfile"
    assert {"workspace/train.py", "workspace/pkg/m.py", "Dockerfile"} <= names
    assert not any(
        n.startswith(("workspace/.git", "workspace/__pycache__", "workspace/.venv")) for n in names
    )
    # The whole installed package, sub-packages included, so `python3 -m xrun.runtime` imports.
    for mod in (
        "xrun/__init__.py",
        "xrun/errors.py",
        "xrun/runtime/__main__.py",
        "xrun/runtime/agent.py",
        "xrun/schedulers/api.py",
        "xrun/components/dist.py",
        # xrun.submit's worker loads a callable with cloudpickle, carried for images without
        "xrun/calls/worker.py",
        "xrun/_deps/cloudpickle/__init__.py",
        "xrun/_deps/cloudpickle/cloudpickle.py",
    ):
        assert mod in names
    assert not any("__pycache__" in n for n in names)
    assert "PYTHONPATH=/opt/xrun" in DEFAULT_DOCKERFILE


def test_image_tag_follows_content_and_base(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("1")
    ctx1 = build_context(tmp_path)[0].digest
    assert image_tag(ctx1, "b:1") == image_tag(build_context(tmp_path)[0].digest, "b:1")
    assert image_tag(ctx1, "b:1") != image_tag(ctx1, "b:2")
    (tmp_path / "a.py").write_text("2")
    assert image_tag(build_context(tmp_path)[0].digest, "b:1") != image_tag(ctx1, "b:1")


def test_dockerfile_xrun_replaces_the_recipe(tmp_path: Path) -> None:
    (tmp_path / "Dockerfile.xrun").write_text("ARG IMAGE\nFROM ${IMAGE}\n")
    context, dockerfile = build_context(tmp_path)
    assert dockerfile == "workspace/Dockerfile.xrun" and "Dockerfile" not in _names(context)


def test_workspace_must_be_a_directory(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="is not a directory"):
        build_context(tmp_path / "missing")


def test_a_huge_workspace_is_refused_before_reading_it(tmp_path: Path) -> None:
    big = tmp_path / "data.bin"
    with open(big, "wb") as f:
        f.truncate((1 << 30) + 1)  # sparse: costs no disk
    with pytest.raises(UsageError, match="more than 1024 MiB"):
        build_context(tmp_path)


# ----------------------------------------------------------------------------- reading containers
def _container(name: str, role: str, k: int, status: str, code: int) -> SimpleNamespace:
    """The three attributes of an SDK container object that docker/status.py reads."""
    return SimpleNamespace(
        name=name,
        labels={"xrun.role": role, "xrun.replica": str(k), "xrun.app": "a", "xrun.session": "s"},
        attrs={
            "State": {"Status": status, "ExitCode": code},
            "Config": {"Image": "img:1", "Entrypoint": ["sh"], "Cmd": ["-c", "x"]},
        },
    )


def test_statuses_and_end_message_of_a_gang_failure(tmp_path: Path) -> None:
    cs = [_container("a-1-r-1", "r", 1, "exited", 2), _container("a-1-r-0", "r", 0, "exited", 143)]
    roles = role_statuses(cs, stopped={"a-1-r-0"})
    assert [(r.id, r.state, r.exit_code) for r in roles[0].replicas] == [
        (0, AppState.CANCELLED, 143),  # stopped by xrun: not a failure of its own
        (1, AppState.FAILED, 2),
    ]
    store = StateDir(tmp_path)
    store.save_log(
        "a-1",
        "r",
        1,
        "stderr",
        b"2026-01-01T00:00:01Z Traceback\n2026-01-01T00:00:02Z KeyError: 'x'\n",
    )
    msg = end_message("a-1", AppState.FAILED, roles, store, containers_gone=False)
    assert (
        msg
        == "replica r/1 exited with code 2 (last stderr line: KeyError: 'x'); stopped the other 1 replica(s)"
    )


def test_job_record_rebuilt_from_containers() -> None:
    job = job_from_containers("a-1", [_container("a-1-r-1", "r", 1, "running", 0)])
    assert job == {
        "app_id": "a-1",
        "app_name": "a",
        "session": "s",
        "containers": [
            {
                "name": "a-1-r-1",
                "role": "r",
                "replica_id": 1,
                "image": "img:1",
                "command": ["sh", "-c", "x"],
            }
        ],
    }


def test_stop_timeout_run_option_is_in_the_request_and_validated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("")  # the workspace (the cwd) holds the script (N11)
    app = ddp(script="t.py", j="1x1", image="img")
    sched = DockerScheduler("s")
    job = sched.submit_dryrun(app, {"stop_timeout": "45"}).request
    assert [c.stop_timeout for c in job.containers] == [45]
    assert "--stop-timeout 45" in str(sched.submit_dryrun(app, {"stop_timeout": 45}))
    assert sched.submit_dryrun(app, {}).request.containers[0].stop_timeout == 10
    with pytest.raises(UsageError, match="stop_timeout=-1"):
        sched.submit_dryrun(app, {"stop_timeout": -1})


# ------------------------------------------------------------ an engine that does not answer
# A real engine that accepts connections and never answers cannot be had on demand; this one
# speaks just enough HTTP on a unix socket: it answers the endpoints named in `answers` and
# holds every other request forever. Before the fix, `xrun list -s docker` against it waited
# the SDK's 60 s and printed a requests ReadTimeout traceback.
_ANSWERS = {
    b"/_ping": b"OK",
    b"/version": b'{"ApiVersion": "1.41", "Version": "20.10.24"}',
}


def _serve_fake_engine(path: str, answers: set[bytes]):  # type: ignore[no-untyped-def]
    import socket
    import threading

    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(16)

    def serve(conn: socket.socket) -> None:
        buf = b""
        with conn:
            while data := conn.recv(65536):
                buf += data
                while b"\r\n\r\n" in buf:
                    head, buf = buf.split(b"\r\n\r\n", 1)
                    target = head.split(b" ")[1].split(b"?")[0]
                    name = b"/" + target.rsplit(b"/", 1)[-1]
                    if name not in answers:
                        continue  # held forever
                    body = _ANSWERS[name]
                    conn.sendall(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nApi-Version: 1.41\r\n"
                        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
                    )

    def accept() -> None:
        with contextlib.suppress(OSError):  # closed at teardown
            while True:
                threading.Thread(target=serve, args=(srv.accept()[0],), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return srv


@pytest.fixture
def fake_engine(tmp_path: Path, monkeypatch):  # type: ignore[no-untyped-def]
    from xrun.schedulers.docker import engine

    monkeypatch.setattr(engine, "TIMEOUT_S", 0.5)
    servers = []

    def start(answers: set[bytes]) -> None:
        path = str(tmp_path / "engine.sock")
        servers.append(_serve_fake_engine(path, answers))
        monkeypatch.setenv("DOCKER_HOST", f"unix://{path}")

    yield start
    for srv in servers:
        srv.close()


def test_an_engine_that_stops_answering_mid_command_is_one_line(fake_engine, capsys) -> None:  # type: ignore[no-untyped-def]
    import time

    from xrun.cli import main

    fake_engine({b"/_ping", b"/version"})  # connects, then `containers/json` is never answered
    t0 = time.monotonic()
    rc = main(["list", "-s", "docker"])
    err = capsys.readouterr().err
    assert rc == 1, err
    assert time.monotonic() - t0 < 10
    assert "Traceback" not in err and err.count("\n") == 1
    assert "xrun: error: the Docker Engine at unix://" in err
    assert "did not answer within 0.5 s" in err and "docker info" in err


def test_an_engine_that_never_answers_its_ping_is_the_no_engine_error(fake_engine, capsys) -> None:  # type: ignore[no-untyped-def]
    from xrun.cli import main

    fake_engine({b"/version"})  # the SDK's version probe is answered, the ping is not
    rc = main(["list", "-s", "docker"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err and err.count("\n") == 1
    assert "cannot reach the Docker Engine at unix://" in err and "timed out" in err
