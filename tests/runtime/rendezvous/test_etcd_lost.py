"""etcd lost mid-job (issue #31, P9), against a real etcd of the test's own that it kills: a job
whose workers all succeed is not failed by etcd's absence at the exit barrier, and an agent cut
off from etcd for ``heartbeat_timeout`` stops its workers saying so, not "closed by a peer"."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.net import free_port
from tests.helpers.waiting import wait_for
from tests.runtime.agent.helpers import agent

pytestmark = pytest.mark.timeout(180)

# Each worker says it started, then waits for the test's "go" file and exits 0.
WORKER = """\
import os, sys, time
out = sys.argv[1]
open(os.path.join(out, "started." + os.environ["RANK"]), "w").close()
while not os.path.exists(os.path.join(out, "go")):
    time.sleep(0.1)
print("done", os.environ["RANK"], flush=True)
"""


@pytest.fixture
def own_etcd(etcd: str, tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """An etcd of this test's own (the suite's is shared): (endpoint, its process)."""
    port, peer = free_port(), free_port()
    proc = subprocess.Popen(
        ["etcd", "--name", "own", "--data-dir", str(tmp_path / "etcd-data")]
        + ["--listen-client-urls", f"http://127.0.0.1:{port}"]
        + ["--advertise-client-urls", f"http://127.0.0.1:{port}"]
        + ["--listen-peer-urls", f"http://127.0.0.1:{peer}"]
        + ["--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}"]
        + ["--initial-cluster", f"own=http://127.0.0.1:{peer}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: _healthy(port), what="the test's etcd", timeout=60)
        yield f"127.0.0.1:{port}", proc
    finally:
        proc.kill()
        proc.wait()


def _healthy(port: int) -> bool:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", "/health")
        return b'"health":"true"' in conn.getresponse().read()
    except OSError:
        return False
    finally:
        conn.close()


def _two_agents(endpoint: str, tmp_path: Path, conf: str) -> list[subprocess.Popen[str]]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    rid = f"t{uuid.uuid4().hex[:12]}"
    cmd = agent(
        *("--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "etcd"),
        *("--rdzv-endpoint", endpoint, "--rdzv-id", rid, "--rdzv-conf", conf),
        *(str(script), str(tmp_path)),
    )
    agents = [
        subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    wait_for(
        lambda: all((tmp_path / f"started.{r}").exists() for r in range(2)),
        what="both workers to start",
        timeout=90,
    )
    return agents


def _ends(agents: list[subprocess.Popen[str]], timeout: float) -> list[tuple[int, str, str]]:
    out = []
    try:
        for a in agents:
            stdout, stderr = a.communicate(timeout=timeout)
            out.append((a.returncode, stdout, stderr))
    finally:
        for a in agents:
            a.kill()
            a.wait()
    return out


def test_etcd_gone_at_the_exit_barrier_is_a_warning(
    own_etcd: tuple[str, subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    endpoint, etcd = own_etcd
    # heartbeat_timeout well beyond the seconds the workers take to finish once told
    agents = _two_agents(endpoint, tmp_path, "heartbeat_timeout=60")
    etcd.kill()
    etcd.wait()
    (tmp_path / "go").touch()  # every worker succeeds, with etcd gone
    for rc, stdout, stderr in _ends(agents, 60):
        assert rc == 0, stderr
        assert "done" in stdout
        assert "a peer failed" not in stderr
        warned = [x for x in stderr.splitlines() if "became unreachable at the exit barrier" in x]
        assert len(warned) == 1, stderr
        assert f"warning: etcd at {endpoint}" in warned[0]
        assert warned[0].endswith("this node's workers succeeded"), warned[0]


def test_an_agent_cut_off_from_etcd_for_heartbeat_timeout_says_so(
    own_etcd: tuple[str, subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    # docs/runtime.md: an agent that cannot reach etcd for heartbeat_timeout closes its part
    # of the job (its lease ran out: the peers may re-form without it). A renewal period over
    # the watcher's 0.5 s retry is what hid it (every failed look reset the clock).
    endpoint, etcd = own_etcd
    agents = _two_agents(endpoint, tmp_path, "heartbeat_interval=1,heartbeat_timeout=3")
    etcd.kill()
    etcd.wait()
    t0 = time.monotonic()
    for rc, _, stderr in _ends(agents, 60):
        assert rc == 1, stderr
        last = stderr.rstrip().splitlines()[-1]
        assert last.startswith(f"xrun-agent: this node lost etcd at {endpoint} for "), stderr
        assert "heartbeat_timeout=3s" in last and "closed by a peer" not in stderr
    assert time.monotonic() - t0 < 40
