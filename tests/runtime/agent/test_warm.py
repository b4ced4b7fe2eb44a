"""``--recover warm`` (issue #34): a restarted rank is a warm interpreter of the agent's pool.

Real agents, real gloo workers (tests/scripts/warm_ddp.py): each worker says whether torch was
imported before its script ran (``warm True``: a pool interpreter ran it). The faults wait for a
full pool (``--wait-warm``), so a restart meets ready interpreters; no timing is asserted (the
machine is busy), only what ran where and that the job finished.
"""

from __future__ import annotations

import glob
import os
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.helpers.net import free_port
from tests.helpers.paths import PY, SCRIPTS
from tests.runtime.agent.helpers import FAST, agent, alive, popen, run

WARM_DDP = str(SCRIPTS / "warm_ddp.py")
STARTED = re.compile(r"rank (\d+)/(\d+): started \(attempt (\d+)\) pid (\d+) warm (True|False)")


def started(out: str) -> dict[int, dict[int, bool]]:
    """attempt (the rendezvous round) -> rank -> warm, from the workers' start lines."""
    seen: dict[int, dict[int, bool]] = {}
    for m in STARTED.finditer(out):
        seen.setdefault(int(m[3]), {})[int(m[1])] = m[5] == "True"
    return seen


def steps(out: str) -> list[int]:
    return [int(s) for s in re.findall(r"step (\d+) t ", out)]


def warm_agent(*args: str, recover: str = "warm") -> list[str]:
    return agent("--recover", recover, "--tee", "3", *args)


