"""Warm spares (``--spares``, runtime/rendezvous/spares.py) with real agents and real gloo
workers: several ``xrun-agent`` processes on one host, each its own node (``XRUN_NODE_ID``) in
its own process group, on the c10d store rendezvous. A node is lost by SIGKILL of its agent's
process group (its workers die with it: PR_SET_PDEATHSIG)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.net import free_port
from tests.helpers.paths import SCRIPTS
from tests.helpers.waiting import wait_for
from tests.runtime.agent.helpers import agent, events, serving

WORKER = str(SCRIPTS / "spare_worker.py")
# heartbeats as the other agent tests (FAST); a last call long enough for a spare on a busy host
# The advertised addresses order the nodes (the rank rule): b is group rank 0, a (the store's
# host, which must survive) group rank 1, and the spare c would sort last, so a spare that
# merely re-formed by the rank rule would get group rank 1 and move a to 0.
ADDR = {"a": "127.0.0.2", "b": "127.0.0.1", "c": "127.0.0.3"}
CONF = "heartbeat_interval=0.2,heartbeat_timeout=1.5,last_call_timeout=5,join_timeout={join}"


def start(
    procs: list[subprocess.Popen[str]],
    port: int,
    out: Path,
    name: str,
    nnodes: str,
    join: int,
    flags: tuple[str, ...] = (),
    args: tuple[str, ...] = (),
) -> subprocess.Popen[str]:
    """Agent ``name`` with more agent ``flags``, its workers with ``args``."""
    cmd = agent(
        "--nnodes", nnodes, "--nproc-per-node", "1", "--spares", "1", "--max-restarts", "3",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "spares",
        "--local-addr", ADDR[name], *flags,
        "--rdzv-conf", CONF.format(join=join), WORKER, str(out), *args,
    )  # fmt: skip
    return spawn(procs, cmd, out, name)


def spawn(
    procs: list[subprocess.Popen[str]], cmd: list[str], out: Path, name: str
) -> subprocess.Popen[str]:
    """Agent ``cmd`` as node ``name`` (``XRUN_NODE_ID``) in a session of its own, its stderr in
    ``out/agent.<name>.err`` (``stderr``)."""
    err = open(out / f"agent.{name}.err", "w")  # noqa: SIM115 - the agent writes it
    p = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=err, text=True, stdin=subprocess.DEVNULL,
        env={**os.environ, "XRUN_NODE_ID": name}, start_new_session=True,
    )  # fmt: skip
    err.close()
    procs.append(p)
    return p


def stderr(out: Path, name: str) -> str:
    return (out / f"agent.{name}.err").read_text()


def world(out: Path, n: int) -> list[dict[str, object]]:
    """The n-th world's events (2 workers each) once all of it reported, in rank order."""
    wait_for(lambda: len(events(out)) >= 2 * n, timeout=120, what=f"world {n} to report")
    evs = events(out)[2 * (n - 1) : 2 * n]
    return sorted(evs, key=lambda e: int(str(e["RANK"])))


def cpu_ticks(pid: int) -> int:
    """User + system CPU time of process ``pid`` so far, in clock ticks."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def warm_children(pid: int) -> int:
    """How many ``--recover warm`` pool children of agent ``pid`` are warm (workers/pool.py:
    a child that imported torch marks ``<pool dir>/ready.<its pid>``)."""
    n = 0
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        argv = Path(f"/proc/{child}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        if len(argv) > 4 and argv[-3] == b"warm":
            n += (Path(os.fsdecode(argv[-2])) / f"ready.{child}").exists()
    return n


def lose(p: subprocess.Popen[str]) -> None:
    """The node is lost: SIGKILL to its agent's process group (its workers die with it)."""
    os.killpg(p.pid, signal.SIGKILL)
    p.wait(timeout=30)


