"""torchrun's command line, run as a user runs it (a subprocess): torchrun itself with
``XRUN_COMPAT_TARGET=torch``, xrun's agent otherwise."""

from __future__ import annotations

import json
import os
import select
import subprocess
import time

import pytest

from tests.compat import shim
from tests.compat.helpers import script


def _cli(*args: str, timeout: float = 120, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*shim.CLI, *args], capture_output=True, text=True, timeout=timeout, **kw)


@pytest.mark.timeout(180)
def test_failure_summary_lists_the_stopped_siblings(tmp_path):
    worker = script(
        tmp_path,
        "w.py",
        """
        import os, sys, time
        if os.environ["LOCAL_RANK"] == "0":
            time.sleep(0.5)
            sys.exit(3)
        time.sleep(60)
        """,
    )
    t0 = time.monotonic()
    proc = _cli("--nproc-per-node=3", "--no-python", worker)
    assert time.monotonic() - t0 < 60
    assert proc.returncode == 1
    err = proc.stderr
    root = err[err.index("Root Cause (first observed failure):") :]
    others = err[err.index("Failures:") : err.index("Root Cause")]
    assert "rank      : 0 (local_rank: 0)" in root and "exitcode  : 3" in root
    # the siblings the agent stopped are listed, as torchrun lists them
    assert others.count("exitcode  : -15") == 2 and "(SIGTERM)" in others
    assert "<NO_OTHER_FAILURES>" not in err


@pytest.mark.timeout(180)
def test_log_dir_devnull_runs(tmp_path):
    # /dev/null: no log files and no tee, the workers write straight to the agent's console,
    # as under torchrun. One write per line: under PYTHONUNBUFFERED=1, print()'s pieces are
    # separate writes, and two ranks' pieces interleave on the shared pipe (a stress run did).
    worker = script(
        tmp_path, "w.py", "import os\nos.write(1, f\"rank {os.environ['RANK']} ran\\n\".encode())\n"
    )
    proc = _cli("--nproc-per-node=2", "--no-python", "--log-dir=/dev/null", "--tee=3", worker)
    assert proc.returncode == 0, proc.stderr
    assert "rank 0 ran" in proc.stdout and "rank 1 ran" in proc.stdout


@pytest.mark.timeout(180)
def test_duplicate_stdout_filters_write_the_filtered_log(tmp_path):
    worker = script(
        tmp_path,
        "w.py",
        "import os\nfor w in ('loss=1', 'noise', 'loss=2'):\n    print(w, os.environ['RANK'])\n",
    )
    logs = tmp_path / "logs"
    proc = _cli(
        "--nproc-per-node=2",
        "--no-python",
        f"--log-dir={logs}",
        "--tee=1",
        "--duplicate-stdout-filters=loss",
        worker,
    )
    assert proc.returncode == 0, proc.stderr
    [filtered] = list(logs.rglob("filtered_stdout.log"))
    lines = sorted(filtered.read_text().splitlines())
    assert lines == [
        "[default0]:loss=1 0",
        "[default0]:loss=2 0",
        "[default1]:loss=1 1",
        "[default1]:loss=2 1",
    ]


@pytest.mark.timeout(180)
def test_event_log_handler_console_prints_the_events(tmp_path):
    worker = script(tmp_path, "w.py", "pass\n")
    proc = _cli("--nproc-per-node=1", "--no-python", "--event-log-handler=console", worker)
    assert proc.returncode == 0, proc.stderr
    events = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith('{"name"')]
    agent = [e for e in events if e["source"] == "AGENT"]
    assert agent and agent[-1]["name"] == "torchelastic.worker.status.SUCCEEDED"


@pytest.mark.timeout(120)
def test_numa_binding_without_a_gpu_fails(tmp_path):
    if os.path.isdir("/proc/driver/nvidia/gpus"):
        pytest.fail(
            "this test needs a host without NVIDIA GPUs (see tests/runtime/workers/test_numa.py)"
        )
    worker = script(tmp_path, "w.py", "pass\n")
    proc = _cli("--nproc-per-node=1", "--no-python", "--numa-binding=node", worker)
    assert proc.returncode != 0  # torchrun fails too (with a traceback)
    if shim.TARGET == "xrun":
        assert proc.returncode == 2
        assert proc.stderr.count("\n") == 1 and "--numa-binding node" in proc.stderr


@pytest.mark.timeout(120)
def test_worker_reading_the_terminal_does_not_hang_the_job(tmp_path):
    # A worker calling input() (or pdb) under a terminal: in its own session it may read the
    # terminal; as a background group of the agent's session SIGTTIN would stop it forever.
    worker = script(
        tmp_path,
        "w.py",
        "print('got', input(), flush=True)\n",
    )
    master, slave = os.openpty()

    def controlling_tty() -> None:
        import fcntl
        import termios

        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)  # the agent runs in the terminal's foreground

    proc = subprocess.Popen(
        [*shim.CLI, "--nproc-per-node=1", "--no-python", worker],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        preexec_fn=controlling_tty,
    )
    os.close(slave)
    os.write(master, b"typed\n")
    out = b""
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        if select.select([master], [], [], 0.5)[0]:
            try:
                out += os.read(master, 65536)
            except OSError:
                break
    try:
        assert proc.wait(timeout=max(1.0, deadline - time.monotonic())) == 0, out
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    assert b"got typed" in out
