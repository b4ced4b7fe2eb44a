"""NVIDIA's ``ft_launcher`` (nvidia-resiliency-ext, a torchrun fork) for measures 18 (issue #34)
and 20 (issue #35), installed by this module into a venv of its own, never the project's.

Version: 0.4.1, the newest release with a wheel this machine can install. 0.5.0 and later ship
``manylinux_2_39`` wheels only (glibc 2.39; Debian 12 has 2.36), and 0.7.0 has none for
CPython 3.11 either. Its wheel declares ``torch>=2.3.0`` among its requirements: it is installed
with ``--no-deps`` plus the small pure-Python packages it imports, so pip never fetches a torch;
the project venv's torch (CPU) and xrun show through a .pth file, as for submitit
(benchmarks/preemption.py). ``nvidia-ml-py`` provides the ``pynvml`` module its GPU health check
imports; without a driver that check logs "NVML Shared Library Not Found" and turns itself off.

Its hot spare: ``--nnodes 2`` with a third agent. The rendezvous (its own c10d handler,
``_ft_rendezvous.py``) puts a node that comes when ``max_nodes`` are already in on a *redundancy
list*; when a participant goes, the spare moves to the wait list and joins the next round (the
default ``--restart-policy any-failed``: every agent restarts its workers, cold).

Measure 18 (one worker of a 1x4 job killed): ``--standalone``. No option of 0.4.1 restarts less
than the node's whole worker group: ``--restart-policy min-healthy`` counts healthy worker
*groups* (nodes) against ``--nnodes``'s minimum, and a group with a dead worker is no longer
HEALTHY, so a single node restarts all its workers under either policy (read in launcher.py,
``_invoke_run_with_min_healthy_policy``; not run). Its in-process restart (``nvidia_resiliency_ext.
inprocess.Wrapper``) is a library the training script must wrap its training function in, and
it restarts that function inside the surviving processes (a terminated rank is left out or
replaced by a spare rank): it does not apply to an unmodified ``examples/train_ddp.py``. Beside the workers
the launcher forks one rank monitor per local rank (``RankMonitorServer``: children of the
launcher, named as it is); measure 18 kills a worker, never one of those (recovery._workers).
"""

from __future__ import annotations

import os
from pathlib import Path

from benchmarks.harness import peer_venv

REPO = Path(__file__).resolve().parent.parent
VERSION = "0.4.1"
# --no-deps: the wheel's own list names torch; these are the rest of it that it imports, pinned
PACKAGES = (f"nvidia-resiliency-ext=={VERSION}", "nvidia-ml-py==13.615.71", "psutil==7.2.2",
            "defusedxml==0.7.1")  # fmt: skip
VENV = Path(os.environ.get("XRUN_BENCH_FTL_VENV", "/var/tmp/xrun-bench-ftl"))


def launcher() -> str:
    """The venv's ``ft_launcher``, made once (~20 s); Unavailable when pip cannot get it."""
    probe = f"import importlib.metadata as m, torch; assert m.version('nvidia-resiliency-ext') == {VERSION!r}"
    peer_venv(VENV, PACKAGES[0], ["--no-deps", *PACKAGES], probe, needs=["ft_launcher"])
    return str(VENV / "bin" / "ft_launcher")


def command(port: int, run_id: str, nproc: int, max_restarts: int) -> list[str]:
    """Three of these on one host: the first binds the store (c10d), the third is the spare."""
    return [
        launcher(), "--nnodes", "2", "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run_id,
        # the values xrun's contenders get, where ft_launcher has the knob
        "--rdzv-conf", "join_timeout=120,last_call_timeout=5", "--max-restarts",
        str(max_restarts), "--tee", "3",
        # no FT config file: its defaults (the workers send no heartbeats, so none time out)
        "--ignore-missing-fault-tol-cfg",
    ]  # fmt: skip


def env() -> dict[str, str]:
    """The workers import xrun (the example's Snapshotter): the tree the benchmark runs from. An
    editable install's .pth is not read through the venv's .pth, hence PYTHONPATH."""
    path = [str(REPO / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {"PYTHONPATH": os.pathsep.join(path)}


def standalone(nproc: int, max_restarts: int) -> list[str]:
    """Measure 18's contender: one ``--standalone`` node, its default restart policy (the others
    are no cheaper here: module doc), through ``env`` for the workers' PYTHONPATH (``env()``):
    the drill starts every contender alike, and ``env`` execs, so the job's pid is the launcher's."""
    return [
        "env", *(f"{k}={v}" for k, v in env().items()), launcher(), "--standalone",
        "--nproc-per-node", str(nproc), "--max-restarts", str(max_restarts), "--tee", "3",
        "--ignore-missing-fault-tol-cfg",
    ]  # fmt: skip
