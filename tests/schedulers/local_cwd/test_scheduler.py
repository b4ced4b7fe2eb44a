"""local_cwd through the Scheduler API, with real processes (no xrun CLI, no torch).

Every "second process" here is a fresh interpreter that only knows the app id: it finds the app
through the per-user index, as ``xrun status/log/cancel`` from another shell would.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.helpers.waiting import wait_for
from xrun.contract import RANK0_HOST_ENV
from xrun.errors import AppNotFoundError, UsageError
from xrun.procs import is_alive
from xrun.schedulers.api import Stream, get_scheduler
from xrun.schedulers.local_cwd import (
    LocalCwdScheduler,
    assign_gpus,
    create_scheduler,
)
from xrun.specs import AppDef, AppState, Resource, Role


@pytest.fixture
def sched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LocalCwdScheduler:
    monkeypatch.chdir(tmp_path)
    return create_scheduler("test")


def _cfg(tmp_path: Path, **extra: object) -> dict[str, object]:
    return {"log_dir": str(tmp_path / "logs"), **extra}


def _sh(script: str, n: int = 1, name: str = "w") -> AppDef:
    return AppDef(
        "t", [Role(name, image="unused", entrypoint="sh", args=["-c", script], num_replicas=n)]
    )


def _other_process(code: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a new interpreter, cwd / (not the app's), with the scheduler as ``s``."""
    prelude = (
        "from xrun.schedulers.local_cwd import create_scheduler\ns = create_scheduler('other')\n"
    )
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# --------------------------------------------------------------------------- dry run (a value)
def test_dryrun_substitutes_macros_and_sets_env(sched: LocalCwdScheduler, tmp_path: Path) -> None:
    role = Role(
        "trainer",
        image="ignored",
        entrypoint="echo",
        args=["${app_id}", "${replica_id}", "${img_root}", "${${rank0_env}}", "$$HOME"],
        env={"MINE": "r${replica_id}"},
        num_replicas=2,
    )
    info = sched.submit_dryrun(AppDef("My App!", [role]), _cfg(tmp_path, prepend_cwd=True))
    req = info.request
    assert req.app_id.startswith("my-app-")
    assert req.app_dir == str(tmp_path / "logs" / req.app_id)
    for i, rep in enumerate(req.replicas):
        assert rep.argv == [
            "echo",
            req.app_id,
            str(i),
            str(tmp_path),
            "${XRUN_RANK0_HOST}",
            "$HOME",
        ]
        assert rep.env["MINE"] == f"r{i}"
        assert rep.env[RANK0_HOST_ENV] == "localhost"
        assert rep.env["PYTHONUNBUFFERED"] == "1"
        assert rep.env["TORCHELASTIC_ERROR_FILE"] == f"{req.app_dir}/trainer/{i}/error.json"
        path = rep.env["PATH"].split(os.pathsep)
        assert path[:2] == [os.path.dirname(sys.executable), str(tmp_path)]
        assert rep.stdout == f"{req.app_dir}/trainer/{i}/stdout.log"
    assert role.args[0] == "${app_id}", "the AppDef must not be mutated"
    text = str(info)
    assert "echo " + req.app_id + " 1 " in text and "XRUN_RANK0_HOST=localhost" in text
    assert not (tmp_path / "logs").exists(), "a dry run has no side effects"


def test_dryrun_rejects_missing_entrypoint_and_bad_options(sched: LocalCwdScheduler) -> None:
    app = AppDef("t", [Role("w", image="", entrypoint="no-such-command-xyz")])
    with pytest.raises(UsageError, match="no-such-command-xyz.*not an executable"):
        sched.submit_dryrun(app, {})
    with pytest.raises(UsageError, match="unknown run option 'log_dri'.*did you mean 'log_dir'"):
        sched.submit_dryrun(_sh("true"), {"log_dri": "/tmp"})
    with pytest.raises(UsageError, match="stop_grace_s=-1"):
        sched.submit_dryrun(_sh("true"), {"stop_grace_s": "-1"})


