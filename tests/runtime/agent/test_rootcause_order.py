"""Which failure is the root cause when the agent sees two at once (a stress run of
tests/runtime/agent/test_warm.py): rank 1 is killed from outside, rank 0 raises because its
connection to rank 1 closed. On a busy host the agent may look only once both are gone; it
used to name the lower local rank (rank 0's ConnectionError), hiding the kill."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.waiting import wait_for

from .helpers import agent

WORKERS = """
import os, signal, socket, sys, time
rank, d = int(os.environ["LOCAL_RANK"]), sys.argv[1]
path = os.path.join(d, "sock")
with open(os.path.join(d, f"pid{rank}"), "w") as f:
    f.write(str(os.getpid()))
if rank == 1:
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.listen(1)
    conn, _ = s.accept()
    open(os.path.join(d, "ready"), "w").close()
    while not os.path.exists(os.path.join(d, "go")):
        time.sleep(0.01)
    os.kill(os.getpid(), signal.SIGKILL)
while True:
    try:
        c = socket.socket(socket.AF_UNIX)
        c.connect(path)
        break
    except OSError:
        time.sleep(0.01)
if c.recv(1) == b"":
    raise ConnectionError("connection closed by peer (rank 1)")
"""


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


@pytest.mark.timeout(120)
def test_a_kill_seen_with_the_peer_it_made_raise_is_the_root_cause(tmp_path: Path) -> None:
    script = tmp_path / "w.py"
    script.write_text(WORKERS)
    proc = subprocess.Popen(
        agent("--nproc-per-node", "2", "--tee", "3", str(script), str(tmp_path)),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        wait_for(lambda: (tmp_path / "ready").exists(), timeout=60)
        pids = [int((tmp_path / f"pid{r}").read_text()) for r in (0, 1)]
        # The agent does not look while both die (as a descheduled agent on a busy host)
        os.kill(proc.pid, signal.SIGSTOP)
        (tmp_path / "go").touch()
        wait_for(lambda: all(_zombie(p) for p in pids), timeout=30)
        time.sleep(1.1)  # and into the next second
        os.kill(proc.pid, signal.SIGCONT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, err
    root = [ln for ln in err.splitlines() if ln.startswith("xrun-agent: root cause: ")]
    assert root and "killed by SIGKILL" in root[-1] and "rank 1" in root[-1], err[-3000:]
    assert "ConnectionError" not in root[-1]
