"""Graceful stops (runtime/stop.py, runtime/stopping.py): a stop signal to ONE agent reaches
every rank on every node within a second, all ranks stop after the same step, and a rank that
saves for longer than --shutdown-timeout is not killed inside the grace."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from tests.helpers.net import free_port
from tests.helpers.paths import SCRIPTS
from tests.helpers.waiting import wait_for
from tests.runtime.agent.helpers import FAST, agent, popen

STOP_WORKER = str(SCRIPTS / "stop_worker.py")


def _two_agents(
    procs: list[subprocess.Popen[str]], out: Path, *extra: str, env: dict[str, str] | None = None
) -> list[subprocess.Popen[str]]:
    port = free_port()
    return [
        popen(
            procs,
            agent(
                "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "job",
                "--rdzv-conf", FAST, "--shutdown-timeout", "2", STOP_WORKER, str(out), *extra,
            ),
            env=env,
        )
        for _ in range(2)
    ]  # fmt: skip


def _stopped(out: Path) -> dict[int, dict[str, int]]:
    return {
        int(p.name.split(".")[1]): json.loads(p.read_text()) for p in out.glob("stopped.*.json")
    }


def test_sigterm_to_one_agent_stops_every_rank_at_one_step(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    a, b = _two_agents(procs, tmp_path)
    wait_for(lambda: len(list(tmp_path.glob("ready.*"))) == 4, timeout=120, what="4 ranks")
    t0 = time.time()
    b.send_signal(signal.SIGTERM)  # the other agent learns it through the store
    assert b.wait(timeout=60) == 128 + signal.SIGTERM, b.communicate()[1]
    assert a.wait(timeout=60) == 128 + signal.SIGTERM, a.communicate()[1]
    seen = {int(p.name.split(".")[1]): float(p.read_text()) for p in tmp_path.glob("seen.*")}
    assert sorted(seen) == [0, 1, 2, 3]
    late = {r: round(t - t0, 2) for r, t in seen.items() if t - t0 > 1.0}
    assert not late, f"ranks saw the stop request more than 1 s after the signal: {late}"
    stopped = _stopped(tmp_path)
    assert sorted(stopped) == [0, 1, 2, 3], stopped
    steps = {s["step"] for s in stopped.values()}
    assert len(steps) == 1 and steps == {s["agreed"] for s in stopped.values()}, stopped


def test_a_slow_saver_is_not_killed_inside_the_grace(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    # --shutdown-timeout is 2 s; the grace (XRUN_STOP_GRACE) 30 s; rank 3 saves for 6 s.
    env = {**os.environ, "XRUN_STOP_GRACE": "30"}
    a, b = _two_agents(procs, tmp_path, "3", "6", env=env)
    wait_for(lambda: len(list(tmp_path.glob("ready.*"))) == 4, timeout=120, what="4 ranks")
    a.send_signal(signal.SIGTERM)
    b.send_signal(signal.SIGTERM)
    assert a.wait(timeout=60) == 128 + signal.SIGTERM
    assert b.wait(timeout=60) == 128 + signal.SIGTERM
    stopped = _stopped(tmp_path)
    assert sorted(stopped) == [0, 1, 2, 3], stopped  # rank 3 finished its 6 s save


def test_workers_that_do_not_watch_still_get_the_signal(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    # tests/scripts/behave.py never calls xrun.runtime.stop: SIGTERM is forwarded at once.
    from tests.runtime.agent.helpers import BEHAVE

    p = popen(
        procs,
        agent("--nproc-per-node", "1", BEHAVE, str(tmp_path), "trap-term", "ready", "sleep:60"),
    )
    wait_for(lambda: list(tmp_path.glob("ready.*")), what="worker ready")
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=20) == 128 + signal.SIGTERM
    assert (tmp_path / "term.0").exists()


def test_a_warning_signal_sent_to_every_process_is_a_stop_not_a_death(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    # srun passes a time limit's --signal warning (USR2) on to every process of the step, the
    # workers too: its default action would end them at once, with nothing saved.
    p = popen(
        procs,
        agent(
            "--nproc-per-node", "2", "--shutdown-timeout", "2",
            "--signals-to-handle", "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR2",  # as on Slurm
            STOP_WORKER, str(tmp_path),
        ),
    )  # fmt: skip
    wait_for(lambda: len(list(tmp_path.glob("ready.*"))) == 2, timeout=120, what="2 ranks")
    workers = subprocess.run(
        ["pgrep", "-P", str(p.pid)], capture_output=True, text=True, check=True
    ).stdout.split()
    assert len(workers) == 2, workers
    for pid in workers:
        os.kill(int(pid), signal.SIGUSR2)
    p.send_signal(signal.SIGUSR2)
    assert p.wait(timeout=60) == 128 + signal.SIGUSR2, p.communicate()[1]
    stopped = _stopped(tmp_path)
    assert sorted(stopped) == [0, 1], stopped
    assert len({s["step"] for s in stopped.values()}) == 1, stopped
