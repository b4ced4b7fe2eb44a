"""torch's file timer served by the agent (issue #24, item 5): ``TORCHELASTIC_ENABLE_FILE_TIMER=1``
and real workers using torch's own ``FileTimerClient`` and ``expires``."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import textwrap
from pathlib import Path

from tests.helpers.paths import REPO
from tests.runtime.agent.helpers import agent, alive, run

FAULTS = str(REPO / "benchmarks" / "workers" / "faults.py")
ON = {**os.environ, "TORCHELASTIC_ENABLE_FILE_TIMER": "1"}


def test_an_expired_timer_kills_the_worker_and_is_reported(tmp_path: Path) -> None:
    own = tmp_path / "agent_error.json"
    p = run(
        agent("--nproc-per-node", "2", "--tee", "3", "--max-restarts", "1", FAULTS, "expire", "1"),
        env={**ON, "TORCHELASTIC_ERROR_FILE": str(own)},
        timeout=120,
    )
    assert p.returncode == 1, p.stderr
    # both attempts' rank 1 hung in expires(after=1) and the agent killed it
    kills = [x for x in p.stderr.splitlines() if "file timer: local rank 1 (pid" in x]
    assert len(kills) == 2, p.stderr
    cause = "killed by the file timer: expires() of scope 'train_step' ran out"
    root = p.stderr.split("Root Cause (first observed failure):")[1]
    assert "exitcode  : -9" in root and f"traceback : {cause}" in root
    last = p.stderr.rstrip().splitlines()[-1]
    assert last.startswith(f"xrun-agent: root cause: {cause}") and last.endswith("(rank 1)")
    assert json.loads(own.read_text())["message"]["message"].startswith(cause)


def test_a_timer_released_in_time_and_the_fifo_path(tmp_path: Path) -> None:
    fifo = tmp_path / "timer.fifo"
    script = tmp_path / "ok.py"
    script.write_text(
        textwrap.dedent(
            """\
            import os, stat, sys
            from torch.distributed.elastic.timer import FileTimerClient, expires
            path = os.environ["TORCHELASTIC_TIMER_FILE"]
            assert stat.S_ISFIFO(os.stat(path).st_mode) and os.stat(path).st_mode & 0o077 == 0
            with expires(after=2, scope="quick", client=FileTimerClient(path)):
                pass
            print("released", path)
            """
        )
    )
    p = run(
        agent("--nproc-per-node", "2", "--tee", "3", str(script)),
        env={**ON, "TORCHELASTIC_TIMER_FILE": str(fifo)},
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.count(f"released {fifo}") == 2
    assert not fifo.exists()  # removed with the agent


def test_a_timer_naming_another_process_kills_nothing(tmp_path: Path) -> None:
    bystander = subprocess.Popen(["sleep", "60"])
    script = tmp_path / "evil.py"
    script.write_text(
        textwrap.dedent(
            f"""\
            import json, os, time
            req = {{"version": 1, "pid": {bystander.pid}, "scope_id": "x",
                   "expiration_time": 0, "signal": 9}}
            with open(os.environ["TORCHELASTIC_TIMER_FILE"], "w") as f:
                f.write(json.dumps(req) + "\\n" + "not json\\n")
            time.sleep(0.5)
            """
        )
    )
    try:
        p = run(agent("--nproc-per-node", "1", str(script)), env=ON, timeout=60)
        assert p.returncode == 0, p.stderr
        assert alive(bystander.pid)
        assert f"expired for pid {bystander.pid}, which is no worker of this agent" in p.stderr
        assert "ignored a malformed request (JSONDecodeError" in p.stderr
    finally:
        bystander.kill()
        bystander.wait()


def test_a_timer_file_that_is_no_fifo_is_a_usage_error(tmp_path: Path) -> None:
    plain = tmp_path / "notes.txt"
    plain.write_text("keep me")
    p = run(
        agent("--nproc-per-node", "1", FAULTS, "exit3", "0"),
        env={**ON, "TORCHELASTIC_TIMER_FILE": str(plain)},
    )
    assert p.returncode == 2
    assert p.stderr.strip().splitlines()[-1] == (
        f"xrun-agent: error: TORCHELASTIC_TIMER_FILE={plain} exists and is not a FIFO: expected"
        " a path the agent may create (a leftover FIFO is replaced); unset it for a fresh one"
    )
    assert plain.read_text() == "keep me" and "Traceback" not in p.stderr


def test_without_the_variable_no_timer_file(tmp_path: Path) -> None:
    script = tmp_path / "env.py"
    script.write_text("import os; print('timer', os.environ.get('TORCHELASTIC_TIMER_FILE'))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC_")}
    p = run(agent("--nproc-per-node", "1", "--tee", "3", str(script)), env=env)
    assert p.returncode == 0 and "timer None" in p.stdout, p.stderr


def test_a_timer_fifo_another_agent_reads_is_refused_a_leftover_is_replaced(
    tmp_path: Path,
) -> None:
    """P13: a second agent given the same TORCHELASTIC_TIMER_FILE would take over the first
    job's live FIFO (its workers' releases then go astray and its agent kills them): refused in
    one line while someone reads it; a leftover FIFO nobody reads is replaced as before."""
    fifo = tmp_path / "shared.fifo"
    os.mkfifo(fifo, 0o600)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # the live agent's read end
    try:
        p = run(
            agent("--nproc-per-node", "1", FAULTS, "exit3", "0"),
            env={**ON, "TORCHELASTIC_TIMER_FILE": str(fifo)},
        )
        assert p.returncode == 2, p.stderr
        assert p.stderr == (
            f"xrun-agent: error: TORCHELASTIC_TIMER_FILE={fifo} is in use by another agent (a "
            "process reads that FIFO); unset TORCHELASTIC_TIMER_FILE for a private one\n"
        )
        assert stat.S_ISFIFO(os.stat(fifo).st_mode)  # left alone
    finally:
        os.close(reader)
    script = tmp_path / "ok.py"
    script.write_text("import os; print('timer', os.environ['TORCHELASTIC_TIMER_FILE'])\n")
    p = run(
        agent("--nproc-per-node", "1", "--tee", "3", str(script)),
        env={**ON, "TORCHELASTIC_TIMER_FILE": str(fifo)},
    )
    assert p.returncode == 0, p.stderr
    assert f"timer {fifo}" in p.stdout  # the leftover was replaced, then removed
    assert not fifo.exists()
