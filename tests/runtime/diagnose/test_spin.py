"""The spin rule (issue #31): a rank that spins in a collective wait that never ends (NCCL's
``dist.barrier()`` or ``work.wait()``, which CUDA's default wait spins at ~100 % CPU) is a stall
at --stall-timeout, not only at the silent limit; a healthy job that computes silently, or loops
through ``.item()`` (even with nothing changing between samples), is not; a job that shows signs
of life never has its stacks read.

The spin is simulated on CPU honestly where it matters to the rule: a C-level busy loop (a
regular expression that backtracks for ever, or pbkdf2) that holds the main thread's innermost
Python frame where a GPU wait would: in a function of a module at ``torch/distributed/`` in a
site-packages dir, or on a user line that calls ``.wait()``. Real agents, workers and py-spy."""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import IO

import pytest

from tests.runtime.agent.helpers import agent, run
from xrun.runtime.diagnose.spin import is_wait
from xrun.runtime.diagnose.stacks import find_pyspy

# A C busy loop: backtracking over 2**64 ways, holding the caller's Python frame, as CUDA's
# spin-wait does under torch.cuda.synchronize()
SPIN = 're.compile(r"(a+)+$").match, "a" * 64 + "b"'

C10D = f"""import re

_SPIN = {SPIN.split(",")[0]}


def barrier():
    _SPIN({SPIN.split(", ", 1)[1]})  # NCCL's barrier: work.wait() then a stream sync
"""

WORKER = f"""import functools, importlib.util, os, re, sys, time

spec = importlib.util.spec_from_file_location("c10d", sys.argv[1])
c10d = importlib.util.module_from_spec(spec)
spec.loader.exec_module(c10d)


class Work:  # an async collective's handle whose collective hung: wait() spins
    wait = functools.partial({SPIN})


def train(rank):
    work = Work()
    for step in range(3):
        print("step", step, flush=True)
        time.sleep(0.3)
    if rank == 0:
        c10d.barrier()
    return work.wait()


train(int(os.environ["RANK"]))
"""


def _timed(cmd: list[str], limit: float) -> tuple[int, str, dict[str, float]]:
    """Run the agent; its return code, stderr, and when each line was first seen."""
    seen: dict[str, float] = {}
    err: list[str] = []
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
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
        proc.wait(limit)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for r in readers:
        r.join(10)
    return proc.returncode, "".join(err), seen


def _line(text: str, of: str) -> int:
    return next(i for i, ln in enumerate(of.splitlines(), 1) if text in ln)


@pytest.mark.timeout(150)
def test_ranks_spinning_in_a_wait_are_caught_within_the_timeout_and_10_s(tmp_path: Path) -> None:
    """Rank 0 spins in barrier() of torch.distributed, rank 1 in a user line's work.wait(): at
    100 % CPU the work rule called both healthy and only the 60 s silent limit ended them."""
    c10d = tmp_path / "site-packages" / "torch" / "distributed" / "distributed_c10d.py"
    c10d.parent.mkdir(parents=True)
    c10d.write_text(C10D)
    script = tmp_path / "spin.py"
    script.write_text(WORKER)
    cmd = agent("--nproc-per-node", "2", "--stall-timeout", "3", "--stall-silent-timeout", "60")
    rc, err, seen = _timed([*cmd, str(script), str(c10d)], 140)
    assert rc == 1, err
    hang = seen["step 2"] + 0.3
    line = next((ln for ln in seen if ln.startswith("xrun-agent: stalled ")), "")
    assert line, err
    assert seen[line] - hang <= 3 + 10, (seen[line] - hang, err)
    item, barrier = _line("return work.wait()", WORKER), _line("c10d.barrier()", WORKER)
    assert re.fullmatch(
        rf"xrun-agent: stalled 3 s: rank 1 waits in train \(spin.py:{item}\) at \d+ % CPU "
        rf"\(spinning\); rank 0 waits in barrier \(spin.py:{barrier}\) at \d+ % CPU \(spinning\)",
        line,
    ), line
    assert re.search(r"rank 0 \(1/2\) on \S+: barrier \(spin.py:\d+\), spinning at \d+ % CPU", err)