def pair_and_spare(
    procs: list[subprocess.Popen[str]],
    out: Path,
    nnodes: str,
    join: int = 30,
    flags: tuple[str, ...] = (),
    args: tuple[str, ...] = (),
) -> tuple[dict[str, subprocess.Popen[str]], list[dict[str, object]]]:
    """Nodes a (the store's host) and b form a world; then c arrives and parks as a spare."""
    port = free_port()
    agents = {"a": start(procs, port, out, "a", nnodes, join, flags, args)}
    wait_for(lambda: serving(port), what="the first agent's store", timeout=60)
    agents["b"] = start(procs, port, out, "b", nnodes, join, flags, args)
    first = world(out, 1)
    assert [(e["XRUN_NODE_ID"], e["WORLD_SIZE"]) for e in first] == [("b", "2"), ("a", "2")]
    agents["c"] = start(procs, port, out, "c", nnodes, join, flags, args)
    wait_for(lambda: "standing by as a spare" in stderr(out, "c"), timeout=60, what="a spare")
    return agents, first


@pytest.mark.timeout(240)
@pytest.mark.parametrize("recover", ["off", "warm"])
def test_spare_takes_the_lost_nodes_slot(
    tmp_path: Path, procs: list[subprocess.Popen[str]], recover: str
) -> None:
    """2 nodes x 1 gloo worker + 1 spare: the spare parks past join_timeout without using
    CPU; node b (group rank 0; a hosts the store) is lost; the spare becomes group rank 0,
    a stays group rank 1, every RANK stays, and the job finishes 0. (Before, a third agent
    stood by only until join_timeout, and re-formed by the rank rule: a became rank 0, the
    spare rank 1.) With --recover warm the spare's worker starts from its warm pool."""
    agents, first = pair_and_spare(procs, tmp_path, "2", 10, ("--recover", recover))
    if recover == "warm":  # its pool's child imported torch (slow on a busy host)
        wait_for(lambda: warm_children(agents["c"].pid), timeout=180, what="a warm child")
    # parked: a blocking WAIT on the store, no CPU, and no join_timeout (10 s) to run out
    before = cpu_ticks(agents["c"].pid)
    time.sleep(12)
    assert agents["c"].poll() is None, stderr(tmp_path, "c")
    assert cpu_ticks(agents["c"].pid) - before <= 5  # 50 ms in 12 s, on a busy host
    lost = next(e for e in first if e["XRUN_NODE_ID"] == "b")
    survivor = next(e for e in first if e["XRUN_NODE_ID"] == "a")
    lost_at = time.time()
    lose(agents["b"])
    second = world(tmp_path, 2)
    # for the eye (pytest -s): the loss to the replacement world's first all_reduce
    print(f"recover={recover}: {max(float(str(e['t'])) for e in second) - lost_at:.2f} s")
    place = {str(e["XRUN_NODE_ID"]): (e["RANK"], e["GROUP_RANK"]) for e in second}
    assert place == {
        "a": (survivor["RANK"], survivor["GROUP_RANK"]),
        "c": (lost["RANK"], lost["GROUP_RANK"]),
    }, second
    assert [e["WORLD_SIZE"] for e in second] == ["2", "2"]
    assert [e["sum"] for e in second] == [3.0, 3.0]  # a real gloo world of ranks 0 and 1
    (tmp_path / "go").touch()
    for name in ("a", "c"):
        assert agents[name].wait(timeout=120) == 0, stderr(tmp_path, name)
    assert "standing by as a spare" in stderr(tmp_path, "c")
    warm = "1 of 1 workers started warm (--recover warm)" in stderr(tmp_path, "c")
    assert warm == (recover == "warm"), stderr(tmp_path, "c")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("nnodes", ["2", "1:2"])
