"""start_processes with real processes: functions, binaries, logs, tee, signals, pdeathsig."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass

import pytest

from tests.helpers.waiting import poll_until
from xrun.errors import UsageError
from xrun.runtime.procs import PContext, Std, start_processes

PY = sys.executable


# -- function entrypoints (module level, so spawn can pickle them) ----------------------------


@dataclass
class Point:
    x: int
    tags: list[str]


def returns_by_rank(rank: int) -> object:
    env = {k: os.environ[k] for k in ("MY_RANK", "TORCHELASTIC_ERROR_FILE")}
    return [{"rank": rank, "env": env}, Point(rank, ["a", "b"])][rank]


def raises_or_sleeps(rank: int) -> None:
    if rank == 1:
        raise ValueError(f"rank {rank} saw a bad batch")
    time.sleep(30)


def _ready_code(ready_file) -> str:
    """Python source that marks it runs (the user's code: past the worker's prctl), then sleeps."""
    return f"import time; open({str(ready_file)!r}, 'w').close(); time.sleep(60)"


def kills_itself() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def prints(rank: int) -> int:
    print(f"out from {rank}", flush=True)
    print(f"err from {rank}", file=sys.stderr, flush=True)
    return rank


def _envs(n: int, **extra: str) -> dict[int, dict[str, str]]:
    return {r: {"MY_RANK": str(r), **extra} for r in range(n)}


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie nobody reaped counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fp:
            return fp.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# -- Std.parse ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "nprocs", "want"),
    [
        ("0", None, Std.NONE),
        ("3", None, Std.ALL),
        (" 2 ", 4, Std.ERR),
        ("0:3,1:1", None, {0: Std.ALL, 1: Std.OUT}),
        ("1:2", 3, {0: Std.NONE, 1: Std.ERR, 2: Std.NONE}),
    ],
)
def test_std_parse_good(text, nprocs, want):
    assert Std.parse(text, nprocs) == want


@pytest.mark.parametrize(
    ("text", "nprocs", "says"),
    [
        ("4", None, "'4'"),
        ("-1", None, "'-1'"),
        ("all", None, "'all'"),
        ("0:3,0:1", None, "twice"),
        ("x:1", None, "'x'"),
        ("0:", None, "''"),
        ("2:1", 2, "ranks 0..1"),
    ],
)
def test_std_parse_bad(text, nprocs, says):
    with pytest.raises(UsageError, match=re.escape(says)):
        Std.parse(text, nprocs)


# -- argument checks ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "envs", "says"),
    [
        (
            {0: (), 2: ()},
            {0: {}, 2: {}},
            "args must have one entry per local rank 0..1: missing local ranks [1], unexpected local ranks [2]",
        ),
        (
            {0: (), 1: ()},
            {0: {}},
            "envs must have one entry per local rank 0..1: missing local ranks [1]",
        ),
        (
            {0: ()},
            {0: {}, 1: {}},
            "envs must have one entry per local rank 0..0: unexpected local ranks [1]",
        ),
    ],
)
def test_rank_keys_must_be_exactly_0_to_n(args, envs, says):
    with pytest.raises(UsageError, match=re.escape(says)):
        start_processes("t", PY, args, envs)


def test_bad_binary_is_a_usage_error_and_starts_nothing():
    with pytest.raises(UsageError, match="no-such-binary-xyz"):
        start_processes("t", "no-such-binary-xyz", {0: ()}, {0: {}})


def test_unpicklable_function_is_a_usage_error_naming_the_fix():
    with pytest.raises(UsageError, match="start_method='fork'"):
        start_processes("t", lambda: 1, {0: ()}, {0: {}}, start_method="spawn")
    with pytest.raises(UsageError, match="bad start method 'thread'"):
        start_processes("t", prints, {0: (0,)}, {0: {}}, start_method="thread")


# -- function entrypoints -----------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_functions_return_values_spawn(tmp_path):
    ctx = start_processes(
        "fn", returns_by_rank, {r: (r,) for r in range(2)}, _envs(2), log_dir=str(tmp_path)
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
        _envs(2),
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
def test_function_exception_is_recorded_and_wait_returns_on_first_failure(tmp_path):
    ctx = start_processes(
        "fn",
        raises_or_sleeps,
        {r: (r,) for r in range(3)},
        _envs(3),
        log_dir=str(tmp_path),
        redirects=Std.ERR,
        start_method="fork",
    )
    try:
        result = ctx.wait(timeout=20)  # the sleepers would take 30 s
        assert result is not None and result.is_failed()
        assert list(result.failures) == [1]
        assert all(_alive(ctx.pids()[r]) for r in (0, 2))  # the caller decides about the rest
        f = result.failures[1]
        assert (f.exitcode, f.pid, f.local_rank) == (1, ctx.pids()[1], 1)
        assert f.message == "ValueError: rank 1 saw a bad batch"
        assert f.error_file == str(tmp_path / "1" / "error.json")
        assert "raise ValueError" in f.error_file_data["message"]["extraInfo"]["py_callstack"]
        assert abs(f.timestamp - time.time()) < 20
    finally:
        t0 = time.monotonic()
        ctx.close(timeout=5)
    assert time.monotonic() - t0 < 4  # SIGTERM is enough for sleepers
    assert not any(_alive(p) for p in ctx.pids().values())
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
def test_binary_exit_codes_and_envs(tmp_path):
    # Both ranks outlive the fds() check below even on a loaded machine; rank 1 ends last.
    code = "import os, sys, time; time.sleep(1 + 0.3 * int(os.environ['MY_RANK'])); sys.exit(int(sys.argv[1]))"
    ctx = start_processes("bin", PY, {0: ("-c", code, 0), 1: ("-c", code, 7)}, _envs(2))
    try:
        assert ctx.wait(timeout=0) is None  # still running
        assert len(ctx.fds()) == 2
        result = ctx.wait(timeout=20)
    finally:
        ctx.close()
    assert list(result.failures) == [1]
    f = result.failures[1]
    assert (f.exitcode, f.message, f.signal_name()) == (7, "Process exited with code 7", "<N/A>")
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


# -- logs and tee (the console is a driver process's stdout/stderr) -----------------------------

DRIVER = """
import json, sys
from xrun.runtime.procs import start_processes, Std
cfg = json.loads(sys.argv[1])
n = len(cfg["codes"])
ctx = start_processes(
    "drv", sys.executable, {r: ("-c", c) for r, c in enumerate(cfg["codes"])},
    {r: {"R": str(r)} for r in range(n)}, log_dir=cfg.get("log_dir"),
    redirects=Std(cfg.get("redirects", 0)), tee=Std(cfg.get("tee", 0)),
    log_line_prefixes={r: f"[w{r}]:" for r in range(n)},
    local_ranks_filter=set(cfg["filter"]) if "filter" in cfg else None,
)
if cfg.get("pids_file"):
    with open(cfg["pids_file"] + ".tmp", "w") as fp:
        json.dump(ctx.pids(), fp)
    import os; os.replace(cfg["pids_file"] + ".tmp", cfg["pids_file"])
