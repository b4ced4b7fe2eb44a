"""A real agent (``--spares 1 --recover warm``) whose store hangs while its pool publishes the
workers' modules to the spares (issue #35): the agent still sees its worker fail at once.

The store is served by a process of its own (the agent connects to it as a client), SIGSTOPped
once the first module list is in: the kernel still accepts the agent's requests, nobody answers.
The worker then imports a module of its own (its next report lists it, the pool publishes it:
the store call hangs) and fails. Before the fix the pool made that call on the agent's watch
loop, which saw the failure only after the store's ``read_timeout`` (40 s here).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.store_process import store_process
from tests.helpers.waiting import wait_for
from tests.runtime.agent.helpers import agent
from xrun.runtime.store.client import StoreClient

READ_TIMEOUT = 40  # how long the watch loop blocked before the fix
PROMPT = 15.0  # the failure's log line after the worker's exit: generous on a busy host


WORKER = """\
import os, sys, time
out = sys.argv[1]
open(os.path.join(out, "started"), "w").close()
while not os.path.exists(os.path.join(out, "go")):
    time.sleep(0.05)
import hang_probe_mod  # new: in the next report (1, 2, 3, 5 ... s), published to a hung store
time.sleep(6)  # the report and the pool's next look (every 2 s) come meanwhile
with open(os.path.join(out, "exit"), "w") as f:
    f.write(repr(time.time()))
sys.exit(3)
"""


@pytest.fixture
def store() -> Iterator[tuple[subprocess.Popen[str], int]]:
    with store_process({"xrun/host_run_id": b"hang"}) as served:
        yield served


@pytest.mark.timeout(300)
def test_the_agent_sees_a_worker_fail_while_its_store_hangs(
    tmp_path: Path, store: tuple[subprocess.Popen[str], int]
) -> None:
    proc, port = store
    (tmp_path / "train.py").write_text(WORKER)
    lib = tmp_path / "lib"  # a library (not the script's folder): the workers report it
    lib.mkdir()
    (lib / "hang_probe_mod.py").write_text("")
    path = [str(lib), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    err = tmp_path / "agent.err"
    cmd = agent(
        "--nnodes", "1", "--nproc-per-node", "1", "--spares", "1", "--recover", "warm",
        "--max-restarts", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
        "--rdzv-id", "hang", "--rdzv-conf", f"read_timeout={READ_TIMEOUT}",
        str(tmp_path / "train.py"), str(tmp_path),
    )  # fmt: skip
    with open(err, "w") as f:
        a = subprocess.Popen(
            cmd, stdout=f, stderr=f, stdin=subprocess.DEVNULL, start_new_session=True, env=env
        )
    try:
        wait_for(lambda: (tmp_path / "started").exists(), timeout=120, what="the worker")
        c = StoreClient("127.0.0.1", port, read_timeout=150.0)
        try:  # the pool's first list is in: its connection is open, the next call will hang
            assert c.wait(["hang/kv/spare-modules/1"], timeout=120.0) is not None
        finally:
            c.close()
        os.kill(proc.pid, signal.SIGSTOP)
        (tmp_path / "go").write_text("")
        wait_for(lambda: (tmp_path / "exit").exists(), timeout=60, what="the worker's exit")
        exited = float((tmp_path / "exit").read_text())
        seen = wait_for(
            lambda: "restarting the workers (1/1)" in err.read_text(),
            timeout=READ_TIMEOUT + 60,
            what="the agent to see the failure",
        )
        took = seen - time.monotonic() + time.time() - exited
        assert took < PROMPT, (took, err.read_text())
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        os.killpg(a.pid, signal.SIGKILL)
        a.wait(timeout=30)
