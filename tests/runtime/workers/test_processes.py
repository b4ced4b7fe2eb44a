"""start_processes with real processes: function and binary entrypoints, results, failures."""

from __future__ import annotations

import time

import pytest

from tests.runtime.workers.helpers import (
    PY,
    Point,
    alive,
    envs,
    kills_itself,
    prints,
    raises_or_sleeps,
    returns_by_rank,
)
from xrun.runtime.errors import NO_ERROR_FILE_MESSAGE
from xrun.runtime.workers.api import Std, start_processes

# -- function entrypoints -----------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_functions_return_values_spawn(tmp_path):
    ctx = start_processes(
        "fn", returns_by_rank, {r: (r,) for r in range(2)}, envs(2), log_dir=str(tmp_path)
    )
    try:
        result = ctx.wait(timeout=50)
    finally:
        ctx.close()
    assert result is not None and not result.is_failed()
    assert result.return_values[0] == {
        "rank": 0,
        "env": {"MY_RANK": "0", "TORCHELASTIC_ERROR_FILE": str(tmp_path / "0" / "error.json")},
    }
    assert result.return_values[1] == Point(1, ["a", "b"])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", ["spawn", "fork", "forkserver"])
def test_function_output_reaches_files_under_every_start_method(tmp_path, method):
    # The redirected fds travel differently per method (inherited, passed at spawn, sent to
    # the fork server): each must land in the rank's file.
    ctx = start_processes(
        "fn",
        prints,
        {r: (r,) for r in range(2)},
        envs(2),
        log_dir=str(tmp_path),
        redirects={0: Std.ALL},
        tee={1: Std.OUT},
        local_ranks_filter={1},
        start_method=method,
    )
    try:
        result = ctx.wait(timeout=50)
    finally:
        ctx.close()
    assert result is not None and result.return_values == {0: 0, 1: 1}
    assert (tmp_path / "0" / "stdout.log").read_text() == "out from 0\n"
    assert (tmp_path / "0" / "stderr.log").read_text() == "err from 0\n"
    assert (tmp_path / "1" / "stdout.log").read_text() == "out from 1\n"


@pytest.mark.timeout(60)
def test_function_exception_is_recorded_and_wait_stops_the_rest(tmp_path):
    ctx = start_processes(
        "fn",
        raises_or_sleeps,
        {r: (r,) for r in range(3)},
        envs(3),
        log_dir=str(tmp_path),
        redirects=Std.ERR,
        start_method="fork",
    )
    ctx.stop_timeout = 5
    try:
        t0 = time.monotonic()
        result = ctx.wait(timeout=20)  # the sleepers would take 30 s
        assert time.monotonic() - t0 < 10  # SIGTERM is enough for sleepers
        assert result is not None and result.is_failed()
        # torch's function context: the rank that failed on its own; the others were stopped
        # (SIGTERM), reaped and the tee flushed before wait() returned
        assert list(result.failures) == [1]
        assert not any(alive(p) for p in ctx.pids().values())
        assert ctx.tee.stopped()
        f = result.failures[1]
        assert (f.exitcode, f.pid, f.local_rank) == (1, ctx.pids()[1], 1)
        assert f.message == "ValueError: rank 1 saw a bad batch"
        assert f.error_file == str(tmp_path / "1" / "error.json")
        assert "raise ValueError" in f.error_file_data["message"]["extraInfo"]["py_callstack"]
        assert abs(f.timestamp - time.time()) < 20
    finally:
        ctx.close(timeout=5)
    # multiprocessing also printed the traceback to the (redirected) stderr
    assert "ValueError: rank 1 saw a bad batch" in (tmp_path / "1" / "stderr.log").read_text()


@pytest.mark.timeout(30)
def test_function_killed_by_signal():
    ctx = start_processes("fn", kills_itself, {0: ()}, {0: {}}, start_method="fork")
    try:
        result = ctx.wait(timeout=20)
    finally:
        ctx.close()
    f = result.failures[0]
    assert (f.exitcode, f.signal_name()) == (-9, "SIGKILL")
    assert f.message == f"Signal 9 (SIGKILL) received by PID {f.pid}"


# -- binaries -----------------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_binary_exit_codes_andenvs(tmp_path):
    # Both ranks outlive the fds() check below even on a loaded machine; rank 1 ends last.
    code = "import os, sys, time; time.sleep(1 + 0.3 * int(os.environ['MY_RANK'])); sys.exit(int(sys.argv[1]))"
    ctx = start_processes("bin", PY, {0: ("-c", code, 0), 1: ("-c", code, 7)}, envs(2))
    try:
        assert ctx.wait(timeout=0) is None  # still running
        assert len(ctx.fds()) == 2
        result = ctx.wait(timeout=20)
    finally:
        ctx.close()
    assert list(result.failures) == [1]
    f = result.failures[1]
    assert (f.exitcode, f.message, f.signal_name()) == (7, NO_ERROR_FILE_MESSAGE, "<N/A>")
    assert result.return_values == {}


@pytest.mark.timeout(30)
def test_wait_sleeps_in_select_not_a_polling_loop():
    # A polling loop (torchrun ticks every 0.1 s) would wake this thread many times while a
    # worker runs for 1 s; a select() on the pidfds wakes it once, when the worker exits.
    import resource

    ctx = start_processes("bin", PY, {0: ("-c", "import time; time.sleep(1.0)")}, {0: {}})
    try:
        assert len(ctx.fds()) == 1
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw
        result = ctx.wait(timeout=20)
        wakeups = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw - before
        returned = time.time()
    finally:
        ctx.close()
    assert result is not None and not result.is_failed()
    assert wakeups <= 3, f"wait() woke {wakeups} times"
    assert returned - ctx._workers[0].exit_time < 0.5
    assert ctx.fds() == []


def test_envs_win_over_log_dir_error_file(tmp_path):
    mine = str(tmp_path / "mine.json")
    code = "import os; print(os.environ['TORCHELASTIC_ERROR_FILE'])"
    ctx = start_processes(
        "bin",
        PY,
        {0: ("-c", code)},
        {0: {"TORCHELASTIC_ERROR_FILE": mine}},
        log_dir=str(tmp_path / "logs"),
        redirects=Std.OUT,
    )
    ctx.wait(timeout=20)
    ctx.close()
    assert (tmp_path / "logs" / "0" / "stdout.log").read_text() == mine + "\n"
