"""The docker scheduler against the real Docker Engine the suite starts (tests/helpers/docker.py).

Every job runs in ``xrun-python:latest`` (Debian + python3, no pip) or in a workspace image
built on it; status/logs/cancel/list from "another shell" go through the real ``xrun`` console
script in a subprocess.
"""

# ruff: noqa: F811  (the docker_engine fixture is imported, then named by the tests)
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

# Until tests/conftest.py imports it for the whole suite.
from tests.helpers.docker import docker_engine  # noqa: F401
from tests.helpers.paths import XRUN
from xrun.components.dist import ddp
from xrun.errors import AppNotFoundError, SchedulerError, UsageError
from xrun.schedulers.api import Stream
from xrun.schedulers.docker import DockerScheduler
from xrun.schedulers.docker.statedir import default_root
from xrun.specs import AppDef, AppState, BindMount, Resource, Role, VolumeMount

# 300 s: the first test also pays for the one-time engine install and image build (~40-80 s).
pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]


# Ranks check their env, then all of them exchange a value with rank 0 over TCP (the agent
# needs no torch, so neither does this): rank 0 sums the others' ranks and sends the sum back.
WORKER = textwrap.dedent(
    """
    import os, socket, sys, time
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local, group = int(os.environ["LOCAL_RANK"]), int(os.environ["GROUP_RANK"])
    assert rank == group * int(os.environ["LOCAL_WORLD_SIZE"]) + local, os.environ
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]) + 1
    if rank == 0:
        srv = socket.create_server(("", port))
        conns = [srv.accept()[0] for _ in range(world - 1)]
        total = sum(int(c.recv(64)) for c in conns)
        for c in conns:
            c.sendall(str(total).encode())
    else:
        deadline = time.monotonic() + 60
        while True:
            try:
                conn = socket.create_connection((addr, port), timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        conn.sendall(str(rank).encode())
        total = int(conn.recv(64))
    print(f"rank {rank}/{world} on {socket.gethostname()} got {total}", flush=True)
    sys.exit(0 if total == sum(range(1, world)) else 3)
    """
)


@pytest.fixture(scope="module")
def sched(docker_engine: str) -> Iterator[DockerScheduler]:
    s = DockerScheduler("default")
    yield s
    s.close()


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ws = tmp_path_factory.mktemp("ws")
    (ws / "worker.py").write_text(WORKER)
    return ws


