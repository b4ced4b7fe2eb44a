"""The agent's diagnostic hooks end to end (runtime/diagnose/watch.py): the stall watchdog on a
real hung gloo job, what counts as progress (output, beats, another node's output), survivors'
stacks in a failure report, and an agent's answer to a stack request."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.helpers.net import free_port
from tests.helpers.paths import SCRIPTS
from tests.helpers.waiting import wait_for
from tests.runtime.agent.helpers import FAST, agent, popen, run
from xrun.schedulers.stacks import ask, request_fifo

HANG = SCRIPTS / "hang.py"

# A torch-free worker: "talk" prints a line every 0.5 s, "beat" calls xrun's beat() as often
# and prints nothing, "quiet" prints "start" (its sign of life: the stall clock runs from
# there) and then nothing; each for SECONDS, then exits 0.
PACE = """
import os, sys, time
from xrun.runtime.diagnose.beat import beat

mode, seconds = sys.argv[1], float(sys.argv[2])
if mode == "rank0-talks":
    mode = "talk" if os.environ["RANK"] == "0" else "quiet"

def quiet_here(until):
    while time.monotonic() < until:
        time.sleep(0.5)

end = time.monotonic() + seconds
if mode == "quiet":
    print("start", flush=True)
    quiet_here(end)
while time.monotonic() < end:
    if mode == "talk":
        print("tick", flush=True)
    else:
        beat()
    time.sleep(0.5)
"""


def line_of(text: str) -> int:
    return next(i for i, ln in enumerate(HANG.read_text().splitlines(), 1) if text in ln)


# The two rendezvous of a multi-node job: c10d's store one agent serves, and the cluster's etcd
# (the test suite's, see tests/helpers/etcd.py); etcd's shortest lease is 2 s.
BACKENDS = ["c10d", "etcd"]
ETCD_FAST = "heartbeat_interval=0.3,heartbeat_timeout=2,last_call_timeout=0.5,join_timeout=30"


def rdzv(backend: str, request: pytest.FixtureRequest) -> tuple[str, ...]:
    """A new job's rendezvous arguments on ``backend``."""
    if backend == "c10d":
        endpoint, conf, rid = f"127.0.0.1:{free_port()}", FAST, "job"
    else:  # etcd outlives a test: one job's keys per test
        endpoint, conf = request.getfixturevalue("etcd"), ETCD_FAST
        rid = f"stall-{uuid.uuid4().hex[:10]}"
    return (
        "--rdzv-backend",
        backend,
        "--rdzv-endpoint",
        endpoint,
        "--rdzv-id",
        rid,
        "--rdzv-conf",
        conf,
    )


@pytest.mark.timeout(120)
def test_stall_names_the_hung_rank_and_frame_then_restarts(tmp_path: Path) -> None:
    t0 = time.monotonic()
    p = run(
        agent(
            "--nproc-per-node",
            "2",
            "--stall-timeout",
            "6",
            "--max-restarts",
            "1",
            "--log-dir",
            str(tmp_path),
            "--tee",
            "3",
            str(HANG),
            "1000",
            "--hang-rank",
            "1",
            "--hang-step",
            "3",
        ),
        timeout=110,
    )
    took = time.monotonic() - t0
    assert p.returncode == 1, p.stderr
    reason = (
        f"stalled 6 s: rank 1 in stuck_here (hang.py:{line_of('time.sleep(3600)')}); "
        f"rank 0 in all_reduce (hang.py:{line_of('dist.all_reduce(t)')})"
    )
    assert f"{reason}; restarting the workers (1/1)" in p.stderr  # the first attempt
    assert f"\nxrun-agent: {reason}\n" in p.stderr  # the second, the job's root cause
    tail = p.stderr.split(f"xrun-agent: {reason}\n", 1)[1]
    assert tail.startswith("rank 1 (1/2) on ")  # the grouped stacks follow it
    assert f"    stuck_here ({HANG}:{line_of('time.sleep(3600)')})" in tail
    assert [d.name for d in sorted(next(tmp_path.iterdir()).iterdir())] == [
        "attempt_0",
        "attempt_1",
    ]
    assert p.stdout.count("step 3") == 4  # both ranks reached step 3, twice
    # two stalls, each found within 10 s (test_progress.py times one from the hang), plus two
    # start-ups of torch in two workers, which take up to 20 s each on a 2-core host at load 20+
    assert took < 2 * (6 + 10 + 20), took


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("mode", "tee", "stalls"),
    [("talk", "3", False), ("talk", "", False), ("beat", "", False), ("quiet", "3", True)],
)
def test_output_and_beats_are_progress(tmp_path: Path, mode: str, tee: str, stalls: bool) -> None:
    """Output counts through the log files (--tee 3, as dist.ddp), or through the agent's own
    stdout when the workers write there and it is a file (a scheduler's replica log)."""
    script = tmp_path / "pace.py"
    script.write_text(PACE)
    logs = ("--log-dir", str(tmp_path / "logs"))
    cmd = agent("--nproc-per-node", "2", "--stall-timeout", "2", *logs, str(script), mode, "5")
    if tee:
        p = run(cmd[:3] + ["--tee", tee] + cmd[3:])
    else:
        with open(tmp_path / "replica.log", "w") as out:
            p = subprocess.run(cmd, stdout=out, stderr=subprocess.PIPE, text=True, timeout=60)
    if not stalls:
        assert p.returncode == 0, p.stderr
        assert "stalled" not in p.stderr
    else:
        assert p.returncode == 1
        line = next(ln for ln in p.stderr.splitlines() if "stalled" in ln)
        assert line == "xrun-agent: stalled 2 s: ranks 0,1 in quiet_here (pace.py:11)"


