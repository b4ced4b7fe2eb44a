"""local_cwd, for real, where TorchX's side-by-side comparison found xrun wrong: a static
rendezvous over several nodes, ``--max_retries`` attempts, a fixed rendezvous port that another
job holds, and the agents' logs left in the temp dir.

The real ``xrun`` console script, the real runtime agents, torch's gloo backend.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from tests.helpers.net import free_port
from tests.helpers.paths import SCRIPTS, XRUN

# A job whose every attempt appends one line to a file, then fails.
ALWAYS_FAILS = """\
import os, sys
with open(sys.argv[1], "a") as f:
    f.write(f"attempt restart={os.environ['TORCHELASTIC_RESTART_COUNT']}\\n")
sys.exit(3)
"""


def _xrun(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 150
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [XRUN, *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _ddp(tmp_path: Path, *args: str) -> list[str]:
    return ["run", "-s", "local_cwd", "-cfg", f"log_dir={tmp_path / 'logs'}", "dist.ddp", *args]


@pytest.mark.timeout(240)
def test_static_rendezvous_2x2_runs_a_real_allreduce(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    proc = _xrun(
        *_ddp(tmp_path, "-j", "2x2", "--rdzv_backend", "static", "--script"),
        str(SCRIPTS / "allreduce.py"),
        str(out),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads((out / f"allreduce.{r}.json").read_text()) for r in range(4)]
    assert [r["sum"] for r in results] == [10.0] * 4  # 1+2+3+4 over both nodes


@pytest.mark.timeout(240)
def test_a_job_that_always_fails_runs_max_retries_plus_one_times(tmp_path: Path) -> None:
    (tmp_path / "fail.py").write_text(ALWAYS_FAILS)
    marker = tmp_path / "attempts"
    proc = _xrun(
        *_ddp(tmp_path, "-j", "1x1", "--max_retries", "2", "--script", "fail.py", str(marker)),
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert marker.read_text().splitlines() == [f"attempt restart={i}" for i in range(3)]


@pytest.mark.timeout(120)
def test_a_fixed_rdzv_port_held_by_another_job_is_refused_at_once(tmp_path: Path) -> None:
    (tmp_path / "x.py").write_text("")  # a script that exists: the port is what is refused
    with socket.create_server(("", 0)) as holder:  # another job's store, listening
        port = holder.getsockname()[1]
        proc = _xrun(
            *_ddp(tmp_path, "-j", "2x1", "--rdzv_port", str(port), "--script", "x.py"),
            cwd=tmp_path,
            timeout=60,
        )
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and proc.stderr.count("\n") == 1
    assert f"port {port} (c10d) is not free on this host" in proc.stderr
    assert "--rdzv_port" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "logs").exists() or not any((tmp_path / "logs").iterdir())


@pytest.mark.timeout(180)
def test_agent_logs_stay_under_the_app_s_log_dir_not_in_tmpdir(tmp_path: Path) -> None:
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    (tmp_path / "hi.py").write_text("print('hi from', __import__('os').environ['RANK'])\n")
    proc = _xrun(
        *_ddp(tmp_path, "-j", "2x2", "--rdzv_port", str(free_port()), "--script", "hi.py"),
        cwd=tmp_path,
        env={"TMPDIR": str(tmpdir)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in tmpdir.iterdir() if p.name.startswith("xrun_")) == []
    [app_dir] = list((tmp_path / "logs").iterdir())
    for replica in (0, 1):
        workers = app_dir / "hi" / str(replica) / "workers" / app_dir.name / "attempt_0"
        assert sorted(p.name for p in workers.iterdir()) == ["0", "1"]
        text = "".join((workers / r / "stdout.log").read_text() for r in ("0", "1"))
        assert text.count("hi from") == 2, text
