"""Signals end to end: forwarded to the workers, handled while waiting for peers, and a
SIGKILLed agent leaves no workers behind."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

from tests.helpers.net import free_port
from tests.helpers.waiting import wait_for
from tests.runtime.agent.helpers import BEHAVE, agent, alive, events, popen, serving

# -- signals -------------------------------------------------------------------------------------


def test_sigterm_is_forwarded_to_workers(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    p = popen(
        procs,
        agent("--nproc-per-node", "2", BEHAVE, str(tmp_path), "trap-term", "ready", "sleep:60"),
    )
    wait_for(lambda: len(list(tmp_path.glob("ready.*"))) == 2, what="workers ready")
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=20) == 128 + signal.SIGTERM
    assert sorted(x.name for x in tmp_path.glob("term.*")) == ["term.0", "term.1"]
    assert json.loads((tmp_path / "term.0").read_text()) == signal.SIGTERM


def test_handled_sigusr2_is_forwarded_then_shutdown(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    p = popen(
        procs,
        agent(
            "--nproc-per-node",
            "1",
            "--signals-to-handle",
            "SIGTERM,SIGUSR2",
            "--shutdown-timeout",
            "1",
            BEHAVE,
            str(tmp_path),
            "ready",
            "sleep:60",
        ),
    )
    wait_for(lambda: list(tmp_path.glob("ready.*")), what="worker ready")
    pid = int(str(events(tmp_path)[0]["pid"]))
    p.send_signal(signal.SIGUSR2)  # the worker does not handle SIGUSR2: it dies of it
    assert p.wait(timeout=20) == 128 + signal.SIGUSR2
    assert not alive(pid)


def test_sigterm_while_waiting_for_peers(procs: list[subprocess.Popen[str]]) -> None:
    port = free_port()
    p = popen(
        procs,
        agent(
            "--nnodes",
            "2",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            "--rdzv-id",
            "lonely",
            BEHAVE,
            "/nonexistent",
        ),
    )

    # once it serves the store it is in next_rendezvous, waiting for a node that never comes
    wait_for(lambda: serving(port), what="the agent's rendezvous store")
    time.sleep(0.2)
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=20) == 128 + signal.SIGTERM
    assert time.monotonic() - t0 < 3
    assert "Traceback" not in p.communicate()[1]


def test_sigkill_of_agent_leaves_no_workers(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    p = popen(procs, agent("--nproc-per-node", "2", BEHAVE, str(tmp_path), "ready", "sleep:60"))
    wait_for(lambda: len(list(tmp_path.glob("ready.*"))) == 2, what="workers ready")
    pids = [int(str(e["pid"])) for e in events(tmp_path)]
    p.kill()
    p.wait()
    deadline = time.monotonic() + 1.0
    while any(alive(x) for x in pids) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(alive(x) for x in pids)
