"""The stall watchdog never kills a healthy job (issue #31): a worker that works (CPU, reads,
writes, a child that works) or prints wherever its output goes is not stalled, nor is one that
has not shown a sign of life yet or is tearing down; a real hang is still caught within the
timeout + 10 s, with its frames; a stopped or exiting rank is named as such.

Real agents and workers throughout. Margins are for a 2-core machine at load 5-7: the healthy
jobs' silent phases are 8 s against timeouts of 1-2 s (a false positive shows at once), the hang
gets its 10 s."""

from __future__ import annotations

import os
import pty
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import IO

import pytest

from tests.helpers.paths import SCRIPTS
from tests.helpers.waiting import wait_for
from tests.runtime.agent.helpers import agent, run

HANG = SCRIPTS / "hang.py"

# Prints "ready" (its first sign of life), then stays silent for 8 s doing MODE, then "done".
SILENT = """
import os, subprocess, sys, time
mode = sys.argv[1]
print("ready", flush=True)
end = time.monotonic() + 8
if mode == "compute":
    x = 0
    while time.monotonic() < end:
        x += 1
elif mode == "write":  # a checkpoint saved silently
    with open(sys.argv[2] + os.environ["RANK"], "wb") as f:
        while time.monotonic() < end:
            f.write(b"w" * 65536)
            f.flush()
            time.sleep(0.05)
elif mode == "child":  # the work is done by a child process (a tar, a converter)
    subprocess.run([sys.executable, "-c",
                    "import time\\nend = time.monotonic() + 8\\nwhile time.monotonic() < end: pass"])
elif mode == "teardown":  # the last line, then a silent, busy exit (torch's finalizers)
    import atexit
    def finalize():
        while time.monotonic() < end:
            pass
    atexit.register(finalize)
print("done", flush=True)
"""


def _stall_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if "stalled" in ln]


@pytest.mark.timeout(180)
def test_a_silent_torch_import_is_not_a_stall(tmp_path: Path) -> None:
    """Two workers importing torch in silence take seconds on a busy host: with a 1 s timeout
    the old watchdog killed them inside ``import torch``."""
    script = tmp_path / "imp.py"
    script.write_text("import torch\nprint('imported', torch.ones(1).sum().item(), flush=True)\n")
    logs = ("--log-dir", str(tmp_path / "logs"), "--tee", "3")
    p = run(agent("--nproc-per-node", "2", "--stall-timeout", "1", *logs, str(script)), timeout=170)
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("imported 1.0") == 2
    assert not _stall_lines(p.stderr)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["compute", "write", "child", "teardown"])
def test_a_silent_busy_phase_is_not_a_stall(tmp_path: Path, mode: str) -> None:
    """8 s of silent work (computing, saving a file, a child computing, a busy exit after the
    last line) against a 2 s timeout."""
    script = tmp_path / "silent.py"
    script.write_text(SILENT)
    logs = ("--log-dir", str(tmp_path / "logs"), "--tee", "3")
    cmd = agent("--nproc-per-node", "2", "--stall-timeout", "2", *logs, str(script))
    p = run([*cmd, mode, str(tmp_path / "ckpt")], timeout=110)
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("done") == 2
    assert not _stall_lines(p.stderr)


CHATTY = "import time\nfor i in range(8):\n    print('step', i, flush=True)\n    time.sleep(1)\n"


@pytest.mark.timeout(90)
@pytest.mark.parametrize("out", ["pipe", "tty"])
def test_output_to_a_pipe_or_a_terminal_is_progress(tmp_path: Path, out: str) -> None:
    """P10: ``xrun-agent --stall-timeout 2 chatty.py | tee log`` (and on a terminal): the
    workers write to the agent's own stdout, which is no file the agent can watch; a line a
    second for 8 s is progress all the same (the worker's writes, /proc/PID/io)."""
    script = tmp_path / "chatty.py"
    script.write_text(CHATTY)
    cmd = agent("--standalone", "--nproc-per-node", "1", "--stall-timeout", "2", str(script))
    if out == "pipe":
        p = run(cmd, timeout=80)
        assert p.stdout.count("step") == 8
        rc, err = p.returncode, p.stderr
    else:
        parent, child = pty.openpty()
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=child, stderr=subprocess.PIPE, text=True
        )
        os.close(child)
        got = b""
        while True:  # drain the terminal, or the worker blocks on a full one
            try:
                chunk = os.read(parent, 4096)
            except OSError:  # EIO: every writer closed the terminal
                break
            if not chunk:
                break
            got += chunk
        err = proc.stderr.read() if proc.stderr else ""
        rc = proc.wait(60)
        os.close(parent)
        assert got.count(b"step") == 8, got
    assert rc == 0, err
    assert not _stall_lines(err)