def _xrun(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """The real console script, as another shell would run it (same XDG_STATE_HOME)."""
    return subprocess.run([XRUN, *args], capture_output=True, text=True, timeout=60, check=check)


def _leftovers(app_id: str) -> list[str]:
    import docker

    client = docker.from_env()
    try:
        label = {"label": f"xrun.app_id={app_id}"}
        # sparse: the listing alone, no inspect per container (one removed between the two by
        # the app's finaliser would be a 404 here, not a leftover)
        containers = client.containers.list(all=True, filters=label, sparse=True)
        return [c.attrs["Names"][0].lstrip("/") for c in containers] + [
            n.name for n in client.networks.list(filters=label)
        ]
    finally:
        client.close()


def _plain(name: str, image: str, *scripts: str) -> AppDef:
    """One role whose replica i runs ``sh -c scripts[i]``."""
    cmd = (
        "case ${replica_id} in " + " ".join(f"{i}) {s};;" for i, s in enumerate(scripts)) + " esac"
    )
    return AppDef(name, [Role("r", image, "sh", ["-c", cmd], num_replicas=len(scripts))])


def test_ddp_2x2_of_xrun_runtime_across_two_containers(
    sched: DockerScheduler, workspace: Path
) -> None:
    app = ddp(script="worker.py", j="2x2", image="xrun-python:latest", name="ddp")
    t0 = time.monotonic()
    app_id = sched.submit(app, {}, workspace=str(workspace))
    assert app.roles[0].image.startswith("xrun-workspace:")  # the workspace image was built
    resp = sched.wait(app_id, timeout=90)
    elapsed = time.monotonic() - t0
    assert resp is not None and resp.state == AppState.SUCCEEDED, resp
    reps = resp.roles_statuses[0].replicas
    assert [(r.id, r.state, r.exit_code) for r in reps] == [
        (0, AppState.SUCCEEDED, 0),
        (1, AppState.SUCCEEDED, 0),
    ]
    # Ranks 0,1 ran in replica 0's container, 2,3 in replica 1's; all agreed on the sum.
    for k, ranks in ((0, (0, 1)), (1, (2, 3))):
        text = "".join(sched.log_iter(app_id, "worker", k))
        for r in ranks:
            assert f"rank {r}/4 on {app_id}-worker-{k} got 6" in text, text
    # Another process sees the same end, through the real CLI.
    out = _xrun("status", f"docker://default/{app_id}").stdout
    assert "State: SUCCEEDED" in out and f"worker/1: SUCCEEDED host={app_id}-worker-1" in out
    assert _leftovers(app_id) == []
    print(f"2x2 ddp on docker: submit to SUCCEEDED in {elapsed:.1f}s")


def test_a_failing_replica_fails_the_app_and_stops_the_others(
    sched: DockerScheduler,
    docker_engine: str,
) -> None:
    app = _plain("gang", docker_engine, "sleep 300", "echo boom >&2; exit 3")
    app_id = sched.submit(app, {}, workspace="")
    t0 = time.monotonic()
    resp = sched.wait(app_id, timeout=60)
    assert resp is not None and resp.state == AppState.FAILED, resp
    # init=True: the sleeping replica stops on SIGTERM at once, not after the 10 s timeout.
    assert time.monotonic() - t0 < 8
    reps = {r.id: r for r in resp.roles_statuses[0].replicas}
    assert (reps[1].state, reps[1].exit_code) == (AppState.FAILED, 3)
    assert reps[0].state == AppState.CANCELLED
    assert "replica r/1 exited with code 3 (last stderr line: boom)" in resp.msg
    assert _leftovers(app_id) == []
    # The record outlives the containers: the same answer later, from another process.
    assert "State: FAILED" in _xrun("status", f"docker://default/{app_id}").stdout
    assert list(sched.log_iter(app_id, "r", 1)) == ["boom\n"]


def test_cancel_from_another_process_ends_cancelled(
    sched: DockerScheduler,
    docker_engine: str,
) -> None:
    app_id = sched.submit(_plain("cancelme", docker_engine, "sleep 300", "sleep 300"), {}, "")
    handle = f"docker://default/{app_id}"
    assert sched.describe(app_id).state in (AppState.PENDING, AppState.RUNNING)  # type: ignore[union-attr]
    assert "State: RUNNING" in _xrun("status", handle).stdout
    # As if submitted from another machine (no job.json here): the roles come from the labels.
    (default_root() / app_id / "job.json").unlink()
    roles = sched.describe(app_id).roles  # type: ignore[union-attr]
    assert [(r.name, r.num_replicas, r.entrypoint) for r in roles] == [("r", 2, "sh")]
    _xrun("cancel", handle)
    resp = sched.describe(app_id)
    assert resp is not None and resp.state == AppState.CANCELLED, resp
    assert {r.state for r in resp.roles_statuses[0].replicas} == {AppState.CANCELLED}
    assert _leftovers(app_id) == []
    assert [r.num_replicas for r in resp.roles] == [2]  # kept for `xrun log` after cleanup
    sched.cancel(app_id)  # idempotent
    assert sched.describe(app_id).state == AppState.CANCELLED  # type: ignore[union-attr]


def test_unknown_app_is_not_found(sched: DockerScheduler) -> None:
    assert sched.describe("nope-00000000") is None
    assert not sched.exists("nope-00000000")
    with pytest.raises(AppNotFoundError):
        sched.cancel("nope-00000000")
    with pytest.raises(AppNotFoundError):
        list(sched.log_iter("nope-00000000", "r", 0))
    proc = _xrun("status", "docker://default/nope-00000000", check=False)
    assert proc.returncode != 0 and "State: SUCCEEDED" not in proc.stdout


def test_logs_follow_a_running_replica_per_stream(
    sched: DockerScheduler,
    docker_engine: str,
) -> None:
    app = _plain(
        "logs",
        docker_engine,
        "for i in 1 2 3; do echo out$i; sleep 0.1; echo err$i >&2; sleep 0.2; done",
        "echo other",
    )
    app_id = sched.submit(app, {}, workspace="")
    # Followed while it runs: ends by itself when the replica does, with every line.
    followed = list(sched.log_iter(app_id, "r", 0, should_tail=True, streams=Stream.STDOUT))
    assert followed == ["out1\n", "out2\n", "out3\n"]
    assert list(sched.log_iter(app_id, "r", 0, regex="^err[13]", streams=Stream.STDERR)) == [
        "err1\n",
        "err3\n",
    ]
    assert sched.wait(app_id, timeout=30).state == AppState.SUCCEEDED  # type: ignore[union-attr]
    assert _leftovers(app_id) == []
    # After cleanup the logs come from the state dir, still per stream and in order.
    combined = list(sched.log_iter(app_id, "r", 0))
    assert combined == ["out1\n", "err1\n", "out2\n", "err2\n", "out3\n", "err3\n"]
    cli = _xrun("log", f"docker://default/{app_id}/r/1").stdout
    assert cli.strip().endswith("other")
    with pytest.raises(UsageError, match="no replica r/5"):
        list(sched.log_iter(app_id, "r", 5))


def test_list_shows_running_and_finished_apps(
    sched: DockerScheduler,
    docker_engine: str,
) -> None:
    done = sched.submit(_plain("listdone", docker_engine, "true"), {}, "")
    assert sched.wait(done, timeout=30).state == AppState.SUCCEEDED  # type: ignore[union-attr]
    running = sched.submit(_plain("listrun", docker_engine, "sleep 300"), {}, "")
    try:
        states = {a.app_id: (a.state, a.name, a.app_handle) for a in sched.list()}
        assert states[done] == (AppState.SUCCEEDED, "listdone", f"docker://default/{done}")
        assert states[running][0] in (AppState.PENDING, AppState.RUNNING)
        out = _xrun("list", "-s", "docker").stdout
        assert f"docker://default/{done}" in out and f"docker://default/{running}" in out
    finally:
        sched.cancel(running)
    assert _leftovers(running) == []


def test_missing_image_that_cannot_be_pulled_is_a_usage_error(sched: DockerScheduler) -> None:
    # A registry on a closed local port: the pull fails at once instead of timing out.
    app = _plain("noimg", "127.0.0.1:9/xrun/none:1", "true")
    with pytest.raises(UsageError, match="is not on the Docker Engine and pulling it failed"):
        sched.submit(app, {}, workspace="")


def test_run_and_wait_through_the_cli(docker_engine: str, workspace: Path) -> None:
    """`xrun run -s docker --wait` from the workspace (the default --workspace is the cwd)."""
    proc = subprocess.run(
        [XRUN, "run", "-s", "docker", "--wait", "dist.ddp", "-j", "2x1", "--script", "worker.py"],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=workspace,
    )
    assert proc.returncode == 0, proc.stderr
    handle = proc.stdout.strip()
    assert handle.startswith("docker://default/worker-") and "ended SUCCEEDED" in proc.stderr
    log = _xrun("log", handle).stdout
    assert "rank 1/2 on" in log and "got 1" in log


def test_concurrent_describes_finalize_once(
    sched: DockerScheduler, docker_engine: str, no_watcher: None
) -> None:
    import docker

    app_id = sched.submit(_plain("race", docker_engine, "echo a", "echo b"), {}, "")
    client = docker.from_env()
    label = {"label": f"xrun.app_id={app_id}"}
    deadline = time.monotonic() + 30
    # Both replicas end with nobody asking (no watcher either); then several processes ask at once.
    while {c.status for c in client.containers.list(all=True, filters=label)} != {"exited"}:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    client.close()
    others = [DockerScheduler("default") for _ in range(4)]
    results: list[object] = []
    errors: list[BaseException] = []

    def ask(s: DockerScheduler) -> None:
        try:
            results.append(s.describe(app_id).state)  # type: ignore[union-attr]
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=ask, args=(s,)) for s in others]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and results == [AppState.SUCCEEDED] * 4
    assert list(sched.log_iter(app_id, "r", 1)) == ["b\n"]
    assert _leftovers(app_id) == []
    for s in others:
        s.close()


