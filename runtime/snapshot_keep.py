"""Where a job's in-memory snapshots live on this node, and the agent's hold on them while it
waits between attempts.

``snapshot.py``'s collector deletes a job directory that no live process holds (a shared
``flock`` on its ``lock``) and that no attempt entered for ``GC_IDLE_S`` (600 s). The workers
hold it while they run; between two attempts only the agent is alive, and it may wait there
for long (for a spare, for a node to come back): the directory then looked abandoned to any
other job's Snapshotter on the node, and the recovery it was kept for restored from disk or
from scratch. ``Keep`` is the agent's hold for that wait. Standard library only: the agent
imports it (never ``snapshot.py``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Mapping
from pathlib import Path

from xrun.contract import NODE_ID_ENV, RUN_ID_ENV

DIR_ENV = "XRUN_SNAPSHOT_DIR"  # set by the agent (per job); wins over the default below
RUN_ID_ENVS = (RUN_ID_ENV, "TORCHELASTIC_RUN_ID")
DEFAULT_ROOT = "/dev/shm"

__all__ = ["DEFAULT_ROOT", "DIR_ENV", "RUN_ID_ENVS", "Keep", "default_job_dir"]


def default_job_dir(
    environ: Mapping[str, str] | None = None, root: str = DEFAULT_ROOT
) -> Path | None:
    """The job's snapshot directory on this node for a worker with ``environ`` (default
    ``os.environ``): ``$XRUN_SNAPSHOT_DIR``, else ``<root>/xrun-snapshots-<uid>/<run id>@<node
    id>``; None without a run id or without ``root``."""
    env = os.environ if environ is None else environ
    explicit = env.get(DIR_ENV)
    if explicit:
        return Path(explicit)
    run_id = next((env[k] for k in RUN_ID_ENVS if env.get(k)), None)
    if run_id is None or not os.path.isdir(root):
        return None
    # One dir per node of the job: replicas that share a host (local_cwd) are distinct nodes,
    # and a rank that moves to another node must not find its old node's state.
    node = env.get(NODE_ID_ENV)
    name = f"{run_id}@{node}" if node else run_id
    safe = "".join(c if c.isalnum() or c in "-_.@" else "_" for c in name)
    return Path(root) / f"xrun-snapshots-{os.getuid()}" / safe


class Keep:
    """The agent's shared hold on its job's snapshot directory while no worker runs."""

    def __init__(self, run_id: str) -> None:
        # The workers' view: the agent's environment plus the run id it gives them.
        env = {**os.environ, "TORCHELASTIC_RUN_ID": run_id}
        job_dir = default_job_dir(env)
        self._lock = job_dir / "lock" if job_dir is not None else None
        self._fd = -1

    def hold(self) -> None:
        """The workers stopped: hold the directory their attempt left, if any (nothing is
        made: a job that keeps no snapshots leaves nothing on /dev/shm)."""
        if self._fd >= 0 or self._lock is None:
            return
        try:
            fd = os.open(self._lock, os.O_RDWR)
        except OSError:
            return  # no snapshots here (or removed, the job's last attempt done)
        fcntl.flock(fd, fcntl.LOCK_SH)
        self._fd = fd

    def release(self, touch: bool = True) -> None:
        """The next workers started: they take their own hold when they enter. Marked as entered
        now first (``touch``), so the collector leaves the directory alone until they do
        (torch's import alone can take a while), however long the wait was. The agent's exit
        releases it untouched: the job is over."""
        if self._fd < 0:
            return
        if touch:
            with contextlib.suppress(OSError):
                os.utime(self._fd)
        os.close(self._fd)
        self._fd = -1
