"""End to end on local_cwd: the real ``xrun`` console script, the real runtime agent, real torch.

Every job gets its own ``log_dir`` under the test's tmp dir (the app index lives under the
suite's XDG_STATE_HOME, see conftest). Multi-node jobs get a free rendezvous port so parallel
test runs on this host do not clash on the default 29500.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import paths
from tests.helpers.net import free_port
from tests.helpers.paths import XRUN
from tests.helpers.waiting import wait_for
from xrun.procs import is_alive

TRAIN = str(paths.TRAIN)


@pytest.fixture(autouse=True)
def _no_leftovers(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A failing test must not leave its job running: cancel every app still alive."""
    yield
    from xrun.schedulers.local_cwd import create_scheduler

    sched = create_scheduler("cleanup")
    logs = tmp_path / "logs"
    for app_dir in logs.iterdir() if logs.exists() else []:
        resp = sched.describe(app_dir.name)
        if resp is not None and resp.state.name in ("SUBMITTED", "PENDING", "RUNNING", "UNKNOWN"):
            sched.cancel(app_dir.name)


def _xrun(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([XRUN, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def _run_args(tmp_path: Path, *component: str) -> list[str]:
    return [
        "run",
        "-s",
        "local_cwd",
        "-cfg",
        f"log_dir={tmp_path / 'logs'}",
        "dist.ddp",
        *component,
    ]


def _handle(stdout: str) -> str:
    lines = stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("local_cwd://"), (
        f"stdout must be the handle only: {stdout!r}"
    )
    return lines[0]


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _listener(pids: list[int], port: int) -> int:
    """Which of ``pids`` listens on TCP ``port`` (from /proc/net/tcp*, socket inodes)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if int(f[1].rsplit(":", 1)[1], 16) == port and f[3] == "0A":  # 0A: LISTEN
                inodes.add(f"socket:[{f[9]}]")
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                if os.readlink(fd) in inodes:
                    return pid
            except OSError:
                continue
    raise AssertionError(f"none of {pids} listens on port {port}")


# --------------------------------------------------------------------------- real training
def _worker_pids(marker: str) -> dict[int, int]:
    """LOCAL_RANK -> pid of the training workers whose command line contains ``marker``."""
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker.encode() in cmd and b"train_ddp.py" in cmd:
            for kv in env:
                if kv.startswith(b"LOCAL_RANK="):
                    out[int(kv.split(b"=", 1)[1])] = int(pid)
    return out


@pytest.mark.timeout(420)
def test_ddp_1x2_trains_and_a_killed_worker_changes_nothing(tmp_path: Path) -> None:
    # Long enough after the first checkpoint that the kill lands while the workers train.
    train = ["--epochs", "4", "--steps-per-epoch", "5", "--step-sleep", "0.2"]
    quiet = _xrun(
        *_run_args(
            tmp_path,
            "-j",
            "1x2",
            "--script",
            TRAIN,
            "--",
            *train,
            "--checkpoint-dir",
            "quiet",
            "--out",
            "quiet.json",
        ),
        cwd=tmp_path,
        timeout=200,
    )
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    handle = _handle(quiet.stdout)
    undisturbed = json.loads((tmp_path / "quiet.json").read_text())
    assert undisturbed["world_size"] == 2
    for rank in (0, 1):  # every rank checked WORLD_SIZE and the all_reduce, then finished
        assert f"rank {rank}/2: final loss" in quiet.stderr
    status = _xrun("status", handle, cwd=Path("/"))
    assert status.returncode == 0 and "SUCCEEDED" in status.stdout
    logs = _xrun("log", handle, cwd=Path("/"))
    assert "rank 1/2: final loss" in logs.stdout

    # The same run with worker 1 SIGKILLed after the first checkpoint: the agent restarts the
    # workers, they resume from the last complete epoch, and the result is the same bit for bit.
    chaos = subprocess.Popen(
        [
            XRUN,
            *_run_args(
                tmp_path,
                "-j",
                "1x2",
                "--max_retries",
                "1",
                "--script",
                TRAIN,
                "--",
                *train,
                "--checkpoint-dir",
                "chaos",
                "--out",
                "chaos.json",
            ),
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(lambda: (tmp_path / "chaos" / "epoch-00001.pt").exists(), timeout=150)
    victim = _worker_pids("chaos.json")[1]
    os.kill(victim, signal.SIGKILL)
    out, err = chaos.communicate(timeout=180)
    assert chaos.returncode == 0, err[-3000:]
    result = json.loads((tmp_path / "chaos.json").read_text())
    assert result["restart_count"] == 1, "the worker kill must have caused a restart"
    assert result["params_sha256"] == undisturbed["params_sha256"]
    assert result["final_loss"] == undisturbed["final_loss"]


@pytest.mark.timeout(300)
def test_elastic_job_survives_losing_a_whole_agent(tmp_path: Path) -> None:
    """Issue #7 item 1, elastic part: ``-j 1:2x1``, SIGKILL one agent after the first checkpoint.

    The other agent re-forms the group alone and resumes from the last complete epoch; the app
    SUCCEEDS (the role may shrink to 1 node) and status shows the killed replica.
    """
    port = free_port()
    cli = subprocess.Popen(
        [
            XRUN,
            *_run_args(
                tmp_path,
                "-j",
                "1:2x1",
                "--rdzv_port",
                str(port),
                "--rdzv_conf",
                "last_call_timeout=1",
                "--max_retries",
                "2",
                "--script",
                TRAIN,
                "--",
                "--epochs",
                "3",
                "--steps-per-epoch",
                "5",
                "--step-sleep",
                "0.1",
                "--out",
                "out.json",
            ),
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert cli.stdout is not None
    handle = cli.stdout.readline().strip()
    wait_for(lambda: (tmp_path / "outputs" / "ckpt" / "epoch-00001.pt").exists(), timeout=150)
    app_id = handle.rsplit("/", 1)[1]
    state = json.loads((tmp_path / "logs" / app_id / ".xrun" / "state.json").read_text())
    agents = [r["pid"] for r in state["replicas"]]
    # The agent that hosts the rendezvous store is the one a job cannot lose (as with
    # torchrun's c10d backend): kill the other one, whole.
    host = _listener(agents, port)
    victim = next(p for p in agents if p != host)
    os.kill(victim, signal.SIGKILL)
    _, err = cli.communicate(timeout=200)
    assert cli.returncode == 0, err[-3000:]
    assert "resuming after epoch" in err
    assert json.loads((tmp_path / "out.json").read_text())["world_size"] == 1
    status = _xrun("status", handle, cwd=Path("/")).stdout
    assert "State: SUCCEEDED" in status and "exit_code=-9" in status, status


@pytest.mark.timeout(240)
def test_ddp_2x2_trains(tmp_path: Path) -> None:
    proc = _xrun(
        *_run_args(
            tmp_path,
            "-j",
            "2x2",
            "--rdzv_port",
            str(free_port()),
            "--script",
            TRAIN,
            "--",
            "--epochs",
            "2",
            "--steps-per-epoch",
            "5",
            "--out",
            "out.json",
        ),
        cwd=tmp_path,
        timeout=220,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    _handle(proc.stdout)
    assert json.loads((tmp_path / "out.json").read_text())["world_size"] == 4
    for rank in range(4):
        assert f"rank {rank}/4: final loss" in proc.stderr
    assert (tmp_path / "outputs" / "ckpt" / "epoch-00002.pt").exists()


# --------------------------------------------------------------------------- control from elsewhere
SLEEPER = """\
import os, sys, time
open(os.path.join(sys.argv[1], f"pid.{os.environ['RANK']}"), "w").write(str(os.getpid()))
print(f"rank {os.environ['RANK']} ready", flush=True)
time.sleep(300)
"""


@pytest.mark.timeout(120)
def test_cli_sigkilled_then_status_log_cancel_from_another_shell(tmp_path: Path) -> None:
    script = _write(tmp_path / "sleeper.py", SLEEPER)
    cli = subprocess.Popen(
        [XRUN, *_run_args(tmp_path, "-j", "1x2", "--script", str(script), "--", str(tmp_path))],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert cli.stdout is not None
    handle = cli.stdout.readline().strip()
    wait_for(lambda: (tmp_path / "pid.0").exists() and (tmp_path / "pid.1").exists())
    cli.kill()  # SIGKILL: the job must not notice
    cli.wait()
    pids = [int((tmp_path / f"pid.{r}").read_text()) for r in (0, 1)]
    assert all(is_alive(p, None) for p in pids)

    status = _xrun("status", handle, cwd=Path("/"))
    assert status.returncode == 0 and "RUNNING" in status.stdout, status
    wait_for(lambda: "rank 1 ready" in _xrun("log", handle, cwd=Path("/")).stdout, timeout=30)
    listed = _xrun("list", "-s", "local_cwd", cwd=Path("/")).stdout
    assert any(handle.rsplit("/", 1)[1] in ln and "RUNNING" in ln for ln in listed.splitlines())

    cancel = _xrun("cancel", handle, cwd=Path("/"))
    assert cancel.returncode == 0, cancel.stderr
    status = _xrun("status", handle, cwd=Path("/"))
    assert "CANCELLED" in status.stdout and "FAILED" not in status.stdout, status.stdout
    assert not any(is_alive(p, None) for p in pids), "cancel must stop the workers"


@pytest.mark.timeout(120)
def test_follow_ends_with_the_app(tmp_path: Path) -> None:
    script = _write(
        tmp_path / "talker.py",
        (
            "import os, sys, time\n"
            "while not os.path.exists(sys.argv[1]): time.sleep(0.01)\n"
            "for i in range(20): print('tick', i, os.environ['RANK'])\n"
        ),
    )
    go = tmp_path / "go"
    cli = subprocess.Popen(
        [XRUN, *_run_args(tmp_path, "-j", "1x2", "--script", str(script), "--", str(go))],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert cli.stdout is not None
    handle = cli.stdout.readline().strip()
    follower = subprocess.Popen(
        [XRUN, "log", "-f", handle], cwd="/", stdout=subprocess.PIPE, text=True
    )
    time.sleep(0.3)
    go.touch()
    out, _ = follower.communicate(timeout=60)
    assert cli.wait(timeout=60) == 0
    assert follower.returncode == 0
    for rank in (0, 1):
        assert [ln.split("tick ")[1] for ln in out.splitlines() if f" {rank}" == ln[-2:]] == [
            f"{i} {rank}" for i in range(20)
        ]


@pytest.mark.timeout(120)
def test_failing_replica_fails_the_app_and_stops_its_siblings(tmp_path: Path) -> None:
    script = _write(
        tmp_path / "fail1.py",
        (
            "import os, sys, time\n"
            "rank = os.environ['RANK']\n"
            "open(os.path.join(sys.argv[1], f'pid.{rank}'), 'w').write(str(os.getpid()))\n"
            "if rank == '1':\n"
            "    while not os.path.exists(os.path.join(sys.argv[1], 'pid.0')): time.sleep(0.01)\n"
            "    sys.exit(7)\n"
            "time.sleep(300)\n"
        ),
    )
    t0 = time.monotonic()
    proc = _xrun(
        *_run_args(
            tmp_path,
            "-j",
            "2x1",
            "--rdzv_port",
            str(free_port()),
            "--script",
            str(script),
            "--",
            str(tmp_path),
        ),
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert time.monotonic() - t0 < 60
    handle = _handle(proc.stdout)
    status = _xrun("status", handle, cwd=Path("/"))
    assert "FAILED" in status.stdout, status.stdout
    pid0 = int((tmp_path / "pid.0").read_text())
    assert not is_alive(pid0, None), "the healthy sibling's worker must have been stopped"


@pytest.mark.timeout(120)
def test_sigterm_to_the_job_reaches_every_worker_and_ends_it_cancelled(tmp_path: Path) -> None:
    """Issue #7 item 3 (local_cwd): SIGTERM to the job (its supervisor) -> workers get SIGTERM."""
    script = _write(
        tmp_path / "graceful.py",
        (
            "import os, signal, sys, time\n"
            "rank = os.environ['RANK']\n"
            "def bye(*_):\n"
            "    open(os.path.join(sys.argv[1], f'term.{rank}'), 'w').write('SIGTERM')\n"
            "    sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, bye)\n"
            "open(os.path.join(sys.argv[1], f'up.{rank}'), 'w').close()\n"
            "time.sleep(300)\n"
        ),
    )
    cli = subprocess.Popen(
        [XRUN, *_run_args(tmp_path, "-j", "1x2", "--script", str(script), "--", str(tmp_path))],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert cli.stdout is not None
    handle = cli.stdout.readline().strip()
    wait_for(lambda: (tmp_path / "up.0").exists() and (tmp_path / "up.1").exists())
    app_id = handle.rsplit("/", 1)[1]
    state = json.loads((tmp_path / "logs" / app_id / ".xrun" / "state.json").read_text())
    os.kill(state["supervisor"]["pid"], signal.SIGTERM)
    assert cli.wait(timeout=60) == 1, "the app did not succeed: `xrun run` exits 1"
    assert (tmp_path / "term.0").read_text() == (tmp_path / "term.1").read_text() == "SIGTERM"
    status = _xrun("status", handle, cwd=Path("/"))
    assert "State: CANCELLED" in status.stdout, status.stdout


# --------------------------------------------------------------------------- concurrency
@pytest.mark.timeout(180)
def test_eight_concurrent_1x2_jobs(tmp_path: Path) -> None:
    """Issue #7 item 5: no port clash, no shared temp file (~10-20 s on a loaded 2-core host)."""
    script = _write(
        tmp_path / "who.py",
        (
            "import os\nprint('who', os.environ['RANK'], os.environ['WORLD_SIZE'], "
            "os.environ['MASTER_PORT'], os.environ['TORCHELASTIC_RUN_ID'])\n"
        ),
    )
    procs = [
        subprocess.Popen(
            [XRUN, *_run_args(tmp_path, "-j", "1x2", "--script", str(script))],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(8)
    ]
    results = [p.communicate(timeout=170) for p in procs]
    assert [p.returncode for p in procs] == [0] * 8, [e[-2000:] for _, e in results]
    handles = {_handle(out) for out, _ in results}
    assert len(handles) == 8
    ports = set()
    for _, err in results:
        who = [ln.split("who ")[1].split() for ln in err.splitlines() if "who " in ln]
        assert sorted(w[0] for w in who) == ["0", "1"] and {w[1] for w in who} == {"2"}
        ports |= {w[2] for w in who}
    assert len(ports) == 8, f"each job needs its own master port: {ports}"


@pytest.mark.timeout(180)
def test_two_concurrent_multi_node_jobs_on_the_default_port(tmp_path: Path) -> None:
    """Two `-j 2x1` apps at once, neither giving --rdzv_port: local_cwd hands each its own free
    rendezvous port (XRUN_RDZV_PORT), so they do not meet on 29500."""
    script = _write(
        tmp_path / "who.py",
        (
            "import os\nprint('who', os.environ['RANK'], os.environ['WORLD_SIZE'], "
            "os.environ['TORCHELASTIC_RUN_ID'])\n"
        ),
    )
    procs = [
        subprocess.Popen(
            [XRUN, *_run_args(tmp_path, "-j", "2x1", "--script", str(script))],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    results = [p.communicate(timeout=150) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e[-2000:] for _, e in results]
    for out, err in results:
        who = sorted(ln.split("who ")[1].split() for ln in err.splitlines() if "who " in ln)
        run_id = _handle(out).rsplit("/", 1)[1]
        assert who == [["0", "2", run_id], ["1", "2", run_id]], err[-2000:]