@pytest.mark.timeout(150)
def test_a_hang_is_still_caught_within_the_timeout_and_10_s(tmp_path: Path) -> None:
    """Rank 1 sleeps in stuck_here, rank 0 waits in gloo's all_reduce (no CPU, no I/O): the
    stall is found within 3 + 10 s of the hang, with both frames, output to a pipe."""
    seen: dict[str, float] = {}
    err: list[str] = []
    proc = subprocess.Popen(
        agent("--nproc-per-node", "2", "--stall-timeout", "3", str(HANG), "1000")
        + ["--hang-rank", "1", "--hang-step", "2"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def lines(stream: IO[str], keep: list[str] | None = None) -> None:
        for line in stream:
            seen.setdefault(line.strip(), time.monotonic())
            if keep is not None:
                keep.append(line)

    assert proc.stdout is not None and proc.stderr is not None
    readers = [
        threading.Thread(target=lines, args=(proc.stdout,), daemon=True),
        threading.Thread(target=lines, args=(proc.stderr, err), daemon=True),
    ]
    for r in readers:
        r.start()
    try:
        proc.wait(140)
    finally:
        if proc.poll() is None:
            proc.kill()
    for r in readers:
        r.join(10)
    stderr = "".join(err)
    assert proc.returncode == 1, stderr
    assert "step 2" in seen, (sorted(seen), stderr)
    hang = seen["step 2"]  # both ranks print it; rank 1 then hangs
    found = next(t for ln, t in seen.items() if ln.startswith("xrun-agent: stalled 3 s: "))
    assert found - hang <= 3 + 10, (found - hang, stderr)
    sleep_line = _line_of("time.sleep(3600)")
    reduce_line = _line_of("dist.all_reduce(t)")
    assert (
        f"xrun-agent: stalled 3 s: rank 1 in stuck_here (hang.py:{sleep_line}); "
        f"rank 0 in all_reduce (hang.py:{reduce_line})"
    ) in stderr


def _line_of(text: str) -> int:
    return next(i for i, ln in enumerate(HANG.read_text().splitlines(), 1) if text in ln)


@pytest.mark.timeout(120)
def test_a_first_line_to_a_pipe_before_the_agents_first_look_is_a_sign_of_life(
    tmp_path: Path,
) -> None:
    """A worker that prints at once (before the agent's first /proc sample), to the agent's own
    pipe (no --log-dir), then hangs: its line is its sign of life, so --stall-timeout holds it,
    not the 600 s silent limit (the first sample used to be only a baseline)."""
    script = tmp_path / "early.py"
    script.write_text(
        "import time\n\ndef stuck_here():\n    time.sleep(600)\n\n"
        "print('up', flush=True)\nstuck_here()\n"
    )
    t0 = time.monotonic()
    p = run(agent("--nproc-per-node", "1", "--stall-timeout", "2", str(script)), timeout=100)
    assert p.returncode == 1, p.stderr
    assert "up" in p.stdout
    assert any("stuck_here (early.py:4)" in ln for ln in _stall_lines(p.stderr)), p.stderr
    assert time.monotonic() - t0 < 2 + 10 + 30  # the timeout + 10 s, + a loaded start-up


@pytest.mark.timeout(90)
@pytest.mark.parametrize("silent_limit", ["", "5"])
def test_before_its_first_sign_of_life_a_worker_has_the_silent_limit(
    tmp_path: Path, silent_limit: str
) -> None:
    """A worker that shows no sign of life yet (a silent start-up: a download, a lock) is not
    held to --stall-timeout; --stall-silent-timeout (default max(10 S, 600 s)) bounds it."""
    script = tmp_path / "late.py"
    script.write_text(
        "import time\n\ndef starting():\n    time.sleep(9)\n\nstarting()\nprint('late', flush=True)\n"
    )
    extra = ("--stall-silent-timeout", silent_limit) if silent_limit else ()
    logs = ("--log-dir", str(tmp_path / "logs"), "--tee", "3")
    cmd = agent("--nproc-per-node", "1", "--stall-timeout", "2", *extra, *logs, str(script))
    p = run(cmd, timeout=80)
    if not silent_limit:
        assert p.returncode == 0, p.stderr
        assert "late" in p.stdout and not _stall_lines(p.stderr)
    else:
        assert p.returncode == 1, p.stderr
        assert (
            "xrun-agent: stalled 5 s without a line, write, beat or timer request: "
            "rank 0 in starting (late.py:4)"
        ) in p.stderr.splitlines()


@pytest.mark.timeout(90)
def test_a_hung_teardown_is_exiting_and_meets_the_silent_limit(tmp_path: Path) -> None:
    """P15: past its last line the worker hangs at the very end of interpreter shutdown (no
    Python left, idle): not a stall at 2 s, and named "exiting", never "not a Python
    interpreter", when the silent limit ends it."""
    script = tmp_path / "tear.py"
    # Py_AtExit runs after the interpreter is gone; pause() then waits for a signal
    script.write_text(
        "import ctypes\nctypes.pythonapi.Py_AtExit(ctypes.CDLL(None).pause)\n"
        "print('done', flush=True)\n"
    )
    logs = ("--log-dir", str(tmp_path / "logs"), "--tee", "3")
    cmd = agent("--nproc-per-node", "1", "--stall-timeout", "2", "--stall-silent-timeout", "12")
    t0 = time.monotonic()
    p = run([*cmd, "--shutdown-timeout", "3", *logs, str(script)], timeout=80)
    took = time.monotonic() - t0
    assert p.returncode == 1, p.stderr
    assert (
        "xrun-agent: stalled 12 s without a line, write, beat or timer request: "
        "rank 0 is exiting (interpreter shutdown; no Python frames)"
    ) in p.stderr.splitlines(), p.stderr
    assert "not a Python interpreter" not in p.stderr
    assert took >= 12, took  # not ended at the 2 s stall timeout


@pytest.mark.timeout(90)
def test_a_stopped_worker_is_named_stopped(tmp_path: Path) -> None:
    """M13: a worker stopped by SIGSTOP stalls the job; the report says so."""
    pidfile = tmp_path / "pid"
    script = tmp_path / "stopme.py"
    script.write_text(
        "import os, sys, time\n"
        f"open({str(pidfile)!r}, 'w').write(str(os.getpid()))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    logs = ("--log-dir", str(tmp_path / "logs"), "--tee", "3")
    proc = subprocess.Popen(
        agent("--nproc-per-node", "1", "--stall-timeout", "2", "--shutdown-timeout", "2")
        + [*logs, str(script)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: pidfile.exists() and pidfile.read_text(), 40, "the worker's pid")
        os.kill(int(pidfile.read_text()), signal.SIGSTOP)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, err
    assert "xrun-agent: stalled 2 s: rank 0 is stopped (SIGSTOP/SIGTSTP)" in err.splitlines()


@pytest.mark.timeout(150)
def test_survivors_of_a_gloo_failure_show_where_they_were(tmp_path: Path) -> None:
    """Rank 1 raises; rank 0 waits in dist.barrier(), which fails as rank 1's sockets close, so
    rank 0 is exiting when the agent reads it: its frame comes from its last traceback."""
    script = tmp_path / "valerr.py"
    script.write_text(
        "import torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "if dist.get_rank() == 1:\n"
        "    raise ValueError('bad shape in batch 3')\n"
        "dist.barrier()\n"
    )
    logs = ("--log-dir", str(tmp_path / "logs"), "--tee", "3")
    p = run(agent("--nproc-per-node", "2", *logs, str(script)), timeout=140)
    assert p.returncode == 1, p.stderr
    survivors = p.stderr.split("Where the other ranks were (stacks before they were stopped):\n")
    assert len(survivors) == 2, p.stderr
    first = survivors[1].splitlines()[0]
    assert not first.endswith(": no Python frame")  # the old report
    # read before its barrier failed (a live frame) or after (its traceback): barrier either way
    assert first.startswith("rank 0 (1/1) on "), first
    assert first.endswith(
        (": barrier (valerr.py:5)", "no Python frames) after RuntimeError in barrier (valerr.py:5)")
    ), first
    assert "    barrier (" in survivors[1]


@pytest.mark.parametrize("flag", ["--stall-timeout", "--stall-silent-timeout"])
@pytest.mark.parametrize("value", ["0.001", "5e-324", "1e-9", "0.5"])
def test_sub_second_values_are_refused(flag: str, value: str) -> None:
    p = run(agent(flag, value, str(HANG), "1"))
    assert p.returncode == 2
    assert p.stderr == (
        f"xrun-agent: error: {flag} '{value}' is invalid: expected 0 (off) or a number of "
        "seconds from 1 to 86400 (one day)\n"
    )