HEALTHY = """import functools, hashlib, os, sys, time

ITER = 20000
t0 = time.perf_counter()
hashlib.pbkdf2_hmac("sha256", b"k", b"s", ITER)
ITER = max(1000, int(ITER * 0.2 / max(time.perf_counter() - t0, 1e-6)))  # ~0.2 s a call


class Loss:  # a GPU loop's loss: .item() waits (spins) ~99 % of the time
    item = functools.partial(hashlib.pbkdf2_hmac, "sha256", b"k", b"s", ITER)


def train():
    loss, total = Loss(), 0
    print("ready", flush=True)
    end = time.monotonic() + float(sys.argv[1])
    step = 0
    while time.monotonic() < end:
        step += 1
        total += len(loss.item())
    print("done", step, flush=True)


train()
"""


# A GPU-bound loop at module level: nothing changes between samples (no function locals), and
# its time goes to the sync line. On an H200 (benchmarks/gpu_checks.py) this was ended as a
# spin after S when GPU syncs counted as waits.
GPU_LOOP = f"""import functools, re, sys, time


class X:  # the GPU's result: .item() waits on the device and spins
    item = functools.partial({SPIN.split(",")[0]}, "a" * 20 + "b")


x = X()
print("ready", flush=True)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    x.item()
print("done", flush=True)
"""


@pytest.mark.timeout(120)
def test_a_silent_gpu_bound_loop_at_module_level_is_not_a_stall(tmp_path: Path) -> None:
    script = tmp_path / "gpuloop.py"
    script.write_text(GPU_LOOP)
    logs = ("--log-dir", str(tmp_path / "logs"), "--tee", "3")
    p = run(
        [*agent("--nproc-per-node", "1", "--stall-timeout", "2", *logs, str(script)), "12"], 110
    )
    assert p.returncode == 0, p.stderr
    assert "done" in p.stdout and "stalled" not in p.stderr


@pytest.mark.timeout(120)
def test_a_silent_loop_through_item_is_not_a_stall(tmp_path: Path) -> None:
    """A healthy loop that spends nearly all its time in the same .item() line is sampled there
    every time; its step counter changes between samples, so it is not a spin (12 s silent
    against a 2 s timeout)."""
    script = tmp_path / "loop.py"
    script.write_text(HEALTHY)
    logs = ("--log-dir", str(tmp_path / "logs"), "--tee", "3")
    p = run(
        [*agent("--nproc-per-node", "1", "--stall-timeout", "2", *logs, str(script)), "12"], 110
    )
    assert p.returncode == 0, p.stderr
    assert "done" in p.stdout and "stalled" not in p.stderr


CRUNCH = f"""import functools, re

crunch = functools.partial({SPIN})  # a long C computation (a solver), no wait


def solve():
    print("ready", flush=True)
    return crunch()


solve()
"""


@pytest.mark.timeout(120)
def test_a_long_c_computation_that_is_no_wait_has_the_silent_limit(tmp_path: Path) -> None:
    script = tmp_path / "solve.py"
    script.write_text(CRUNCH)
    cmd = agent("--nproc-per-node", "1", "--stall-timeout", "2", "--stall-silent-timeout", "12")
    t0 = time.monotonic()
    p = run([*cmd, "--shutdown-timeout", "3", str(script)], timeout=110)
    took = time.monotonic() - t0
    assert p.returncode == 1, p.stderr
    assert "xrun-agent: stalled 12 s without a line, write, beat or timer request: rank 0 in " in (
        p.stderr
    )
    assert "spinning" not in p.stderr
    assert took >= 12, took


