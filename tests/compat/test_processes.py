"""``start_processes``/``PContext`` as torch 2.13 defines them (signature, attributes, what
``wait`` does after a failure, where tee goes). Runs against xrun, or against torch with
``XRUN_COMPAT_TARGET=torch`` to check that each assertion is what torch does."""

from __future__ import annotations

import io
import os
import time
from contextlib import redirect_stderr, redirect_stdout

import pytest

from tests.compat import shim
from tests.compat.helpers import PY, alive, fail_or_sleep, rank_fn, return_after, script
from tests.compat.shim import DefaultLogsSpecs, Std, start_processes


def _specs(tmp_path, **kw):
    return DefaultLogsSpecs(log_dir=str(tmp_path / "logs"), **kw)


@pytest.mark.timeout(120)
def test_one_binary_failing_stops_the_others_before_wait_returns(tmp_path):
    worker = script(
        tmp_path,
        "w.py",
        """
        import os, sys, time
        if os.environ["RANK"] == "0":
            print("rank 0 gives up", flush=True)
            sys.exit(3)
        time.sleep(60)
        """,
    )
    pc = start_processes(
        "trainer",
        worker,
        {0: (), 1: (), 2: ()},
        {r: {"RANK": str(r)} for r in range(3)},
        _specs(tmp_path, tee=Std.ALL),
    )
    t0 = time.monotonic()
    result = pc.wait(period=0.1)
    assert time.monotonic() - t0 < 30  # the sleepers were stopped, not waited for
    assert result is not None and result.is_failed()
    # the stopped siblings are failures too, killed by SIGTERM (exit code -15), as in torch
    assert {r: f.exitcode for r, f in result.failures.items()} == {0: 3, 1: -15, 2: -15}
    assert result.failures[1].signal_name() == "SIGTERM"
    assert "Signal 15 (SIGTERM) received by PID" in result.failures[2].message
    # reaped (no zombie left behind) and the tee flushed before wait() returned
    assert not any(alive(p) for p in pc.pids().values())
    assert all(t.stopped() for t in pc._tail_logs)
    assert "rank 0 gives up\n" in open(pc.stdouts[0]).read()
    pc.close()  # still allowed, and a no-op now


@pytest.mark.timeout(120)
def test_one_function_failing_stops_the_others(tmp_path):
    pc = start_processes(
        "fn",
        fail_or_sleep,
        {r: (r,) for r in range(3)},
        {r: {"RANK": str(r), "TORCHELASTIC_RUN_ID": "job"} for r in range(3)},
        _specs(tmp_path),
    )
    result = pc.wait(period=0.1)
    assert result is not None
    # torch's function context reports the rank that failed on its own
    assert list(result.failures) == [0] and not result.return_values
    failure = result.failures[0]
    assert failure.error_file_data["message"]["message"] == "ValueError: rank 0 failed on purpose"
    assert failure.error_file.endswith(os.path.join("attempt_0", "0", "error.json"))
    run_dir = os.path.dirname(os.path.dirname(os.path.dirname(failure.error_file)))
    assert os.path.basename(run_dir).startswith("job_")  # <log_dir>/<run_id>_<random>/
    assert not any(alive(p) for p in pc.pids().values())


@pytest.mark.timeout(120)
def test_function_workers_that_returned_wait_for_their_peers(tmp_path):
    # torch keeps a returned function worker alive until every rank has returned, so a
    # node's workers tear torch (gloo's threads) down together; one that exited while its
    # peers still talked to it now and then died of SIGABRT at exit.
    pc = start_processes(
        "fn",
        return_after,
        {0: (0.0, str(tmp_path)), 1: (1.5, str(tmp_path))},
        {r: {"RANK": str(r)} for r in range(2)},
        _specs(tmp_path),
    )
    result = pc.wait()
    assert result is not None and not result.is_failed()
    assert result.return_values == {0: 0, 1: 1}
    t0, t1 = (float((tmp_path / f"exit.{r}").read_text()) for r in (0, 1))
    assert abs(t1 - t0) < 0.75, (t0, t1)  # rank 0 returned 1.5 s before rank 1


@pytest.mark.timeout(120)
def test_a_sibling_that_ends_within_period_of_a_failure_is_not_a_casualty(tmp_path):
    worker = script(
        tmp_path,
        "w.py",
        """
        import os, sys, time
        if os.environ["RANK"] == "0":
            sys.exit(3)
        time.sleep(0.2)
        """,
    )
    pc = start_processes(
        "trainer", worker, {0: (), 1: ()}, {r: {"RANK": str(r)} for r in range(2)}, _specs(tmp_path)
    )
    result = pc.wait(period=1.0)
    assert result is not None
    assert {r: f.exitcode for r, f in result.failures.items()} == {0: 3}


