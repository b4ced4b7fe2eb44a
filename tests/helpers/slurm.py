"""The real Slurm cluster the test suite starts: the session fixture ``slurm_cluster``.

Imported by tests/conftest.py (``from tests.helpers.slurm import slurm_cluster``). The first
use installs Debian's Slurm 22.05 and munge if missing (~10-20 s) and starts slurmctld plus four
nodes c1..c4 (~1 s; scripts/slurm-cluster.sh). Each pytest process (xdist worker) holds
a lease on the cluster; the last one to finish stops it, but only if a lease started it: a
cluster brought up by hand (``scripts/slurm-cluster.sh up``) is left running.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.helpers.paths import REPO

CLUSTER_SCRIPT = REPO / "scripts" / "slurm-cluster.sh"
STATE = os.environ.get("XRUN_SLURM_STATE", "/var/tmp/xrun-slurm")


@dataclass(frozen=True)
class SlurmCluster:
    """What tests need to know about the running cluster."""

    nodes: tuple[str, ...]
    partition: str
    conf: str
    state_dir: str


def _cluster(action: str) -> None:
    proc = subprocess.run(
        ["bash", str(CLUSTER_SCRIPT), action, str(os.getpid())],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        pytest.fail(
            f"scripts/slurm-cluster.sh {action} failed (exit {proc.returncode}):\n"
            f"{proc.stderr[-3000:]}",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """A running four-node cluster (c1..c4, 4 CPUs each, partition ``debug``)."""
    _cluster("acquire")
    # Clients read /etc/slurm/slurm.conf (a link the script makes); be explicit anyway in
    # case that path belongs to someone else.
    os.environ.setdefault("SLURM_CONF", f"{STATE}/slurm.conf")
    try:
        yield SlurmCluster(
            nodes=("c1", "c2", "c3", "c4"),
            partition="debug",
            conf=os.environ["SLURM_CONF"],
            state_dir=STATE,
        )
    finally:
        _cluster("release")