def pool_pids(parent: int) -> set[int]:
    """Pids of the warm_child interpreters ``parent`` started (idle or running a rank)."""
    found = set()
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
            cmd = Path(f"/proc/{d}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent and b"warm_child.py" in cmd:
            found.add(int(d))
    return found


@pytest.mark.timeout(600)
def test_killed_rank_recovers_from_the_warm_pool_1x4(tmp_path: Path) -> None:
    p = run(
        warm_agent("--nproc-per-node", "4", "--max-restarts", "2", WARM_DDP, "--steps", "10",
                   "--die", "2:4:0", "--wait-warm", "4"),
        timeout=540, cwd=tmp_path,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    seen = started(p.stdout)
    assert seen[0] == dict.fromkeys(range(4), False)  # a first attempt is cold
    assert seen[1] == dict.fromkeys(range(4), True), p.stdout  # every rank replaced, warm
    assert "killed by SIGKILL" in p.stderr
    assert steps(p.stdout)[-10:] == list(range(10))


@pytest.mark.timeout(600)
def test_survivors_are_killed_at_once_not_after_the_shutdown_timeout(tmp_path: Path) -> None:
    """Survivors that ignore SIGTERM and hang in their failed collective (a rank that notes
    SIGTERM itself, as xrun.runtime.stop does) are SIGKILLed at once under --recover warm: the
    restart does not wait out --shutdown-timeout (1000 s, longer than this test may run)."""
    p = run(
        warm_agent("--nproc-per-node", "2", "--max-restarts", "1", "--shutdown-timeout", "1000",
                   WARM_DDP, "--steps", "4", "--die", "1:2:0", "--stubborn"),
        timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    assert set(started(p.stdout)[1]) == {0, 1}
    assert steps(p.stdout)[-4:] == list(range(4))


@pytest.mark.timeout(600)
def test_two_ranks_killed_at_once_and_a_second_fault_during_recovery(tmp_path: Path) -> None:
    """Ranks 1 and 3 die together; the restart's rank 0 fails at once (the pool is empty
    then: its children went to the first restart, the refill is still warming); the third
    attempt still forms and finishes."""
    p = run(
        warm_agent("--nproc-per-node", "4", "--max-restarts", "3", WARM_DDP, "--steps", "6",
                   "--die", "1:3:0,3:3:0", "--wait-warm", "4", "--fail-at-start", "1"),
        timeout=540, cwd=tmp_path,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    seen = started(p.stdout)
    assert seen[1][0] is True, p.stdout  # the first restart came from the pool
    assert set(seen.get(2, ())) == set(range(4)), p.stdout + p.stderr
    assert "restarting the workers (2/3)" in p.stderr
    assert "a second fault, during the recovery" in p.stderr
    assert steps(p.stdout)[-6:] == list(range(6))


@pytest.mark.timeout(600)
def test_killed_rank_on_the_second_node_recovers_warm_2x2(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    port = free_port()
    common = ("--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
              "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "warm2x2",
              "--rdzv-conf", FAST, "--max-restarts", "2")  # fmt: skip
    script = (WARM_DDP, "--steps", "8", "--die", "3:4:0", "--wait-warm", "2")
    agents = [popen(procs, warm_agent(*common, *script), cwd=tmp_path) for _ in range(2)]
    outs = [a.communicate(timeout=540) for a in agents]
    assert [a.returncode for a in agents] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    seen = started(outs[0][0] + outs[1][0])
    assert seen[1] == dict.fromkeys(range(4), True), seen  # both nodes replaced theirs warm
    assert any("killed by SIGKILL" in err for _, err in outs), outs[0][1] + outs[1][1]


@pytest.mark.timeout(300)
def test_the_pool_dies_with_the_agent_kill_9(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    a = popen(
        procs,
        warm_agent("--nproc-per-node", "2", WARM_DDP, "--steps", "100000", "--step-s", "1"),
        cwd=tmp_path,
    )
    deadline = time.monotonic() + 240
    pids: set[int] = set()
    while len(pids) < 4 and time.monotonic() < deadline:  # 2 workers + 2 idle interpreters
        time.sleep(0.5)
        pids = pool_pids(a.pid)
    assert len(pids) == 4, pids
    a.send_signal(signal.SIGKILL)
    a.wait(timeout=30)
    deadline = time.monotonic() + 30
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in pids if alive(p)]


@pytest.mark.timeout(300)
def test_the_pool_is_gone_after_the_job(tmp_path: Path) -> None:
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "xrun-warm-*")))
    p = run(warm_agent("--nproc-per-node", "2", WARM_DDP, "--steps", "3"), timeout=240,
            cwd=tmp_path)  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    after = set(glob.glob(os.path.join(tempfile.gettempdir(), "xrun-warm-*")))
    assert not after - before  # its folder went with it
    pids = {int(m[4]) for m in STARTED.finditer(p.stdout)}
    assert not [q for q in pids if alive(q)]


@pytest.mark.timeout(600)
def test_recover_off_restarts_cold_as_today(tmp_path: Path) -> None:
    p = run(
        warm_agent("--nproc-per-node", "2", "--max-restarts", "1", WARM_DDP, "--steps", "4",
                   "--die", "1:2:0", recover="off"),
        timeout=540, cwd=tmp_path,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    seen = started(p.stdout)
    assert seen[0] == seen[1] == {0: False, 1: False}  # cold interpreters, as before


def _normalized_logs(root: Path) -> dict[str, str]:
    """Every file under the attempt dirs, with pids, times and addresses masked."""
    out = {}
    (run_dir,) = root.iterdir()  # <log_dir>/<run id>: a random id per standalone job
    for f in sorted(run_dir.rglob("*")):
        if f.is_file():
            text = f.read_text(errors="replace")
            text = re.sub(r"\d+(\.\d+)?", "N", text).replace("warm True", "warm False")
            out[str(f.relative_to(run_dir))] = text
    return out


@pytest.mark.timeout(600)
def test_logs_tee_and_error_files_of_a_warm_worker_look_cold(tmp_path: Path) -> None:
    """The same failing rank under --recover off and warm: the same log files, the same lines
    in them and on the console, the same error report."""
    results = {}
    for mode, wait in (("off", "0"), ("warm", "2")):
        logs = tmp_path / mode
        p = run(
            warm_agent("--nproc-per-node", "2", "--max-restarts", "1", "--log-dir", str(logs),
                       WARM_DDP, "--steps", "4", "--raise-rank", "1",
                       "--wait-warm", wait, recover=mode),
            timeout=540, cwd=tmp_path,
        )  # fmt: skip
        assert p.returncode == 0, p.stderr[-3000:]
        results[mode] = (p, _normalized_logs(logs))
    (off, off_logs), (warm, warm_logs) = results["off"], results["warm"]
    assert started(warm.stdout)[1] == {0: True, 1: True}
    assert off_logs.keys() == warm_logs.keys()
    for name, text in off_logs.items():
        # rank 0 of the failed attempt: gloo's error or the agent's SIGTERM, whichever is first
        if not name.startswith("attempt_") or name.startswith("attempt_0/0/"):
            continue
        assert warm_logs[name] == text, name
    for line in ("[default1]:rank 1: out before the error", "[default1]:rank 1: err before"):
        assert line in off.stdout + off.stderr
        assert line in warm.stdout + warm.stderr
    tb = [ln for ln in warm.stderr.splitlines() if "warm_child" in ln or "runpy" in ln]
    assert not tb, tb  # no frame of ours in a worker's traceback


def test_a_python_command_is_what_the_pool_serves() -> None:
    from xrun.runtime.workers.pool import parse_command

    c = parse_command([PY, "-u", "train.py", "--lr", "1"])
    assert c is not None and c.flags == ("-u",) and c.argv == ("train.py", "--lr", "1")
    m = parse_command([PY, "-u", "-m", "pkg.train", "x"])
    assert m is not None and m.module == "pkg.train" and m.argv == ("pkg.train", "x")
    assert parse_command(["/bin/sh", "train.sh"]) is None
    assert parse_command([PY, "-X", "dev", "train.py"]) is None  # shapes the interpreter
    assert parse_command([PY, "-u"]) is None


def test_bad_recover_is_one_usage_line() -> None:
    p = run(agent("--recover", "hot", WARM_DDP), timeout=60)
    assert p.returncode == 2
    assert "--recover 'hot' is invalid: expected off or warm" in p.stderr


def test_the_agent_imports_no_pool_without_recover() -> None:
    code = (
        "import sys\nfrom xrun.runtime.args import parse\n"
        "parse(['--nproc-per-node', '2', 'x.py'])\n"
        "import xrun.runtime.agent\n"
        "print(any('pool' in m or 'warm' in m for m in sys.modules))\n"
    )
    p = run([PY, "-c", code], timeout=60)
    assert p.stdout.strip() == "False", p.stderr


def test_a_command_the_pool_cannot_run_starts_cold(tmp_path: Path) -> None:
    p = run(warm_agent("--no-python", "echo", "hello"), timeout=60, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "[default0]:hello" in p.stdout
    assert "--recover warm serves `python [-u] script|-m module` workers" in p.stderr


@pytest.mark.timeout(120)
def test_a_refill_after_a_restart_waits_for_the_watch_loop(tmp_path: Path) -> None:
    """The first fill spawns at once; a restart's refill is spawned only by a later ``tick``
    from the agent's watch loop, not beside the replaced workers while they form their group
    (spawning interpreters then slowed their init_process_group by ~0.15 s on 2 cores)."""
    from xrun.runtime.workers import pool as pool_mod

    pool = pool_mod.WarmPool(pool_mod.Command(PY, (), None, ("x.py",)), 2, str(tmp_path))
    try:
        pool.refill({0: {}})
        assert len(pool._idle) == 2  # the first fill: at once
        for c in list(pool._idle):
            pool._discard(c)
        pool._idle.clear()
        pool.refill({0: {}})  # after a restart
        assert pool._idle == []
        wait = pool.tick(None)
        assert wait is not None and 0 < wait <= pool_mod.REFILL_AFTER
        assert pool.tick(30.0) == pytest.approx(wait, abs=0.5)  # the loop wakes up for it
        assert pool._idle == []
        time.sleep(wait + 0.05)
        assert pool.tick(7.0) == 7.0
        assert len(pool._idle) == 2
        assert pool.tick(None) is None  # nothing pending any more
    finally:
        pool.close()