GLOO = """import time, torch, torch.distributed as dist

dist.init_process_group("gloo")
print("ready", dist.get_rank(), flush=True)
a = torch.randn(256, 256)
end = time.monotonic() + 20
while time.monotonic() < end:  # 20 s of silent compute
    a = torch.tanh(a @ a)
t = torch.ones(1)
dist.all_reduce(t)
print("done", t.item(), flush=True)
dist.destroy_process_group()
"""


@pytest.mark.timeout(240)
def test_a_silent_gloo_compute_job_is_not_a_stall(tmp_path: Path) -> None:
    script = tmp_path / "mm.py"
    script.write_text(GLOO)
    logs = ("--log-dir", str(tmp_path / "logs"), "--tee", "3")
    p = run(agent("--nproc-per-node", "2", "--stall-timeout", "3", *logs, str(script)), 230)
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("done 2.0") == 2
    assert "stalled" not in p.stderr


BUSY_CHATTY = """import time
end = time.monotonic() + 8
x, last = 0, 0.0
while time.monotonic() < end:
    x += 1
    if time.monotonic() - last > 0.25:
        print("step", x, flush=True)
        last = time.monotonic()
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("chatty", [True, False])
def test_stacks_are_read_only_in_the_suspicious_state(tmp_path: Path, chatty: bool) -> None:
    """A busy job that prints pays nothing (no py-spy run); one that computes in silence is
    sampled (and not stalled: it is not in a wait). py-spy is counted through XRUN_PYSPY."""
    real = find_pyspy()
    assert real is not None
    count = tmp_path / "count"
    spy = tmp_path / "py-spy"
    spy.write_text(f'#!/bin/sh\necho x >> {count}\nexec {real} "$@"\n')
    spy.chmod(0o755)
    script = tmp_path / "job.py"
    script.write_text(
        BUSY_CHATTY
        if chatty
        else "import time\nprint('ready', flush=True)\nend = time.monotonic() + 8\n"
        "while time.monotonic() < end:\n    pass\n"
    )
    env = {**os.environ, "XRUN_PYSPY": str(spy)}
    logs = ("--log-dir", str(tmp_path / "logs"), "--tee", "3")
    cmd = agent("--nproc-per-node", "1", "--stall-timeout", "2", *logs, str(script))
    p = run(cmd, 110, env=env)
    assert p.returncode == 0, p.stderr
    assert "stalled" not in p.stderr
    runs = len(count.read_text().splitlines()) if count.exists() else 0
    assert (runs == 0) if chatty else (runs >= 2), runs


@pytest.mark.parametrize(
    ("frame", "line", "wait"),
    [
        (
            {"file": "/v/site-packages/torch/distributed/distributed_c10d.py", "name": "barrier"},
            "",
            True,
        ),
        # GPU syncs are where healthy GPU loops spend their time: not collective waits
        ({"file": "/v/site-packages/torch/cuda/__init__.py", "name": "synchronize"}, "", False),
        ({"file": "/v/site-packages/torch/_tensor.py", "name": "__format__"}, "", False),
        ({"name": "train"}, "    total += loss.item()  # sync", False),
        ({"name": "train"}, "    x = out.cpu()", False),
        ({"name": "train"}, "    torch.cuda.synchronize()", False),
        ({"name": "train"}, "    work.wait()", True),
        ({"name": "train"}, "    dist.barrier()", True),
        ({"name": "train"}, "    y = a @ b  # not .item()", False),
        ({"name": "train"}, "    items = x.items()", False),
        ({"file": "/v/site-packages/numpy/linalg/linalg.py", "name": "solve"}, "", False),
    ],
)
def test_what_is_a_wait(tmp_path: Path, frame: dict[str, object], line: str, wait: bool) -> None:
    src = tmp_path / "train.py"
    src.write_text(f"def train():\n{line or '    pass'}\n")
    assert is_wait({"file": str(src), "line": 2, **frame}) is wait


def test_a_fifo_named_like_source_never_blocks(tmp_path: Path) -> None:
    fifo = tmp_path / "train.py"
    os.mkfifo(fifo)
    assert is_wait({"file": str(fifo), "line": 1, "name": "train"}) is False
