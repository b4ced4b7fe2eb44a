"""The root cause without ``@record`` (issue #24, item 4): real agents, real workers
(``benchmarks/workers/faults.py``) failing in every way a worker can, and what the summary, the
agent's error file and its last stderr line say about them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.cgroup import enter, memory_cgroup
from tests.helpers.paths import PY, REPO
from tests.helpers.waiting import wait_for

from .helpers import agent, run

FAULTS = str(REPO / "benchmarks" / "workers" / "faults.py")
PREFIX = "xrun-agent: root cause: "


def _fail(tmp_path: Path, fault: str, *flags: str, **env: str) -> tuple[str, str, dict]:  # type: ignore[type-arg]
    """Run 2 workers, rank 1 committing ``fault``: (stderr, root-cause line, agent error file)."""
    own = tmp_path / "agent_error.json"
    p = run(
        agent("--nproc-per-node", "2", "--tee", "3", *flags, FAULTS, fault, "1"),
        env={**os.environ, "TORCHELASTIC_ERROR_FILE": str(own), **env},
        cwd=tmp_path,
    )
    assert p.returncode == 1, p.stderr
    last = p.stderr.rstrip().splitlines()[-1]
    assert last.startswith(PREFIX), p.stderr
    return p.stderr, last.removeprefix(PREFIX), json.loads(own.read_text())


def _root(stderr: str) -> str:
    return stderr.split("Root Cause (first observed failure):")[1]


def test_traceback_without_record_is_the_root_cause(tmp_path: Path) -> None:
    err, cause, doc = _fail(tmp_path, "raise")
    assert cause == "ValueError: bad shape in batch 7 (rank 1, faults.py:22)"
    # the summary shows the traceback read from the worker's stderr, not torch's link
    root = _root(err)
    assert "rank      : 1 (local_rank: 1)" in root and "error_file: <N/A>" in root
    assert 'faults.py", line 22, in bad_batch' in root and "ValueError: bad shape" in root
    assert "To enable traceback" not in err
    # the healthy rank the agent stopped is named as such
    assert "stopped by the agent with SIGTERM; rank 1 failed first" in err.split("Root Cause")[0]
    # the agent's error file (what a scheduler's status reads): the headline and the traceback
    assert doc["message"]["message"] == cause and doc["message"]["errorCode"] == 1
    assert "bad_batch" in doc["message"]["extraInfo"]["py_callstack"]


def test_redirected_stderr_is_read_too(tmp_path: Path) -> None:
    own = tmp_path / "agent_error.json"
    p = run(
        agent("--nproc-per-node", "2", "--redirects", "2", FAULTS, "raise", "1"),
        env={**os.environ, "TORCHELASTIC_ERROR_FILE": str(own)},
    )
    assert p.returncode == 1
    assert "bad shape" not in p.stderr.split("===")[0]  # the worker's stderr went to its file
    assert json.loads(own.read_text())["message"]["message"].startswith("ValueError: bad shape")


def test_chained_exception_names_the_last_one(tmp_path: Path) -> None:
    err, cause, _ = _fail(tmp_path, "chained")
    assert cause == "RuntimeError: config has no learning rate (rank 1, faults.py:29)"
    assert "KeyError: 'lr'" in _root(err)  # the whole chain stays in the summary


def test_record_error_file_wins_over_stderr(tmp_path: Path) -> None:
    err, cause, doc = _fail(tmp_path, "record")
    assert cause == "RuntimeError: recorded failure (rank 1)"
    assert "error_file: " in _root(err) and "error_file: <N/A>" not in _root(err)
    assert doc["message"]["message"] == "RuntimeError: recorded failure"


@pytest.mark.parametrize(
    ("fault", "want"),
    [
        ("exit3", "exited with code 3 (rank 1)"),
        ("exit7", "exited with code 7 (rank 1)"),
        ("segv", "crashed with SIGSEGV: segmentation fault"),
        ("abort", "crashed with SIGABRT: aborted"),
    ],
)
def test_exits_and_crashes_say_what_happened(tmp_path: Path, fault: str, want: str) -> None:
    err, cause, doc = _fail(tmp_path, fault)
    assert cause.startswith(want) and cause.endswith("(rank 1)"), cause
    assert doc["message"]["message"] == cause
    assert "To enable traceback" not in err


def test_without_a_stderr_file_the_exit_code_and_the_hint(tmp_path: Path) -> None:
    p = run(agent("--nproc-per-node", "1", FAULTS, "exit3", "0"))
    assert p.returncode == 1
    assert p.stderr.rstrip().endswith(f"{PREFIX}exited with code 3 (rank 0)")
    assert "-r/-t 2 keep one" in p.stderr and "To enable traceback see" in p.stderr


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGUSR1])
def test_a_signal_from_outside_is_named(tmp_path: Path, sig: signal.Signals) -> None:
    p = subprocess.Popen(
        agent("--nproc-per-node", "2", "--tee", "3", FAULTS, "sleep", "1", str(tmp_path)),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: (tmp_path / "pid.1").exists(), timeout=30)
        os.kill(int((tmp_path / "pid.1").read_text()), sig)
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
        p.wait()
    last = err.rstrip().splitlines()[-1]
    if sig == signal.SIGKILL:
        assert last.startswith(f"{PREFIX}killed by SIGKILL from outside the agent (kill -9; ")
    else:
        assert last == f"{PREFIX}killed by {sig.name} from outside the agent (rank 1)"
    assert "stopped by the agent with SIGTERM; rank 1 failed first" in err


def test_a_raised_keyboard_interrupt_is_not_a_signal_from_outside(tmp_path: Path) -> None:
    # M1: Python ends an uncaught KeyboardInterrupt by raising SIGINT on itself (exit -2), so
    # the status alone reads like a Ctrl-C; the traceback says the code raised it
    err, cause, _ = _fail(tmp_path, "interrupt")
    assert cause == "KeyboardInterrupt raised in the worker (rank 1, faults.py:57)", err
    assert "raise KeyboardInterrupt" in _root(err)


def test_a_sigint_from_outside_names_where_it_hit(tmp_path: Path) -> None:
    p = subprocess.Popen(
        agent("--nproc-per-node", "2", "--tee", "3", FAULTS, "sleep", "1", str(tmp_path)),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: (tmp_path / "pid.1").exists(), timeout=30)
        time.sleep(1)  # past the pid file, into its sleep
        os.kill(int((tmp_path / "pid.1").read_text()), signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
        p.wait()
    # the frame it hit (its sleep; on a slow machine perhaps the one before it)
    want = "killed by SIGINT from outside the agent (KeyboardInterrupt) (rank 1, faults.py:"
    assert err.rstrip().splitlines()[-1].startswith(PREFIX + want), err


def test_the_agents_own_shutdown_timeout_kill_is_said(tmp_path: Path) -> None:
    err, cause, _ = _fail(tmp_path, "raise", "--shutdown-timeout", "1", FAULT_PEERS="ignore-term")
    assert cause.startswith("ValueError: bad shape in batch 7 (rank 1")
    assert (
        "killed by the agent with SIGKILL: still running --shutdown-timeout after SIGTERM; "
        "rank 1 failed first" in err
    )


def test_oom_kill_under_a_memory_limit_is_decoded() -> None:
    # the agent and its workers in the limited cgroup, as a container or a Slurm task would be
    cmd = agent("--nproc-per-node", "2", "--tee", "3", FAULTS, "oom", "1")
    with memory_cgroup() as cg:
        p = run(enter(cg, cmd))
    assert p.returncode == 1, p.stderr
    last = p.stderr.rstrip().splitlines()[-1]
    assert last.startswith(f"{PREFIX}killed by the OOM killer: out of memory (SIGKILL; memory ")
    assert f"{cg.name}: oom_kill 0 -> 1)" in last and last.endswith("(rank 1)"), last


def test_a_kill_9_is_not_pinned_on_another_processs_oom_kill(tmp_path: Path) -> None:
    # P2: the agent shares its memory cgroup with another process (a second job, the user's
    # shell) that the OOM killer kills; a kill -9 of the agent's worker afterwards is a kill -9
    cmd = agent("--nproc-per-node", "1", "--tee", "3", FAULTS, "sleep", "0", str(tmp_path))
    hog = [PY, "-c", "h = []\nwhile True: h.append(bytearray(b'x' * (64 << 20)))"]
    with memory_cgroup() as cg:
        p = subprocess.Popen(enter(cg, cmd), stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            wait_for(lambda: (tmp_path / "pid.0").exists(), timeout=30)
            other = subprocess.Popen(enter(cg, hog))
            assert other.wait(timeout=120) == -signal.SIGKILL  # the OOM killer's victim
            os.kill(int((tmp_path / "pid.0").read_text()), signal.SIGKILL)
            _, err = p.communicate(timeout=60)
        finally:
            p.kill()
            p.wait()
    last = err.decode().rstrip().splitlines()[-1]
    assert last.startswith(
        f"{PREFIX}killed by SIGKILL from outside the agent (kill -9; the kernel's log names pid "
        f"{other.pid} as the OOM killer's victim in memory cgroup "
    ), last
    assert f"{cg.name}: oom_kill 0 -> 1) (rank 0)" in last, last


def test_the_restart_message_names_the_cause(tmp_path: Path) -> None:
    err, cause, _ = _fail(tmp_path, "raise", "--max-restarts", "1")
    restarts = [x for x in err.splitlines() if "restarting the workers (1/1)" in x]
    assert len(restarts) == 1 and f"failed: {cause}; restarting" in restarts[0], err
