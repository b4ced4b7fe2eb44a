"""Issue #17, the agent side: bounded flags, a bad --log-dir, and SIGTERM/SIGINT at any point.

Every agent here runs in a box (tests/helpers/box.py): ``timeout -s KILL`` and TMPDIR/--log-dir on
a small tmpfs, so a regression (a flag that turns into unbounded work, an agent that ignores
SIGTERM while it starts workers) fails the test instead of filling the machine's disk or inodes.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.box import BOX_TIMEOUT_S, boxed, tmpfs
from tests.helpers.net import free_port
from tests.helpers.paths import PY
from tests.runtime.agent.helpers import BEHAVE, FAST, agent, by_rank, check_world, events, popen

HUGE = "9" * 6000  # past Python's int-string limit


@pytest.fixture
def box(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "box") as path:
        yield path


def agent_usage_error(box: Path, *flags: str, must: tuple[str, ...] = ()) -> str:
    r = boxed([PY, "-m", "xrun.runtime", "--standalone", *flags, "--no-python", "/bin/true"], box)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("xrun-agent: error: "), r.stderr[-2000:]
    assert len(lines[0]) < 600, lines[0][:300]  # a 6,000-digit value is named, not repeated
    for text in must:
        assert text in lines[0], (text, lines[0])
    return lines[0]


@pytest.mark.parametrize(
    "flags, must",
    [
        # the example: accepted before, then ~17,000 log directories a second
        (["--nproc-per-node", "99999999999999999999"], ("--nproc-per-node", "4,096")),
        (["--nproc-per-node", "4097"], ("4,096",)),
        (["--nproc-per-node", HUGE], ("4,096", "6,000 characters")),
        (["--nproc-per-node", "１"], ("--nproc-per-node",)),  # only ASCII digits
        (["--nnodes", "1:65537", "--rdzv-endpoint", "localhost:1"], ("65,536",)),
        (["--nnodes", HUGE], ("65,536",)),
        (["--nnodes", "٣"], ("--nnodes",)),
        (["--max-restarts", HUGE], ("--max-restarts",)),
        (["--shutdown-timeout", "inf"], ("--shutdown-timeout", "one day")),
        (["--shutdown-timeout", "nan"], ("--shutdown-timeout",)),
        (["--monitor-interval", "1e400"], ("--monitor-interval",)),
        (["--rdzv-conf", "join_timeout=nan"], ("join_timeout",)),
    ],
)
def test_absurd_agent_flags_are_one_line_naming_the_limit(
    box: Path, flags: list[str], must: tuple[str, ...]
) -> None:
    agent_usage_error(box, *flags, must=must)
    assert os.listdir(box) == []  # refused before anything was created


def test_launch_config_has_the_same_bounds() -> None:
    from xrun.errors import UsageError
    from xrun.runtime.config import LaunchConfig

    for kw, text in (
        ({"nproc_per_node": 4097}, "4,096"),
        ({"min_nodes": 1, "max_nodes": 65537, "rdzv_endpoint": "h:1"}, "65,536"),
        ({"shutdown_timeout": float("inf")}, "shutdown_timeout"),
        ({"monitor_interval": float("nan")}, "monitor_interval"),
    ):
        with pytest.raises(UsageError, match=text):
            LaunchConfig(**kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "log_dir, why",
    [
        ("/proc/nope", "No such file or directory"),
        ("/etc/passwd", "not a directory"),
        ("/etc/passwd/sub", "Not a directory"),
    ],
)
def test_an_agent_log_dir_at_a_bad_path_is_one_line(box: Path, log_dir: str, why: str) -> None:
    agent_usage_error(box, "--log-dir", log_dir, must=("--log-dir", log_dir, why))


def test_an_agent_log_dir_that_fills_up_is_one_line(tmp_path: Path) -> None:
    """A log dir with room for the run's directory but not for 100 workers' directories."""
    with tmpfs(tmp_path / "box") as box, tmpfs(tmp_path / "tiny", inodes=40) as tiny:
        agent_usage_error(
            box, "--log-dir", str(tiny), "--nproc-per-node", "100", must=("No space left",)
        )
    with tmpfs(tmp_path / "box") as box, tmpfs(tmp_path / "ro", read_only=True) as ro:
        agent_usage_error(box, "--log-dir", str(ro / "logs"), must=("Read-only file system",))


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_the_agent_starts_many_workers_stops_it_at_once(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """The issue's hang: SIGTERM one second into the start of many workers was ignored until
    every worker had started (with 10^20 workers: never). Now the agent stops at once, takes
    down the workers it started, and records how it ended."""
    n = 2000
    with tmpfs(tmp_path / "box", size="64m", inodes=20_000) as box:
        record = box / "exit.json"
        env = {**os.environ, "TMPDIR": str(box), "XRUN_EXIT_RECORD": str(record)}
        cmd = ["timeout", "-s", "KILL", str(BOX_TIMEOUT_S), PY, "-m", "xrun.runtime"]
        cmd += ["--standalone", "--nproc-per-node", str(n), "--log-dir", str(box / "logs")]
        cmd += ["--no-python", "/bin/sleep", "60"]
        proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True, cwd=box)
        try:
            deadline = time.monotonic() + BOX_TIMEOUT_S
            agent: list[int] = []
            while not agent or len(_children(agent[0])) < 20:  # mid-start: some workers run
                assert time.monotonic() < deadline and proc.poll() is None, "no workers started"
                agent = agent or _children(proc.pid)
                time.sleep(0.01)
            started = _children(agent[0])
            assert len(started) < n, "all workers started before the signal: no start-up left"
            t0 = time.monotonic()
            os.kill(agent[0], sig)
            _, err = proc.communicate(timeout=BOX_TIMEOUT_S)
            took = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                proc.kill()
        # Before the fix the agent ran on until the KILL of `timeout` (137), 17 s later.
        assert proc.returncode == 128 + sig, (proc.returncode, err[-2000:])
        assert took < 5, f"the agent took {took:.1f}s to stop"
        assert "Traceback" not in err, err[-2000:]
        assert json.loads(record.read_text())["exitcode"] == 128 + sig
    time.sleep(0.2)
    survivors = [p for p in started if Path(f"/proc/{p}").exists() and _not_zombie(p)]
    assert survivors == []


def _not_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


# --------------------------------------------------------------------------- the IPv6 race
def _hold(port: int) -> socket.socket:
    """[::1]:PORT bound, not listening: what an outgoing connection that got PORT as its
    (ephemeral) local port looks like to an agent that binds it."""
    s = socket.socket(socket.AF_INET6)
    s.bind(("::1", port))
    return s


def _two_agents(procs: list[subprocess.Popen[str]], port: int, out: Path, conf: str) -> list:
    cmd = agent("--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d")
    cmd += ["--rdzv-endpoint", f"[::1]:{port}", "--rdzv-id", "v6", "--rdzv-conf", conf]
    return [popen(procs, [*cmd, BEHAVE, str(out)]) for _ in range(2)]


def test_an_endpoint_port_held_by_a_socket_that_serves_nothing(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    """``test_two_agents_over_ipv6``'s flake: its port (picked free on 127.0.0.1, from the
    ephemeral range) was taken on ::1 by another connection's local port. Both agents then
    took the store for another agent's, and both gave up after join_timeout: "could not reach
    the rendezvous store at ::1:PORT: Connection refused". Now they bind again until one
    serves it, and say what is wrong when none can."""
    port = free_port("::1")
    holder = _hold(port)
    agents = _two_agents(procs, port, tmp_path, FAST.replace("join_timeout=30", "join_timeout=20"))
    time.sleep(1.5)  # both agents found the port taken by then
    holder.close()
    for a in agents:
        assert a.wait(timeout=60) == 0, a.communicate()[1][-3000:]
    check_world(by_rank(events(tmp_path)), [1, 1])

    port = free_port("::1")
    with _hold(port):
        conf = FAST.replace("join_timeout=30", "join_timeout=2")
        for a in _two_agents(procs, port, tmp_path / "held", conf):
            assert a.wait(timeout=60) == 2
            err = a.communicate()[1]
            assert "Traceback" not in err
            assert f"[::1]:{port}: the port is taken on this host by a socket that serves" in err