def test_second_loss_without_spare_behaves_as_before(
    tmp_path: Path, procs: list[subprocess.Popen[str]], nnodes: str
) -> None:
    """The spare is used up by a first loss; a second loss then does what a job without spares
    does: a fixed-size job (``--nnodes 2``) fails once join_timeout ran out waiting for a
    second node, an elastic one (``1:2``) goes on with the survivor alone."""
    agents, first = pair_and_spare(procs, tmp_path, nnodes, join=15)
    lost = next(e for e in first if e["XRUN_NODE_ID"] == "b")
    lose(agents["b"])
    second = world(tmp_path, 2)
    assert {str(e["XRUN_NODE_ID"]): e["RANK"] for e in second}["c"] == lost["RANK"], second
    lose(agents["c"])
    if nnodes == "2":
        assert agents["a"].wait(timeout=120) == 1
        assert "fewer than 2 node(s) joined within join_timeout" in stderr(tmp_path, "a")
        return
    alone = events(tmp_path)
    wait_for(lambda: len(events(tmp_path)) == 5, timeout=120, what="the survivor alone")
    alone = events(tmp_path)[4]
    assert (alone["RANK"], alone["WORLD_SIZE"], alone["XRUN_NODE_ID"]) == ("0", "1", "a")
    (tmp_path / "go").touch()
    assert agents["a"].wait(timeout=120) == 0, stderr(tmp_path, "a")


@pytest.mark.timeout(240)
def test_a_worker_failure_leaves_the_spare_parked(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    """A worker failure (not a lost node): both nodes re-form on their own slots, the spare
    stays parked (it takes no arrival index before the round's members left the last one,
    so it cannot push a member out), and exits 0 with the job."""
    agents, first = pair_and_spare(procs, tmp_path, "2", 30, args=("b",))
    second = world(tmp_path, 2)
    assert [(e["XRUN_NODE_ID"], e["RANK"]) for e in second] == [("b", "0"), ("a", "1")], second
    assert agents["c"].poll() is None
    (tmp_path / "go").touch()
    for name in ("a", "b", "c"):
        assert agents[name].wait(timeout=120) == 0, stderr(tmp_path, name)
    # the members came first: the spare found round 1 full and parked on it
    assert "standing by as a spare: the world of round 1 is full" in stderr(tmp_path, "c")


PROBE = """import json, os, sys
with open(os.environ["SPARE_PROBE_OUT"], "a") as f:  # one line per process that imports it
    f.write(json.dumps({"pid": os.getpid(), "argv": sys.argv}) + "\\n")
"""


@pytest.mark.timeout(300)
def test_the_spares_pool_imports_what_the_jobs_workers_import(
    tmp_path: Path, procs: list[subprocess.Popen[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue #35: a spare's pool never ran the script, so its warm children held torch alone;
    the replacement's workers imported the rest (torch._dynamo, sympy, ... ~10-25 s of CPU on
    a busy host) while every survivor waited in init_process_group. Now the active agents
    share their workers' module reports through the store and the parked spare's children
    import them: the replacement worker's process imported the job's library module (a probe
    on PYTHONPATH, which torch never imports) while it idled, before it got its rank."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "xrun_spare_probe.py").write_text(PROBE)
    probes = tmp_path / "probes.jsonl"
    path = [str(lib), *filter(None, [os.environ.get("PYTHONPATH")])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(path))
    monkeypatch.setenv("SPARE_PROBE", "xrun_spare_probe")
    monkeypatch.setenv("SPARE_PROBE_OUT", str(probes))
    agents, first = pair_and_spare(procs, tmp_path, "2", 30, ("--recover", "warm"))

    def spare_probed() -> bool:  # a child of the parked spare imported the probe
        kids = Path(f"/proc/{agents['c'].pid}/task/{agents['c'].pid}/children").read_text()
        lines = probes.read_text().splitlines() if probes.exists() else []
        return any(json.loads(ln)["pid"] in map(int, kids.split()) for ln in lines)

    wait_for(spare_probed, timeout=180, what="the spare's warm child to import the probe")
    lose(agents["b"])
    second = world(tmp_path, 2)
    worker = next(e for e in second if e["XRUN_NODE_ID"] == "c")
    imported = [json.loads(ln) for ln in probes.read_text().splitlines()]
    mine = [p["argv"] for p in imported if p["pid"] == worker["pid"]]
    # imported once, by the warm child while idle (its argv), never again by the script
    assert len(mine) == 1 and "warm" in mine[0] and "spare_worker.py" not in str(mine[0]), mine
    (tmp_path / "go").touch()
    for name in ("a", "c"):
        assert agents[name].wait(timeout=120) == 0, stderr(tmp_path, name)
    assert "1 of 1 workers started warm (--recover warm)" in stderr(tmp_path, "c")