def test_runopts_are_typed_and_documented() -> None:
    text = str(get_scheduler("local_cwd").run_opts())
    for name in (
        "log_dir (str",
        "prepend_cwd (bool",
        "auto_set_cuda_visible_devices (bool",
        "stop_grace_s (float",
    ):
        assert name in text
    assert "~/.local/state/xrun/local_cwd/logs" in text


def test_assign_gpus_splits_by_resource_and_is_a_noop_without_gpus() -> None:
    roles = [
        Role("a", image="", entrypoint="x", num_replicas=2, resource=Resource(1, 2, 100)),
        Role("b", image="", entrypoint="x", num_replicas=1, resource=Resource(1, 0, 100)),
        Role("c", image="", entrypoint="x", num_replicas=1, resource=Resource(1, 1, 100)),
    ]
    got = assign_gpus(roles, ["0", "1", "2", "3", "4"])
    assert got == {("a", 0): ["0", "1"], ("a", 1): ["2", "3"], ("c", 0): ["4"]}
    assert assign_gpus(roles, []) == {}
    with pytest.raises(UsageError, match="asks for 5 GPUs.*has 4 visible"):
        assign_gpus(roles, ["0", "1", "2", "3"])


def test_auto_set_cuda_visible_devices_splits_the_visible_gpus(
    sched: LocalCwdScheduler, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    role = Role("w", image="", entrypoint="true", num_replicas=2, resource=Resource(1, 2, 100))
    app = AppDef("t", [role])
    info = sched.submit_dryrun(app, _cfg(tmp_path, auto_set_cuda_visible_devices=True))
    assert [r.env["CUDA_VISIBLE_DEVICES"] for r in info.request.replicas] == ["4,5", "6,7"]
    off = sched.submit_dryrun(app, _cfg(tmp_path))
    assert all("CUDA_VISIBLE_DEVICES" not in r.env for r in off.request.replicas)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPUs: a no-op, not an error
    none = sched.submit_dryrun(app, _cfg(tmp_path, auto_set_cuda_visible_devices=True))
    assert all("CUDA_VISIBLE_DEVICES" not in r.env for r in none.request.replicas)


# --------------------------------------------------------------------------- real runs
def test_replicas_get_cwd_env_python_and_private_log_layout(
    sched: LocalCwdScheduler, tmp_path: Path
) -> None:
    dump = (
        "import json, os, sys; "
        "json.dump({'cwd': os.getcwd(), 'prefix': sys.prefix, 'argv': sys.argv[1:], "
        "'env': dict(os.environ)}, open('out-${replica_id}.json', 'w')); print('hello ${replica_id}')"
    )
    app = AppDef(
        "t",
        [Role("w", image="", entrypoint="python3", args=["-c", dump, "${app_id}"], num_replicas=2)],
    )
    app_id = sched.submit(app, _cfg(tmp_path))
    resp = sched.wait(app_id, timeout=30)
    assert resp is not None and resp.state == AppState.SUCCEEDED, resp
    assert [r.exit_code for r in resp.roles_statuses[0].replicas] == [0, 0]
    for i in range(2):
        out = json.loads((tmp_path / f"out-{i}.json").read_text())
        assert out["cwd"] == str(tmp_path)
        assert out["prefix"] == sys.prefix, "python3 must be xrun's own interpreter"
        assert out["argv"] == [app_id]
        assert out["env"][RANK0_HOST_ENV] == "localhost" and out["env"]["PYTHONUNBUFFERED"] == "1"
        assert out["env"]["TORCHX_RANK0_HOST"] == "localhost"  # TorchX's name (gap N17)
        rdir = tmp_path / "logs" / app_id / "w" / str(i)
        assert out["env"]["TORCHELASTIC_ERROR_FILE"] == str(rdir / "error.json")
        assert (rdir / "stdout.log").read_text() == f"hello {i}\n"
        assert stat.S_IMODE((rdir / "stdout.log").stat().st_mode) == 0o600
        assert stat.S_IMODE((rdir / "stderr.log").stat().st_mode) == 0o600
        assert stat.S_IMODE(rdir.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "logs" / app_id).stat().st_mode) == 0o700
    # One fresh rendezvous secret per app, shared by its replicas, never shown by --dryrun.
    tokens = {
        json.loads((tmp_path / f"out-{i}.json").read_text())["env"]["XRUN_RDZV_TOKEN"]
        for i in range(2)
    }
    assert len(tokens) == 1 and len(tokens.pop()) == 32
    assert "XRUN_RDZV_TOKEN" not in str(sched.submit_dryrun(app, _cfg(tmp_path)))


