"""Reading back what tests/scripts/sigterm_worker.py's workers wrote: one place that knows the
marker files (``<rank>.ready``, ``.term``, ``.alive``), shared by the docker and slurm signal
tests. Each scheduler's test wraps a submitted ``dist.ddp`` of the worker in a :class:`SigtermJob`.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any, Generic, TypeVar

from tests.helpers.paths import SCRIPTS, XRUN
from tests.helpers.waiting import wait_for
from xrun.specs import AppState

WORKER = SCRIPTS / "sigterm_worker.py"
# The role of a dist.ddp of the worker: named after its script (TorchX's --name is EXP/RUN).
ROLE = WORKER.stem


class SigtermJob:
    """A submitted ``dist.ddp`` of the worker (``-j NxM``), and what its workers wrote in ``marks``."""

    def __init__(self, sched: Any, scheme: str, marks: Path, app_id: str, j: str) -> None:
        self.sched, self.marks, self.app_id = sched, marks, app_id
        self.handle = f"{scheme}://default/{app_id}"
        nnodes, nproc = (int(x) for x in j.split("x"))
        self.ranks = [str(r) for r in range(nnodes * nproc)]

    def wait_ready(self) -> None:
        """Until every rank has installed its SIGTERM handler (generous: a backend may be busy
        with other test processes' jobs)."""
        wait_for(lambda: all(self.mark(r, "ready") for r in self.ranks), 90, "every worker ready")

    def mark(self, rank: str, kind: str) -> float | None:
        """The number in ``<rank>.<kind>`` (a time or a pid), None while there is none."""
        path = self.marks / f"{rank}.{kind}"
        return float(path.read_text()) if path.exists() else None

    def term(self, rank: str) -> float:
        when = self.mark(rank, "term")
        assert when is not None, f"rank {rank} got no SIGTERM: {sorted(self.marks.iterdir())}"
        return when

    def lived_after_sigterm(self, rank: str) -> float:
        """How long ``rank`` went on beating after its SIGTERM (call it once it is dead)."""
        last = self.mark(rank, "alive")
        assert last is not None
        return last - self.term(rank)

    def replicas(self) -> list[tuple[int, AppState, int | None]]:
        resp = self.sched.describe(self.app_id)
        assert resp is not None
        return [(r.id, r.state, r.exit_code) for r in resp.roles_statuses[0].replicas]

    def log(self, k: int) -> str:
        return "".join(self.sched.log_iter(self.app_id, ROLE, k))


J = TypeVar("J", bound=SigtermJob)


class SigtermJobs(Generic[J]):
    """Starts jobs of the worker, each with a marker dir of its own, and cancels at the end
    whatever a failed test left. A scheduler's test module names its ``scheme`` and says how to
    wrap a submitted app (``make_job``) and how to cancel one (``cancel``)."""

    scheme = ""

    def __init__(self, sched: Any, workspace: Path, tmp: Path) -> None:
        self.sched, self.workspace, self.tmp = sched, workspace, tmp
        self.started: list[J] = []
        self.clis: list[subprocess.Popen[str]] = []

    def make_job(self, marks: Path, app_id: str, j: str) -> J:
        raise NotImplementedError

    def cancel(self, job: J) -> None:
        raise NotImplementedError

    def new_marks(self) -> Path:
        marks = self.tmp / f"marks{len(self.started)}"
        marks.mkdir()
        return marks

    def adopt(self, marks: Path, app_id: str, j: str) -> J:
        """The job submitted as ``app_id``, once every worker is ready."""
        job = self.make_job(marks, app_id, j)
        self.started.append(job)
        job.wait_ready()
        return job

    def start_cli(
        self, marks: Path, j: str, ddp_args: list[str]
    ) -> tuple[subprocess.Popen[str], J]:
        """``xrun run -s <scheme> --wait dist.ddp <ddp_args>`` from the workspace; returns once
        every worker is ready."""
        cmd = [XRUN, "run", "-s", self.scheme, "--wait", "dist.ddp", *ddp_args]
        proc = subprocess.Popen(
            cmd, cwd=self.workspace, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.clis.append(proc)
        assert proc.stdout is not None
        handle = proc.stdout.readline().strip()
        assert handle.startswith(f"{self.scheme}://default/"), (
            handle,
            proc.communicate(timeout=60),
        )
        return proc, self.adopt(marks, handle.rsplit("/", 1)[1], j)

    def cleanup(self) -> None:
        for proc in self.clis:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        for job in self.started:
            self.cancel(job)