@pytest.fixture
def volume() -> Iterator[str]:
    """A named volume's name; the volume (created by the engine on first use) is removed after."""
    import docker

    name = f"xrun-test-{os.getpid()}-{time.monotonic_ns()}"
    yield name
    client = docker.from_env()
    try:
        client.volumes.get(name).remove(force=True)
    except docker.errors.NotFound:
        pass
    finally:
        client.close()


def test_the_container_spec_is_applied(
    sched: DockerScheduler, docker_engine: str, tmp_path: Path, volume: str
) -> None:
    """Env, a read-only bind mount, a volume, memory and /dev/shm limits (peers resolving each
    other by name: the 2x2 test, whose ranks connect to MASTER_ADDR = replica 0's name)."""
    (tmp_path / "hello.txt").write_text("from the host")
    check = (
        "cat /in/hello.txt; echo; (touch /in/x 2>/dev/null && echo rw) || echo ro; "
        "echo vol > /vol/f && cat /vol/f; echo FOO=$FOO; echo R0=$XRUN_RANK0_HOST; "
        "cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max; "
        "df -k /dev/shm | tail -1; echo T=$XRUN_RDZV_TOKEN"
    )
    role = Role(
        "spec",
        docker_engine,
        "sh",
        ["-c", check],
        env={"FOO": "bar ${replica_id}"},
        num_replicas=2,
        resource=Resource(cpu=1, gpu=0, memMB=256),
        mounts=[
            BindMount(str(tmp_path), "/in", read_only=True),
            VolumeMount(volume, "/vol"),
        ],
    )
    app_id = sched.submit(AppDef("spec", [role]), {"shm_size": "128m"}, workspace="")
    resp = sched.wait(app_id, timeout=30)
    logs = {k: [x.rstrip("\n") for x in sched.log_iter(app_id, "spec", k)] for k in (0, 1)}
    assert resp is not None and resp.state == AppState.SUCCEEDED, (resp.msg if resp else None, logs)
    lines = [line.rstrip("\n") for line in sched.log_iter(app_id, "spec", 1, streams=Stream.STDOUT)]
    assert lines[:6] == [
        "from the host",
        "ro",
        "vol",
        "FOO=bar 1",
        f"R0={app_id}-spec-0",
        str(256 << 20),
    ]
    assert lines[6].split()[1] == str(128 * 1024)  # /dev/shm size in KiB
    # One rendezvous secret per app, in every replica, made at schedule time (not in the request).
    tokens = {[x for x in logs[k] if x.startswith("T=")][0] for k in (0, 1)}
    assert len(tokens) == 1 and re.fullmatch(r"T=[0-9a-f]{32}", tokens.pop())


