"""start_processes' logs, redirects and tee, seen from a driver process's console."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import textwrap
import time

import pytest

from tests.runtime.workers.helpers import PY, envs
from xrun.runtime.workers.api import Std, start_processes

# -- logs and tee (the console is a driver process's stdout/stderr) -----------------------------

DRIVER = """
import json, sys
from xrun.runtime import Std, start_processes
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
        envs(2),
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
    assert capfd.readouterr().out == "[bin0]:bye\n"  # torch's default prefix: [<name><rank>]:


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