# A silent worker whose only sign of life is torch's FileTimerClient: after importing torch it
# says "ready" (output: progress), then for SECONDS enters and leaves expires() blocks in silence.
TIMED = """
import os, sys, time
from torch.distributed.elastic.timer import FileTimerClient, configure, expires

configure(FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
print("ready", flush=True)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    with expires(after=60):
        time.sleep(0.5)
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("timer", [True, False])
def test_file_timer_requests_are_progress(tmp_path: Path, timer: bool) -> None:
    """With TORCHELASTIC_ENABLE_FILE_TIMER=1 a worker's expires() blocks keep the watchdog
    quiet; requests that go to a FIFO the test drains instead of the agent's timer do too:
    they are writes, and a worker that writes is not stalled (issue #31). With its 3 s
    timeout, the old watchdog killed this job inside `import torch` on a busy host."""
    script = tmp_path / "timed.py"
    script.write_text(TIMED)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC_")}
    drained, done = threading.Event(), threading.Event()
    if timer:
        env["TORCHELASTIC_ENABLE_FILE_TIMER"] = "1"
    else:
        fifo = tmp_path / "elsewhere.fifo"
        os.mkfifo(fifo)
        env["TORCHELASTIC_TIMER_FILE"] = str(fifo)
        # read and write end in one: the FIFO never reads as EOF between the client's opens
        fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)

        def drain() -> None:
            while not done.wait(0.1):
                try:
                    if os.read(fd, 4096):
                        drained.set()
                except BlockingIOError:
                    pass
            os.close(fd)

        threading.Thread(target=drain, daemon=True).start()
    logs = ("--log-dir", str(tmp_path / "logs"), "--tee", "3")
    cmd = agent("--nproc-per-node", "1", "--stall-timeout", "3", *logs, str(script), "8")
    try:
        p = run(cmd, env=env, timeout=110)
    finally:
        done.set()
    assert drained.is_set() != timer  # the worker really sent its requests there
    assert p.returncode == 0, p.stderr
    assert "stalled" not in p.stderr


@pytest.mark.timeout(90)
@pytest.mark.parametrize("backend", BACKENDS)
def test_another_nodes_output_is_progress(
    tmp_path: Path, procs: list, backend: str, request: pytest.FixtureRequest
) -> None:
    """Only rank 0 prints (the usual training script): node 1's quiet workers do not stall, on
    etcd too (its agents share progress in group rank 0's store: etcd_agent_kv.py)."""
    script = tmp_path / "pace.py"
    script.write_text(PACE)
    job = rdzv(backend, request)
    agents = [
        popen(
            procs,
            agent(
                *("--nnodes", "2", "--nproc-per-node", "1", *job),
                *("--stall-timeout", "2", "--tee", "3"),
                *("--log-dir", str(tmp_path / f"logs{i}"), str(script), "rank0-talks", "6"),
            ),
        )
        for i in range(2)
    ]
    for a in agents:
        out, err = a.communicate(timeout=60)
        assert a.returncode == 0, err
        assert "stalled" not in err


@pytest.mark.timeout(120)
def test_survivors_stacks_are_in_the_failure_report(tmp_path: Path) -> None:
    p = run(
        agent(
            "--nproc-per-node",
            "3",
            "--log-dir",
            str(tmp_path),
            str(HANG),
            "1000",
            *("--hang-rank", "1", "--hang-step", "2", "--fail", "--others-wait"),
        ),
        timeout=110,
    )
    assert p.returncode == 1
    summary, survivors = p.stderr.split(
        "Where the other ranks were (stacks before they were stopped):\n"
    )
    assert "Root Cause (first observed failure):" in summary and "rank      : 1" in summary
    first = survivors.splitlines()[0]
    assert first.startswith("ranks 0,2 (2/2) on ")
    assert first.endswith(f": waiting_here (hang.py:{line_of('time.sleep(60)')})")


@pytest.mark.timeout(60)
def test_an_agent_answers_a_stack_request_for_a_binary_worker(tmp_path: Path, procs: list) -> None:
    a = popen(
        procs,
        agent(
            *("--nproc-per-node", "2", "--no-python", "--log-dir", str(tmp_path)),
            *("sleep", "60"),
        ),
    )
    wait_for(lambda: list(tmp_path.glob("*/attempt_0/1")), 20, "the workers' dirs")
    time.sleep(0.3)  # the workers exec sleep
    wait_for(lambda: request_fifo(a.pid), 20, "the agent's request FIFO")
    fifo = request_fifo(a.pid)
    assert fifo == str(next(tmp_path.glob("*/stacks.request")))
    ask(fifo)
    answers = wait_for_file(tmp_path, 20)
    doc = json.loads(answers.read_text())
    assert sorted(doc["ranks"]) == ["0", "1"] and doc["agent_pid"] == a.pid
    for r in doc["ranks"].values():
        assert r["error"] == f"no Python stack: pid {r['pid']} runs sleep, not a Python interpreter"
    assert a.poll() is None  # the request did not stop anything
    a.send_signal(signal.SIGTERM)
    assert a.wait(30) == 128 + signal.SIGTERM


def wait_for_file(base: Path, timeout: float) -> Path:
    wait_for(lambda: list(base.glob("*/stacks.json")), timeout, "stacks.json")
    return next(base.glob("*/stacks.json"))


def test_a_bad_stall_timeout_is_one_line(tmp_path: Path) -> None:
    p = run(agent("--stall-timeout", "soon", str(HANG), "1"))
    assert p.returncode == 2
    assert p.stderr == (
        "xrun-agent: error: --stall-timeout 'soon' is invalid: expected 0 (off) or a number of "
        "seconds from 1 to 86400 (one day)\n"
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_node_names_the_hung_rank_of_another_node(
    tmp_path: Path, procs: list, backend: str, request: pytest.FixtureRequest
) -> None:
    """Two nodes, one worker each, rank 1 (node 1) hangs: both agents' root cause has every
    rank, shared through the store (on etcd: group rank 0's), so node 0's report names rank 1
    too; on etcd the shared progress still lets the hang be caught."""
    job = rdzv(backend, request)
    agents = [
        popen(
            procs,
            agent(
                *("--nnodes", "2", "--nproc-per-node", "1", *job),
                *("--stall-timeout", "5", "--tee", "3"),
                *("--log-dir", str(tmp_path / f"logs{i}"), str(HANG), "1000"),
                *("--hang-rank", "1", "--hang-step", "2"),
            ),
        )
        for i in range(2)
    ]
    reason = (
        f"stalled 5 s: rank 1 in stuck_here (hang.py:{line_of('time.sleep(3600)')}); "
        f"rank 0 in all_reduce (hang.py:{line_of('dist.all_reduce(t)')})"
    )
    errs = []
    for a in agents:
        _, err = a.communicate(timeout=100)
        assert a.returncode == 1, err
        errs.append(err)
    # each agent found the stall itself, or learnt it from the one that closed the job first
    assert all(reason in err for err in errs), errs