def test_max_retries_restarts_a_failed_replica(
    sched: DockerScheduler,
    docker_engine: str,
) -> None:
    # Fails the first time only: the container's own filesystem survives a restart.
    once = "if [ -e /tmp/ran ]; then echo second; else touch /tmp/ran; echo first; exit 1; fi"
    role = Role("r", docker_engine, "sh", ["-c", once], max_retries=2)
    app_id = sched.submit(AppDef("retry", [role]), {}, workspace="")
    resp = sched.wait(app_id, timeout=30)
    assert resp is not None and resp.state == AppState.SUCCEEDED, resp
    assert resp.num_restarts == 1
    assert [line.strip() for line in sched.log_iter(app_id, "r", 0)] == ["first", "second"]


def test_a_refused_start_leaves_nothing_behind(
    sched: DockerScheduler,
    docker_engine: str,
) -> None:
    role = Role(
        "r",
        docker_engine,
        "true",
        num_replicas=2,
        mounts=[BindMount("/nonexistent/xrun/data", "/data")],
    )
    with pytest.raises(SchedulerError, match="nonexistent/xrun/data") as e:
        sched.submit(AppDef("refused", [role]), {}, workspace="")
    app_id = re.search(r"app (refused-[a-z0-9]+)", str(e.value)).group(1)  # type: ignore[union-attr]
    assert _leftovers(app_id) == [] and sched.describe(app_id) is None


