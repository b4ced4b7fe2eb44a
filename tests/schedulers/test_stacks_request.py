"""The CLI side of a stack request (schedulers/stacks.py): no signal ever reaches a process,
whatever it is; a request goes only to a FIFO that the agent itself holds open."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.waiting import wait_for
from xrun.errors import UsageError
from xrun.runner import Runner
from xrun.schedulers.stacks import ask, ask_here, request_fifo

# A process that looks like an agent to `is_agent` (``-m xrun.runtime`` in its argv), handles no
# signal and holds no request FIFO: an older xrun's agent, or one still starting. Any signal
# other than SIGCHLD/SIGWINCH/SIGURG/SIGCONT would end it.
OLD_AGENT = "import time; time.sleep(120)"


@pytest.fixture
def old_agent(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    mark = uuid.uuid4().hex
    run_dir = tmp_path / "logs" / "run-id"  # what an older CLI took for "it has started"
    run_dir.mkdir(parents=True)
    env = {**os.environ, "XRUN_TEST_MARK": mark, "PET_LOG_DIR": str(tmp_path / "logs")}
    env |= {"XRUN_ROLE": "old", "XRUN_REPLICA_ID": "0"}
    p = subprocess.Popen([sys.executable, "-c", OLD_AGENT, "-m", "xrun.runtime"], env=env)
    wait_for(lambda: b"xrun.runtime" in Path(f"/proc/{p.pid}/cmdline").read_bytes(), 10)
    yield p, mark
    p.kill()
    p.wait()


def test_an_agent_without_a_request_fifo_is_not_asked(
    old_agent: tuple[subprocess.Popen[bytes], str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """What `docker exec` / `srun` run on a replica's host: the agent that cannot take a
    request is named in a note and left alone (an older CLI sent it SIGUSR1, which ends it)."""
    p, mark = old_agent
    monkeypatch.setenv("XRUN_TEST_MARK", mark)
    ask_here(1.0, ("XRUN_TEST_MARK",))  # only the agents of this test
    answers = json.loads(capsys.readouterr().out)
    assert [a["replica"] for a in answers] == ["old/0"]
    assert answers[0]["note"].startswith("its agent takes no stack requests yet")
    time.sleep(0.5)
    assert p.poll() is None


def test_a_fifo_nobody_reads_refuses_the_request(tmp_path: Path) -> None:
    """An agent that was killed leaves its FIFO behind: the write fails (ENXIO), one line."""
    fifo = tmp_path / "stacks.request"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(RuntimeError, match=r"^its agent has ended \(nothing reads"):
        ask(str(fifo))
    plain = tmp_path / "plain"
    plain.write_text("x")
    with pytest.raises(RuntimeError, match="is not a FIFO"):
        ask(str(plain))
    assert plain.read_text() == "x"


def test_request_fifo_is_found_in_the_agents_open_files(tmp_path: Path) -> None:
    fifo = tmp_path / "stacks.request"
    os.mkfifo(fifo, 0o600)
    fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    try:
        assert request_fifo(os.getpid()) == str(fifo)
        ask(str(fifo))
        assert os.read(fd, 16) == b"?"
    finally:
        os.close(fd)
    assert request_fifo(os.getpid()) == ""


@pytest.mark.parametrize("timeout", [0, 0.5, -1, float("nan"), float("inf"), True, "10"])
def test_runner_stacks_refuses_a_bad_timeout(timeout: object) -> None:
    with Runner() as r, pytest.raises(UsageError, match=r"^--timeout .* is invalid: expected"):
        r.stacks("local_cwd://default/nosuchapp-123", timeout)  # type: ignore[arg-type]