@pytest.mark.timeout(60)
def test_gang_failure_stops_siblings_and_their_children(
    sched: LocalCwdScheduler, tmp_path: Path
) -> None:
    # Replica 0 runs forever (with a child of its own); replica 1 fails once 0 has started.
    script = (
        "if [ ${replica_id} = 0 ]; then sleep 300 & echo $! > child.pid; wait; fi; "
        "while [ ! -s child.pid ]; do sleep 0.01; done; echo boom >&2; exit 3"
    )
    t0 = time.monotonic()
    app_id = sched.submit(_sh(script, n=2), _cfg(tmp_path, stop_grace_s=5))
    resp = sched.wait(app_id, timeout=30)
    assert resp is not None and resp.state == AppState.FAILED
    assert time.monotonic() - t0 < 4, "siblings must be stopped by SIGTERM, not after the grace"
    r0, r1 = resp.roles_statuses[0].replicas
    assert (r1.state, r1.exit_code) == (AppState.FAILED, 3)
    assert (r0.state, r0.exit_code) == (AppState.CANCELLED, -signal.SIGTERM)
    assert "w/1 exited with code 3" in resp.msg
    child = int((tmp_path / "child.pid").read_text())
    assert not is_alive(child, None), "the sibling's own child must be gone too"
    assert list(sched.log_iter(app_id, "w", 1, streams=Stream.STDERR)) == ["boom\n"]


@pytest.mark.timeout(60)
def test_elastic_role_survives_losing_replicas_down_to_its_minimum(
    sched: LocalCwdScheduler, tmp_path: Path
) -> None:
    # 1:3 nodes: replicas 1 and 2 fail, replica 0 carries on and succeeds -> the app SUCCEEDS.
    app = _sh("if [ ${replica_id} != 0 ]; then exit 4; fi; sleep 0.5; echo survived", n=3)
    app.roles[0].min_replicas = 1
    info = sched.submit_dryrun(app, _cfg(tmp_path))
    assert "more than 2 of its replicas fail" in str(info)
    app_id = sched.schedule(info)
    resp = sched.wait(app_id, timeout=30)
    assert resp is not None and resp.state == AppState.SUCCEEDED, resp
    states = [(r.state, r.exit_code) for r in resp.roles_statuses[0].replicas]
    assert states == [(AppState.SUCCEEDED, 0), (AppState.FAILED, 4), (AppState.FAILED, 4)]
    assert not resp.structured_error_msg
    assert list(sched.log_iter(app_id, "w", 0)) == ["survived\n"]
    # Below the minimum it is a failure again: 0:2 (min 0 counts as 1) losing both replicas.
    app = _sh("exit 5", n=2)
    app.roles[0].min_replicas = 0
    resp = sched.wait(sched.submit(app, _cfg(tmp_path)), timeout=30)
    assert resp is not None and resp.state == AppState.FAILED