def test_dockerfile_xrun_replaces_the_recipe_and_a_broken_one_is_a_usage_error(
    sched: DockerScheduler, docker_engine: str, tmp_path: Path
) -> None:
    (tmp_path / "job.sh").write_text("echo custom=$CUSTOM; ls /opt/xrun/xrun/runtime/agent.py\n")
    (tmp_path / "Dockerfile.xrun").write_text(
        "ARG IMAGE\nFROM ${IMAGE}\nENV CUSTOM=yes\nCOPY xrun /opt/xrun/xrun\n"
        "COPY workspace /code\nWORKDIR /code\n"
    )
    app = AppDef("custom", [Role("r", docker_engine, "sh", ["job.sh"])])
    app_id = sched.submit(app, {}, workspace=str(tmp_path))
    assert sched.wait(app_id, timeout=30).state == AppState.SUCCEEDED  # type: ignore[union-attr]
    assert [x.strip() for x in sched.log_iter(app_id, "r", 0)] == [
        "custom=yes",
        "/opt/xrun/xrun/runtime/agent.py",
    ]
    (tmp_path / "Dockerfile.xrun").write_text("ARG IMAGE\nFROM ${IMAGE}\nCOPY missing-dir /x\n")
    app = AppDef("custom", [Role("r", docker_engine, "sh", ["job.sh"])])
    with pytest.raises(UsageError, match=r"building the workspace image .* fix Dockerfile\.xrun"):
        sched.submit(app, {}, workspace=str(tmp_path))


def test_old_workspace_images_are_pruned_but_shared_layers_stay(docker_engine: str) -> None:
    import docker

    from xrun.schedulers.docker.engine import prune_workspace_images

    client = docker.from_env()
    try:
        # A tag of the base image: older than every image built on it, so it goes first. Keep
        # exactly the workspace images newer than the base (on a reused machine some may be
        # older: built on an earlier base image before it was rebuilt; those go too).
        base = client.images.get(docker_engine)
        tag = f"xrun-workspace:prune-test-{os.getpid()}"
        base.tag(tag)
        created = str(base.attrs["Created"])
        newer = [
            im
            for im in client.images.list(name="xrun-workspace")
            if str(im.attrs["Created"]) > created
        ]
        prune_workspace_images(client, keep=len(newer))
        tags = {t for im in client.images.list() for t in im.tags}
        assert tag not in tags and docker_engine in tags  # only the tag went
    finally:
        client.close()


