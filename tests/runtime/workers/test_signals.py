"""start_processes' signals and clean-up: close escalates, signals reach the group, workers die
with their agent."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import time

import pytest

from tests.helpers.waiting import poll_until
from tests.runtime.workers.helpers import PY, alive, envs, ready_code
from xrun.runtime.workers.api import start_processes

# -- signals and clean-up -----------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_close_escalates_to_sigkill_and_kills_the_group(tmp_path):
    ready = tmp_path / "ready"
    code = textwrap.dedent(
        f"""
        import signal, subprocess, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = subprocess.Popen(["sleep", "60"])  # stays in the worker's process group
        open({str(ready)!r}, "w").write(str(child.pid))
        time.sleep(60)
        """
    )
    ctx = start_processes("bin", PY, {0: ("-c", code)}, {0: {}})
    assert poll_until(ready.exists, 20) and poll_until(lambda: ready.read_text() != "", 5)
    grandchild = int(ready.read_text())
    t0 = time.monotonic()
    ctx.close(death_sig=signal.SIGTERM, timeout=0.5)
    took = time.monotonic() - t0
    assert 0.4 < took < 3
    assert not alive(ctx.pids()[0])
    assert ctx._workers[0].exitcode == -signal.SIGKILL
    assert not os.path.exists(f"/proc/{ctx.pids()[0]}")  # reaped: no zombie left behind
    assert poll_until(lambda: not alive(grandchild), 2)


@pytest.mark.timeout(30)
def test_signal_is_forwarded_to_the_group():
    ctx = start_processes("bin", "sleep", {0: ("30",), 1: ("30",)}, envs(2))
    try:
        ctx.signal(signal.SIGUSR1)
        result = ctx.wait(timeout=20)
    finally:
        ctx.close()
    assert result.failures[min(result.failures)].signal_name() == "SIGUSR1"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["binary", "function"])
def test_workers_die_with_the_agent(tmp_path, kind):
    pids_file = tmp_path / "pids.json"
    fn_args = {r: (ready_code(tmp_path / f"ready{r}"),) for r in (0, 1)}
    script = tmp_path / "agent.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import json, os, sys, time
            from xrun.runtime import start_processes
            if __name__ == "__main__":  # spawn children import this file again
                if {kind!r} == "binary":
                    entry, args = "sleep", {{0: ("60",), 1: ("60",)}}
                else:
                    # builtins.exec: a function whose spawn child imports nothing more
                    entry, args = exec, {fn_args!r}
                ctx = start_processes("a", entry, args, {{0: {{}}, 1: {{}}}})
                with open({str(pids_file)!r} + ".tmp", "w") as fp:
                    json.dump(list(ctx.pids().values()), fp)
                os.replace({str(pids_file)!r} + ".tmp", {str(pids_file)!r})
                time.sleep(60)
            """
        )
    )
    # TMPDIR: the killed agent cannot remove its scratch dir; keep it inside tmp_path
    agent = subprocess.Popen([PY, str(script)], env={**os.environ, "TMPDIR": str(tmp_path)})
    try:
        assert poll_until(pids_file.exists, 40)
        pids = json.loads(pids_file.read_text())
        if kind == "function":  # running the function: past the prctl
            ready = [tmp_path / "ready0", tmp_path / "ready1"]
            assert poll_until(lambda: all(p.exists() for p in ready), 40)
        assert all(alive(p) for p in pids)
        agent.kill()
        agent.wait()
        t0 = time.monotonic()
        assert poll_until(lambda: not any(alive(p) for p in pids), 1.0), (
            "workers outlived the agent"
        )
        assert time.monotonic() - t0 < 1.0
    finally:
        agent.kill()
        agent.wait()


@pytest.mark.timeout(60)
def test_worker_whose_agent_died_before_its_prctl_exits(tmp_path):
    # The agent exits right after the start; a spawn child needs far longer to boot, so the
    # agent is gone before the child can ask for PDEATHSIG: its getppid check must catch that.
    pids_file, ready = tmp_path / "pids.json", tmp_path / "ready"
    script = tmp_path / "agent.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import json, os
            from xrun.runtime import start_processes
            if __name__ == "__main__":
                ctx = start_processes("a", exec, {{0: ({ready_code(ready)!r},)}}, {{0: {{}}}})
                with open({str(pids_file)!r}, "w") as fp:
                    json.dump(list(ctx.pids().values()), fp)
                os._exit(0)
            """
        )
    )
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # the agent's scratch dir stays behind
    subprocess.run([PY, str(script)], timeout=40, check=True, env=env)
    pids = json.loads(pids_file.read_text())
    assert poll_until(lambda: not any(alive(p) for p in pids), 20), "orphaned worker survived"
    assert not ready.exists()  # it never ran the user's function