result = ctx.wait()
ctx.close()
sys.exit(1 if result.is_failed() else 0)
"""


def _drive(tmp_path, timeout: float = 60, **cfg) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    proc = subprocess.run(
        [PY, str(script), json.dumps(cfg)], capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stderr
    return proc


def test_redirects_go_to_private_files_only(tmp_path):
    logs = tmp_path / "logs"
    code = (
        "import os, sys; print('o', os.environ['R']); print('e', os.environ['R'], file=sys.stderr)"
    )
    proc = _drive(tmp_path, codes=[code, code], log_dir=str(logs), redirects=3)
    assert proc.stdout == "" and proc.stderr == ""
    for r in (0, 1):
        assert (logs / str(r) / "stdout.log").read_text() == f"o {r}\n"
        assert (logs / str(r) / "stderr.log").read_text() == f"e {r}\n"
        assert oct((logs / str(r)).stat().st_mode & 0o777) == "0o700"
        assert oct((logs / str(r) / "stdout.log").stat().st_mode & 0o777) == "0o600"


def test_per_rank_redirect_map(tmp_path):
    code = "import os; print('hi', os.environ['MY_RANK'])"
    ctx = start_processes(
        "bin",
        PY,
        {0: ("-c", code), 1: ("-c", code)},
        _envs(2),
        log_dir=str(tmp_path),
        redirects={0: Std.OUT},
        tee={1: Std.ERR},
        local_ranks_filter={0},
    )
    result = ctx.wait(timeout=20)
    ctx.close()
    assert result.stdouts == {0: str(tmp_path / "0" / "stdout.log"), 1: ""}
    assert result.stderrs == {0: "", 1: str(tmp_path / "1" / "stderr.log")}
    assert (tmp_path / "0" / "stdout.log").read_text() == "hi 0\n"
    assert not (tmp_path / "1" / "stdout.log").exists()


def test_tee_prefixes_console_and_files_and_ranks_filter(tmp_path):
    logs = tmp_path / "logs"
    code = (
        "import os, sys; r = os.environ['R']; print('a', r); print('b', r, flush=True);"
        "sys.stderr.write('err ' + r + '\\n'); sys.stdout.write('tail ' + r)"  # no newline
    )
    proc = _drive(tmp_path, codes=[code, code, code], log_dir=str(logs), tee=3, filter=[0, 2])
    for r in (0, 2):
        assert f"[w{r}]:a {r}\n[w{r}]:b {r}\n" in proc.stdout
        assert f"[w{r}]:tail {r}\n" in proc.stdout  # partial last line flushed at the end
        assert f"[w{r}]:err {r}\n" in proc.stderr
    assert "w1" not in proc.stdout + proc.stderr
    for r in (0, 1, 2):  # files get every rank, unprefixed and byte for byte
        assert (logs / str(r) / "stdout.log").read_text() == f"a {r}\nb {r}\ntail {r}"
        assert (logs / str(r) / "stderr.log").read_text() == f"err {r}\n"


def test_tee_without_log_dir_prefixes_console_only(tmp_path):
    proc = _drive(tmp_path, codes=["print('x')"], tee=1)
    assert proc.stdout == "[w0]:x\n"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("tail_files", [True, False], ids=["tailed-log-files", "pipes"])
def test_tee_never_loses_or_splits_lines(tmp_path, tail_files):
    n_lines = 20_000
    # Block-buffered writes: the pipe sees 8 KiB chunks that cut lines anywhere.
    code = (
        "import os, sys; r = os.environ['R']; w = sys.stdout.write; e = sys.stderr.write\n"
        f"for i in range({n_lines}):\n"
        "    w(f'{r} {i} ' + 'x' * (i % 97) + '\\n')\n"
        "    if i % 10 == 0: e(f'{r} {i} err\\n')\n"
    )
    logs = tmp_path / "logs"
    # With a log dir the workers write their files and the tee tails them; without one the
    # tee reads pipes.
    where = {"log_dir": str(logs)} if tail_files else {}
    proc = _drive(tmp_path, timeout=100, codes=[code] * 4, tee=3, **where)
    per_rank: dict[str, list[int]] = {str(r): [] for r in range(4)}
    line_re = re.compile(r"\[w(\d)\]:(\d) (\d+) (x*)")
    for line in proc.stdout.split("\n")[:-1]:
        m = line_re.fullmatch(line)
        assert m, f"split or corrupt line: {line[:200]!r}"
        assert m[1] == m[2] and len(m[4]) == int(m[3]) % 97
        per_rank[m[1]].append(int(m[3]))
    assert all(seq == list(range(n_lines)) for seq in per_rank.values())
    err_lines = proc.stderr.split("\n")[:-1]
    assert len(err_lines) == 4 * n_lines // 10
    assert all(re.fullmatch(r"\[w(\d)\]:\1 \d+ err", x) for x in err_lines)
    if tail_files:
        assert (logs / "3" / "stdout.log").read_text().count("\n") == n_lines
    else:
        assert not logs.exists()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("tail_files", [True, False], ids=["tailed-log-files", "pipes"])
def test_tee_shows_a_line_while_the_worker_still_runs(tmp_path, tail_files):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    code = "import time; print('early', flush=True); time.sleep(5)"
    cfg: dict[str, object] = {"codes": [code], "tee": 1}
    if tail_files:
        cfg["log_dir"] = str(tmp_path / "logs")
    driver = subprocess.Popen([PY, str(script), json.dumps(cfg)], stdout=subprocess.PIPE, text=True)
    try:
        t0 = time.monotonic()
        assert driver.stdout.readline() == "[w0]:early\n"
        assert time.monotonic() - t0 < 4  # well before the worker's exit at 5 s
        assert driver.poll() is None
    finally:
        driver.kill()
        driver.wait()


@pytest.mark.timeout(30)
def test_close_is_not_held_up_by_a_daemon_that_keeps_the_pipe(tmp_path, capfd):
    pid_file = tmp_path / "daemon.pid"
    code = textwrap.dedent(
        f"""
        import subprocess
        # a new session: outside the worker's process group, so close() cannot kill it
        p = subprocess.Popen(["sleep", "30"], start_new_session=True)
        open({str(pid_file)!r}, "w").write(str(p.pid))
        print("bye")
        """
    )
    ctx = start_processes("bin", PY, {0: ("-c", code)}, {0: {}}, tee=Std.OUT)
    try:
        result = ctx.wait(timeout=20)
        t0 = time.monotonic()
        ctx.close()
        assert time.monotonic() - t0 < 3
    finally:
        if pid_file.exists():
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
    assert result is not None and not result.is_failed()
    assert capfd.readouterr().out == "bye\n"


@pytest.mark.timeout(60)
def test_tee_survives_a_closed_console(tmp_path):
    # `xrun ... | head`: once the console is gone the log file must still get every line and
    # the worker must not block on a pipe nobody drains.
    logs = tmp_path / "logs"
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    cfg = {"codes": ["for i in range(50000): print(i)"], "log_dir": str(logs), "tee": 1}
    proc = subprocess.run(
        f"{PY} {script} '{json.dumps(cfg)}' | head -n 1",
        shell=True,
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert proc.stdout == "[w0]:0\n"
    assert (logs / "0" / "stdout.log").read_text() == "".join(f"{i}\n" for i in range(50000))


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
    assert not _alive(ctx.pids()[0])
    assert ctx._workers[0].exitcode == -signal.SIGKILL
    assert not os.path.exists(f"/proc/{ctx.pids()[0]}")  # reaped: no zombie left behind
    assert poll_until(lambda: not _alive(grandchild), 2)


@pytest.mark.timeout(30)
def test_signal_is_forwarded_to_the_group():
    ctx = start_processes("bin", "sleep", {0: ("30",), 1: ("30",)}, _envs(2))
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
    fn_args = {r: (_ready_code(tmp_path / f"ready{r}"),) for r in (0, 1)}
    script = tmp_path / "agent.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import json, os, sys, time
            from xrun.runtime.procs import start_processes
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
        assert all(_alive(p) for p in pids)
        agent.kill()
        agent.wait()
        t0 = time.monotonic()
        assert poll_until(lambda: not any(_alive(p) for p in pids), 1.0), (
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
            from xrun.runtime.procs import start_processes
            if __name__ == "__main__":
                ctx = start_processes("a", exec, {{0: ({_ready_code(ready)!r},)}}, {{0: {{}}}})
                with open({str(pids_file)!r}, "w") as fp:
                    json.dump(list(ctx.pids().values()), fp)
                os._exit(0)
            """
        )
    )
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # the agent's scratch dir stays behind
    subprocess.run([PY, str(script)], timeout=40, check=True, env=env)
    pids = json.loads(pids_file.read_text())
    assert poll_until(lambda: not any(_alive(p) for p in pids), 20), "orphaned worker survived"
    assert not ready.exists()  # it never ran the user's function


def test_redirects_without_log_dir_are_a_usage_error():
    with pytest.raises(UsageError, match="log_dir"):
        start_processes("t", PY, {0: ()}, {0: {}}, redirects=Std.OUT)


def test_context_api_types():
    with start_processes("t", "true", {0: ()}, {0: {}}) as ctx:
        assert isinstance(ctx, PContext)
        assert list(ctx.pids()) == [0]
        result = ctx.wait()
    assert result is not None and result.stdouts == {0: ""} and result.stderrs == {0: ""}
    assert not os.path.exists(f"/proc/{ctx.pids()[0]}")  # reaped
    ctx.close()  # idempotent