@pytest.mark.timeout(120)
def test_gang_semantics_hold_with_nobody_watching(docker_engine: str) -> None:
    """Submitted from a process that exits at once (like `xrun run -s docker` without --wait):
    the detached watcher still stops the survivors of a failed replica and cleans up."""
    code = textwrap.dedent(f"""
        from xrun.schedulers.docker import DockerScheduler
        from xrun.specs import AppDef, Role
        cmd = "case ${{replica_id}} in 0) sleep 300;; 1) sleep 1; exit 5;; esac"
        app = AppDef("unwatched", [Role("r", {docker_engine!r}, "sh", ["-c", cmd], num_replicas=2)])
        print(DockerScheduler("default").submit(app, {{}}, workspace=""))
    """)
    app_id = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    ).stdout.strip()
    deadline = time.monotonic() + 60
    while _leftovers(app_id) and time.monotonic() < deadline:
        time.sleep(0.5)  # nobody here calls describe(): only the watcher can reconcile
    assert _leftovers(app_id) == [], "the sleeping replica was not stopped, nor cleaned up"
    resp = DockerScheduler("default").describe(app_id)  # read from the recorded final status
    assert resp is not None and resp.state == AppState.FAILED
    codes = {r.id: (r.state, r.exit_code) for r in resp.roles_statuses[0].replicas}
    assert codes[1] == (AppState.FAILED, 5)
    assert codes[0][0] == AppState.CANCELLED


def test_an_elastic_role_loses_a_replica_and_the_survivor_finishes(
    sched: DockerScheduler, docker_engine: str
) -> None:
    # min_replicas=1 of 2: replica 1's failure is within the allowance, so replica 0 is not
    # stopped; it finishes on its own and the app succeeds, as on local_cwd.
    cmd = "case ${replica_id} in 0) sleep 3; echo done;; 1) echo lost >&2; exit 3;; esac"
    app = AppDef(
        "elastic", [Role("r", docker_engine, "sh", ["-c", cmd], num_replicas=2, min_replicas=1)]
    )
    app_id = sched.submit(app, {}, workspace="")
    resp = sched.wait(app_id, timeout=60)
    assert resp is not None and resp.state == AppState.SUCCEEDED, resp
    reps = {r.id: (r.state, r.exit_code) for r in resp.roles_statuses[0].replicas}
    assert reps == {0: (AppState.SUCCEEDED, 0), 1: (AppState.FAILED, 3)}
    assert "replica r/1 exited with code 3 (last stderr line: lost)" in resp.msg
    assert "went on with fewer replicas" in resp.msg
    assert list(sched.log_iter(app_id, "r", 0)) == ["done\n"]
    assert _leftovers(app_id) == []


ELASTIC_WORKER = textwrap.dedent(
    """
    import os, time
    world = int(os.environ["WORLD_SIZE"])
    print(f"up at world {world}", flush=True)
    if world == 2:
        time.sleep(120)  # until the test kills the other replica's container
    print("finished at world 1", flush=True)
    """
)


@pytest.mark.timeout(180)
def test_elastic_ddp_goes_on_after_a_container_is_killed(
    sched: DockerScheduler, tmp_path: Path
) -> None:
    """``dist.ddp -j 1:2x1``: SIGKILL one replica's container (not the rendezvous host's).
    xrun's runtime in the other re-forms the group at world size 1 and finishes; the app ends
    SUCCEEDED with the killed replica FAILED (137)."""
    import docker

    (tmp_path / "worker.py").write_text(ELASTIC_WORKER)
    app = ddp(
        script="worker.py",
        j="1:2x1",
        image="xrun-python:latest",
        name="el",
        rdzv_conf="last_call_timeout=1",
    )
    app_id = sched.submit(app, {}, workspace=str(tmp_path))

    def survivor_log() -> str:
        return "".join(sched.log_iter(app_id, "worker", 0))

    deadline = time.monotonic() + 90
    while "up at world 2" not in survivor_log():
        assert time.monotonic() < deadline, survivor_log()
        time.sleep(0.5)
    client = docker.from_env()
    try:
        client.containers.get(f"{app_id}-worker-1").kill()
    finally:
        client.close()
    resp = sched.wait(app_id, timeout=90)
    assert resp is not None and resp.state == AppState.SUCCEEDED, resp
    reps = {r.id: (r.state, r.exit_code) for r in resp.roles_statuses[0].replicas}
    assert reps == {0: (AppState.SUCCEEDED, 0), 1: (AppState.FAILED, 137)}
    text = survivor_log()
    assert text.index("up at world 2") < text.index("finished at world 1"), text
    assert _leftovers(app_id) == []