@pytest.mark.timeout(60)
def test_stop_escalates_to_sigkill_after_the_grace(
    sched: LocalCwdScheduler, tmp_path: Path
) -> None:
    script = (
        "if [ ${replica_id} = 0 ]; then trap '' TERM; touch ready; while :; do sleep 0.05; done; fi; "
        "while [ ! -e ready ]; do sleep 0.01; done; exit 1"
    )
    t0 = time.monotonic()
    app_id = sched.submit(_sh(script, n=2), _cfg(tmp_path, stop_grace_s=0.5))
    resp = sched.wait(app_id, timeout=30)
    assert resp is not None and resp.state == AppState.FAILED
    assert resp.roles_statuses[0].replicas[0].exit_code == -signal.SIGKILL
    assert 0.5 <= time.monotonic() - t0 < 5


@pytest.mark.timeout(60)
def test_status_log_cancel_from_another_process(sched: LocalCwdScheduler, tmp_path: Path) -> None:
    script = (
        "trap 'echo got TERM; exit 143' TERM; echo started ${replica_id}; touch up.${replica_id}; "
        "sleep 300 & wait"
    )
    app_id = sched.submit(_sh(script, n=2), _cfg(tmp_path, stop_grace_s=5))
    wait_for(lambda: (tmp_path / "up.0").exists() and (tmp_path / "up.1").exists())
    got = _other_process(f"""
        r = s.describe({app_id!r})
        print(r.state.name, [x.state.name for x in r.roles_statuses[0].replicas])
        print(''.join(s.log_iter({app_id!r}, 'w', 1)), end='')
        print([a.state.name for a in s.list() if a.app_id == {app_id!r}])
        s.cancel({app_id!r})
        print(s.describe({app_id!r}).state.name)
    """)
    assert got.returncode == 0, got.stderr
    assert got.stdout.splitlines() == [
        "RUNNING ['RUNNING', 'RUNNING']",
        "started 1",
        "['RUNNING']",
        "CANCELLED",
    ]
    resp = sched.wait(app_id, timeout=10)
    assert resp is not None and resp.state == AppState.CANCELLED
    assert all(r.state == AppState.CANCELLED for r in resp.roles_statuses[0].replicas)
    # Each replica got SIGTERM (and used the grace period to exit its own way).
    assert [r.exit_code for r in resp.roles_statuses[0].replicas] == [143, 143]
    assert list(sched.log_iter(app_id, "w", 0, streams=Stream.STDOUT))[-1] == "got TERM\n"
    sched.cancel(app_id)  # idempotent
    assert sched.describe(app_id).state == AppState.CANCELLED  # type: ignore[union-attr]


