"""Reading workers' stacks with py-spy (runtime/diagnose/stacks.py) and grouping them
(groups.py): real processes that contain no cooperation code."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.paths import PY
from tests.helpers.waiting import wait_for
from xrun.runtime.diagnose.groups import format_groups, group, headline, rank_list, where
from xrun.runtime.diagnose.stacks import PYSPY_ENV, collect

# Two kinds of worker: "odd" parks in stuck_here, "even" in wait_for_peers; both start a
# helper thread named "bg" and say "ready" once in place.
WORKER = """
import sys, threading, time

def bg_loop():
    time.sleep(600)

def stuck_here():
    print("ready", flush=True)
    time.sleep(600)

def wait_for_peers():
    print("ready", flush=True)
    time.sleep(600)

threading.Thread(target=bg_loop, name="bg", daemon=True).start()
stuck_here() if sys.argv[1] == "odd" else wait_for_peers()
"""


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def _start(procs: list[subprocess.Popen[str]], script: Path, *argv: str) -> int:
    p = subprocess.Popen([PY, str(script), *argv], stdout=subprocess.PIPE, text=True)
    procs.append(p)
    assert p.stdout is not None and p.stdout.readline() == "ready\n"
    return p.pid


def test_every_thread_of_an_uncooperative_worker(tmp_path: Path, spawn: list) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    pid = _start(spawn, script, "odd")
    r = collect({5: (1, pid)})[5]
    assert r["local_rank"] == 1 and r["pid"] == pid
    main = [t for t in r["threads"] if t["main"]]
    assert len(main) == 1
    assert [f["name"] for f in main[0]["frames"]] == ["stuck_here", "<module>"]
    assert main[0]["frames"][0]["file"] == str(script) and main[0]["frames"][0]["line"] == 9
    bg = [t for t in r["threads"] if t["name"] == "bg"]
    assert bg and bg[0]["frames"][0]["name"] == "bg_loop"


def test_groups_put_the_odd_one_out_first(tmp_path: Path, spawn: list) -> None:
    script = tmp_path / "train.py"
    script.write_text(WORKER)
    pids = {r: _start(spawn, script, "odd" if r == 2 else "even") for r in range(4)}
    ranks = collect({r: (r, pid) for r, pid in pids.items()})
    groups = group(ranks)
    assert [g.ranks for g in groups] == [[2], [0, 1, 3]]
    assert headline(groups) == (
        "rank 2 in stuck_here (train.py:9); ranks 0,1,3 in wait_for_peers (train.py:13)"
    )
    text = format_groups(ranks, groups)
    assert text.splitlines()[0] == "rank 2 (1/4): stuck_here (train.py:9)"
    # the other threads, the same in every rank of the group, once per group
    assert text.count("Thread bg:") == 2 and "ranks 0,1,3 (3/4): wait_for_peers" in text


def test_a_binary_worker_has_no_python_stack(spawn: list) -> None:
    p = subprocess.Popen(["sleep", "60"])
    spawn.append(p)  # type: ignore[arg-type]
    wait_for(lambda: Path(f"/proc/{p.pid}/comm").read_text().strip() == "sleep", 10)
    r = collect({0: (0, p.pid)})[0]
    assert r["error"] == f"no Python stack: pid {p.pid} runs sleep, not a Python interpreter"
    g = group({0: r, 1: {**r, "pid": 1, "error": r["error"].replace(str(p.pid), "1")}})
    assert len(g) == 1 and g[0].ranks == [0, 1]  # one group for the same reason


def test_missing_pyspy_is_one_line_naming_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PYSPY_ENV, "/nonexistent/py-spy")
    r = collect({3: (0, 1)})[3]
    assert (
        r["error"] == "py-spy was not found: XRUN_PYSPY=/nonexistent/py-spy is no executable file"
    )


def test_an_exited_worker_is_named_not_an_error(spawn: list) -> None:
    p = subprocess.Popen(["true"])
    p.wait()
    time.sleep(0.05)
    assert collect({0: (0, p.pid)})[0]["error"] == f"pid {p.pid} has exited"


def test_rank_lists_and_where() -> None:
    assert rank_list([3]) == "rank 3"
    assert rank_list([0, 2, 3]) == "ranks 0,2,3"
    assert rank_list(list(range(63)) + [64]) == "ranks 0-62,64"
    frames = [
        {"name": "all_reduce", "file": "/v/lib/python3.11/site-packages/torch/c10d.py", "line": 9},
        {"name": "wrapper", "file": "/v/lib/python3.11/site-packages/torch/log.py", "line": 3},
        {"name": "<module>", "file": "/job/train.py", "line": 42},
    ]
    assert where(frames) == "all_reduce (train.py:42)"
    assert where(frames[:2]) == "all_reduce (c10d.py:9)"  # no job code: the innermost frame


def test_no_ptrace_permission_is_one_line_naming_the_fix() -> None:
    """py-spy's words when ptrace is refused (Yama, a container without CAP_SYS_PTRACE): as
    root on this machine that cannot be produced on demand, so its stderr is given."""
    from xrun.runtime.diagnose.stacks import _why

    said = "Error: Operation not permitted (os error 1)\n\nStack backtrace:\n   0: anyhow::..."
    assert _why(said, 42) == (
        "no permission to read pid 42 (ptrace): run as the worker's user with "
        "kernel.yama.ptrace_scope=0 (sysctl), or give the container CAP_SYS_PTRACE"
    )


def _fake_pyspy(tmp_path: Path, seconds: float) -> Path:
    """A py-spy that answers an empty dump after ``seconds``."""
    exe = tmp_path / "py-spy"
    exe.write_text(f"#!/bin/sh\nsleep {seconds}\necho '[]'\n")
    exe.chmod(0o755)
    return exe


def test_the_stacks_are_read_when_py_spy_exits_not_at_a_later_poll(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """collect wakes on py-spy's exit. Popen.wait(timeout) polled instead, sleeping 1, 2, 4 ...
    50 ms between looks: a dump that ended just after a look was seen up to 50 ms late, which
    made a restart's added time jump by 32-50 ms with a few ms of py-spy's own time
    (benchmark 7). Counting the sleeps, not timing them: a loaded host delays any wake-up."""
    monkeypatch.setenv(PYSPY_ENV, str(_fake_pyspy(tmp_path, 0.2)))
    sleeps: list[float] = []
    real_sleep = time.sleep
    monkeypatch.setattr(time, "sleep", lambda s: (sleeps.append(s), real_sleep(s))[1])
    r = collect({0: (0, 11), 1: (1, 12)}, timeout=30)
    monkeypatch.undo()
    assert r == {
        0: {"local_rank": 0, "pid": 11, "threads": []},
        1: {"local_rank": 1, "pid": 12, "threads": []},
    }
    assert sleeps == []


def test_a_py_spy_that_does_not_answer_costs_the_timeout_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PYSPY_ENV, str(_fake_pyspy(tmp_path, 60)))
    t0 = time.monotonic()
    r = collect({0: (0, 11)}, timeout=0.5)
    assert time.monotonic() - t0 < 20  # 0.5 s, with room for a loaded host
    assert r[0]["error"] == "py-spy did not answer within 0.5s"