@pytest.mark.timeout(120)
def test_context_attributes_and_binary_return_values(tmp_path):
    worker = script(tmp_path, "w.py", "import os; print('hi', os.environ['RANK'])\n")
    pc = start_processes(
        "echo",
        worker,
        {0: (), 1: ()},
        {0: {"RANK": "0"}, 1: {"RANK": "1"}},
        logs_specs=_specs(tmp_path, redirects={0: Std.OUT}),
        log_line_prefixes=None,
        start_method="spawn",
        numa_options=None,
        duplicate_stdout_filters=None,
        duplicate_stderr_filters=None,
    )
    assert pc.nprocs == 2 and pc.name == "echo" and pc.entrypoint == worker
    assert set(pc.pids()) == {0, 1}
    result = pc.wait()
    # binaries return None per rank; only rank 0's stdout was redirected
    assert result.return_values == {0: None, 1: None} and not result.is_failed()
    assert pc.stdouts[0].endswith(os.path.join("0", "stdout.log")) and not pc.stdouts[1]
    assert open(result.stdouts[0]).read() == "hi 0\n"
    assert not pc.stderrs[0] and not pc.stderrs[1]


@pytest.mark.timeout(120)
def test_tee_writes_through_sys_stdout_and_sys_stderr(tmp_path):
    # pytest's capture, Jupyter and redirect_stdout replace sys.stdout: a library caller's tee
    # must land there, not on fd 1
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        pc = start_processes(
            "fn",
            rank_fn,
            {0: ("hello",), 1: ("hello",)},
            {0: {"RANK": "0"}, 1: {"RANK": "1"}},
            _specs(tmp_path, tee=Std.ALL),
            log_line_prefixes={0: "[r0]:", 1: "[r1]:"},
        )
        result = pc.wait()
    assert result.return_values == {0: "hello_0", 1: "hello_1"}
    assert "[r0]:hello out 0\n" in out.getvalue() and "[r1]:hello out 1\n" in out.getvalue()
    assert "[r1]:hello err 1\n" in err.getvalue() and "out" not in err.getvalue()


@pytest.mark.timeout(120)
def test_duplicate_filters_copy_matching_tee_lines(tmp_path):
    worker = script(
        tmp_path,
        "w.py",
        """
        import os, sys
        r = os.environ["RANK"]
        for word in ("apple", "pear", "plum"):
            print(f"{word} from {r}", flush=True)
            print(f"{word} err {r}", file=sys.stderr, flush=True)
        """,
    )
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(io.StringIO()):
        pc = start_processes(
            "t",
            worker,
            {0: (), 1: ()},
            {0: {"RANK": "0"}, 1: {"RANK": "1"}},
            _specs(tmp_path, tee=Std.ALL),
            duplicate_stdout_filters=["apple", "plum"],
            duplicate_stderr_filters=["pear"],
        )
        assert not pc.wait().is_failed()
    if shim.TARGET == "torch":  # torch keeps the open file objects; their names are the files
        out_path, err_path = pc.filtered_stdout.name, pc.filtered_stderr.name
    else:
        out_path, err_path = pc.filtered_stdout, pc.filtered_stderr
    lines = sorted(open(out_path).read().splitlines())
    assert lines == [
        "[t0]:apple from 0",
        "[t0]:plum from 0",
        "[t1]:apple from 1",
        "[t1]:plum from 1",
    ]
    assert sorted(open(err_path).read().splitlines()) == ["[t0]:pear err 0", "[t1]:pear err 1"]
    assert "[t0]:pear from 0\n" in out.getvalue()  # the console still gets every line


@pytest.mark.timeout(60)
def test_exception_types(tmp_path):
    with pytest.raises(RuntimeError):  # args and envs name different ranks
        start_processes("t", PY, {0: (), 1: ()}, {0: {}}, _specs(tmp_path))
    with pytest.raises(FileNotFoundError):
        start_processes("t", "no-such-binary-xyz", {0: ()}, {0: {}}, _specs(tmp_path))
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    with pytest.raises(NotADirectoryError):
        DefaultLogsSpecs(log_dir=str(not_a_dir))
    with pytest.raises(ValueError):
        Std.from_str("0:1,1")
    with pytest.raises(RuntimeError):
        shim.run.parse_min_max_nnodes("1:2:3")
    assert shim.run.parse_min_max_nnodes("2:20") == (2, 20)


@pytest.mark.timeout(60)
def test_devnull_log_dir_writes_nothing_and_keeps_the_console(tmp_path, capfd):
    worker = script(tmp_path, "w.py", "import os; print('to the console', os.environ['RANK'])\n")
    pc = start_processes(
        "t", worker, {0: ()}, {0: {"RANK": "0"}}, DefaultLogsSpecs(log_dir=os.devnull, tee=Std.ALL)
    )
    result = pc.wait()
    assert not result.is_failed()
    assert pc.envs[0]["TORCHELASTIC_ERROR_FILE"] == "" if shim.TARGET == "xrun" else True
    assert "to the console 0" in capfd.readouterr().out


@pytest.mark.timeout(60)
def test_workers_run_in_their_own_session(tmp_path):
    worker = script(
        tmp_path,
        "w.py",
        "import os; print(os.getsid(0) == os.getpid() == os.getpgid(0), flush=True)\n",
    )
    pc = start_processes("t", worker, {0: ()}, {0: {}}, _specs(tmp_path, redirects=Std.OUT))
    assert not pc.wait().is_failed()
    assert open(pc.stdouts[0]).read() == "True\n"