@pytest.mark.timeout(60)
def test_follow_from_another_process_gets_every_line_and_ends_with_the_app(
    sched: LocalCwdScheduler, tmp_path: Path
) -> None:
    script = (
        "while [ ! -e go ]; do sleep 0.01; done; "
        "i=0; while [ $i -lt 50 ]; do echo line $i; i=$((i+1)); done; echo err-line >&2; "
        "sleep 0.3; printf 'last line without newline'"
    )
    app_id = sched.submit(_sh(script), _cfg(tmp_path))
    follower = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import sys, time
            from xrun.schedulers.local_cwd import create_scheduler
            s = create_scheduler('other')
            for line in s.log_iter({app_id!r}, 'w', 0, should_tail=True):
                sys.stdout.write(line)
            sys.stdout.write('\\n' + repr(time.monotonic()))
        """),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(0.3)  # the follower is running before any output exists
    (tmp_path / "go").touch()
    resp = sched.wait(app_id, timeout=30)
    ended = time.monotonic()
    out, _ = follower.communicate(timeout=30)
    assert resp is not None and resp.state == AppState.SUCCEEDED
    *lines, stamp = out.split("\n")
    assert [ln for ln in lines if ln.startswith("line")] == [f"line {i}" for i in range(50)]
    assert "err-line" in lines and lines[-1] == "last line without newline"
    assert float(stamp) - ended < 0.5, "the follower must stop as soon as the app ends"
    # After the end: the same lines, no waiting, regex and stream selection applied.
    assert list(sched.log_iter(app_id, "w", 0, regex=r"line 4\d", streams=Stream.STDOUT)) == [
        f"line {i}\n" for i in range(40, 50)
    ]


def test_a_follower_stopped_early_leaves_no_open_fds(
    sched: LocalCwdScheduler, tmp_path: Path
) -> None:
    app_id = sched.submit(_sh("echo first; while [ ! -e go ]; do sleep 0.01; done"), _cfg(tmp_path))
    before = len(os.listdir("/proc/self/fd"))
    lines = iter(sched.log_iter(app_id, "w", 0, should_tail=True))
    assert next(lines) == "first\n"
    assert len(os.listdir("/proc/self/fd")) > before  # the log files and the supervisor's pidfd
    lines.close()  # type: ignore[attr-defined]
    assert len(os.listdir("/proc/self/fd")) == before
    (tmp_path / "go").touch()
    assert sched.wait(app_id, timeout=30).state == AppState.SUCCEEDED  # type: ignore[union-attr]


def test_unknown_app_and_bad_log_targets(sched: LocalCwdScheduler, tmp_path: Path) -> None:
    for bad in ("nope-123", "../etc", "a/b", ""):
        assert sched.describe(bad) is None
        assert not sched.exists(bad)
        with pytest.raises(AppNotFoundError):
            sched.cancel(bad)
        with pytest.raises(AppNotFoundError):
            sched.log_iter(bad, "w")
    app_id = sched.submit(_sh("true"), _cfg(tmp_path))
    assert sched.wait(app_id, timeout=30).state == AppState.SUCCEEDED  # type: ignore[union-attr]
    with pytest.raises(UsageError, match="no role 'x'; its roles: w"):
        sched.log_iter(app_id, "x")
    with pytest.raises(UsageError, match="replicas 0..0, not 3"):
        sched.log_iter(app_id, "w", 3)


def test_list_finds_apps_in_any_log_dir(sched: LocalCwdScheduler, tmp_path: Path) -> None:
    a = sched.submit(_sh("true"), {"log_dir": str(tmp_path / "one")})
    b = sched.submit(_sh("exit 1"), {"log_dir": str(tmp_path / "two")})
    sched.wait(a, timeout=30)
    sched.wait(b, timeout=30)
    got = _other_process("print({a.app_id: (a.state.name, a.app_handle) for a in s.list()})")
    listed = eval(got.stdout)  # noqa: S307 - our own repr
    assert listed[a] == ("SUCCEEDED", f"local_cwd://other/{a}")
    assert listed[b][0] == "FAILED"
    assert [x.app_id for x in sched.list() if x.app_id in (a, b)] == [a, b], "oldest first"
    # An app whose log dir is gone is dropped from the index.
    import shutil

    shutil.rmtree(tmp_path / "one")
    assert a not in [x.app_id for x in sched.list()]
    assert sched.describe(a) is None


@pytest.mark.timeout(60)
def test_app_survives_sigkill_of_its_launcher(tmp_path: Path) -> None:
    driver = textwrap.dedent(f"""
        from xrun.schedulers.local_cwd import create_scheduler
        from xrun.specs import AppDef, Role
        s = create_scheduler('driver')
        app = AppDef('t', [Role('w', image='', entrypoint='sh', num_replicas=2, args=[
            '-c', 'while [ ! -e {tmp_path}/go ]; do sleep 0.01; done; echo done ${{replica_id}}'])])
        app_id = s.submit(app, {{'log_dir': {str(tmp_path / "logs")!r}}})
        print(app_id, flush=True)
        s.wait(app_id)  # blocks on its child, the supervisor, like `xrun run` does
    """)
    proc = subprocess.Popen([sys.executable, "-c", driver], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    app_id = proc.stdout.readline().strip()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    sched = create_scheduler("test")
    assert sched.describe(app_id).state == AppState.RUNNING  # type: ignore[union-attr]
    (tmp_path / "go").touch()
    resp = sched.wait(app_id, timeout=30)  # not our child: waits on a pidfd
    assert resp is not None and resp.state == AppState.SUCCEEDED
    assert list(sched.log_iter(app_id, "w", 1)) == ["done 1\n"]


def test_supervisor_is_forked_when_safe_and_execd_from_a_thread(
    sched: LocalCwdScheduler, tmp_path: Path
) -> None:
    """A threaded launcher must not fork (see _fork_supervisor): the exec'd supervisor works too."""
    import threading

    def supervisor_cmdline(app_id: str) -> bytes:
        state = json.loads((tmp_path / "logs" / app_id / ".xrun" / "state.json").read_text())
        return Path(f"/proc/{state['supervisor']['pid']}/cmdline").read_bytes()

    script = "while [ ! -e go ]; do sleep 0.01; done; echo via ${app_id}"
    app = _sh(script)
    # The forking case needs a single-threaded launcher: a fresh interpreter (this test process
    # may carry threads of earlier tests, and then it rightly does not fork).
    launcher = textwrap.dedent(f"""
        from xrun.schedulers.local_cwd import create_scheduler
        from xrun.specs import AppDef, Role
        app = AppDef("t", [Role("w", image="unused", entrypoint="sh", args=["-c", {script!r}])])
        print(create_scheduler("fresh").submit(app, {_cfg(tmp_path)!r}))
    """)
    forked = subprocess.run(
        [sys.executable, "-c", launcher],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.strip()
    got: list[str] = []
    t = threading.Thread(target=lambda: got.append(sched.submit(app, _cfg(tmp_path))))
    t.start()
    t.join()
    execd = got[0]
    assert b"local_cwd/supervisor.py" not in supervisor_cmdline(forked)
    assert b"local_cwd/supervisor.py" in supervisor_cmdline(execd)
    (tmp_path / "go").touch()
    for app_id in (forked, execd):
        resp = sched.wait(app_id, timeout=30)
        assert resp is not None and resp.state == AppState.SUCCEEDED
        assert app_id not in sched._children, "wait() reaps the supervisor"
        assert list(sched.log_iter(app_id, "w")) == [f"via {app_id}\n"]


@pytest.mark.timeout(60)
def test_cancel_still_works_when_the_supervisor_was_killed(
    sched: LocalCwdScheduler, tmp_path: Path
) -> None:
    app_id = sched.submit(_sh("touch up.${replica_id}; exec sleep 300", n=2), _cfg(tmp_path))
    wait_for(lambda: (tmp_path / "up.0").exists() and (tmp_path / "up.1").exists())
    state = json.loads((tmp_path / "logs" / app_id / ".xrun" / "state.json").read_text())
    os.kill(state["supervisor"]["pid"], signal.SIGKILL)
    sched.wait(app_id, timeout=10)  # reaps it (it is our child)
    resp = sched.describe(app_id)
    assert resp is not None and resp.state == AppState.UNKNOWN
    assert "supervisor" in resp.msg and "2 replica(s) still run" in resp.msg
    sched.cancel(app_id)
    resp = sched.describe(app_id)
    assert resp is not None and resp.state == AppState.CANCELLED
    assert not any(is_alive(r["pid"], r["start"]) for r in state["replicas"])


def test_failed_replica_error_file_is_reported(sched: LocalCwdScheduler, tmp_path: Path) -> None:
    script = (
        'import json, os; json.dump({"message": {"message": "ValueError: bad lr", "extraInfo": {}}}, '
        'open(os.environ["TORCHELASTIC_ERROR_FILE"], "w")); raise SystemExit(1)'
    )
    app = AppDef("t", [Role("w", image="", entrypoint="python3", args=["-c", script])])
    app_id = sched.submit(app, _cfg(tmp_path))
    resp = sched.wait(app_id, timeout=30)
    assert resp is not None and resp.state == AppState.FAILED
    assert resp.structured_error_msg == "ValueError: bad lr"
    assert resp.roles_statuses[0].replicas[0].structured_error_msg == "ValueError: bad lr"
