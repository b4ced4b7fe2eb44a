"""What tracking costs a job: the import in a worker, one add_metadata on a local dir, and
nothing at all for a job that does not track (issue #25's budgets). The budgets are of CPU
time, not wall time: the suite must pass on a loaded machine (#31)."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

from xrun.tracker.fsspec_backend import create

IMPORT_BUDGET_MS = 30.0
ADD_METADATA_BUDGET_MS = 1.0


def _import_ms() -> tuple[float, set[str]]:
    """``import xrun.tracker``'s CPU time in a fresh interpreter (this thread's: a busy machine
    stretches the wall time, not this), and the modules it loaded on top of a bare start."""
    code = (
        "import sys, time; before = set(sys.modules); t0 = time.thread_time(); "
        "import xrun.tracker; ms = (time.thread_time() - t0) * 1000; "
        "print(ms, ' '.join(sorted(set(sys.modules) - before)))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    ms, *loaded = r.stdout.split()
    return float(ms), set(loaded)


# What ``import xrun.tracker`` may load beside xrun's own modules: the interpreter's cheapest.
CHEAP = {
    "__future__", "_collections", "_operator", "collections", "collections.abc", "functools",
    "itertools", "keyword", "operator", "reprlib", "types", "_functools", "enum", "re",
}  # fmt: skip


def test_import_in_a_worker_is_cheap_and_pulls_in_no_backend() -> None:
    best, loaded = min(_import_ms() for _ in range(3))
    print(f"import xrun.tracker: {best:.1f} ms of CPU")
    assert best <= IMPORT_BUDGET_MS
    heavy = {"fsspec", "mlflow", "json", "dataclasses", "inspect", "importlib.metadata"}
    assert not heavy & loaded, heavy & loaded
    assert {m for m in loaded if m.split(".")[0] != "xrun"} <= CHEAP, loaded


def test_add_metadata_on_a_local_dir_median(tmp_path: Path) -> None:
    tracker = create(str(tmp_path))
    tracker.add_metadata("local_cwd://default/a", warm=1)
    times = []
    for i in range(300):
        t0 = time.thread_time()  # CPU time: a busy machine stretches the wall time, not this
        tracker.add_metadata("local_cwd://default/a", step=i, loss=1.0 / (i + 1))
        times.append((time.thread_time() - t0) * 1000)
    median = statistics.median(times)
    print(f"add_metadata median: {median:.3f} ms")
    assert median <= ADD_METADATA_BUDGET_MS
    assert tracker.metadata("local_cwd://default/a")["step"] == 299


def test_a_job_that_does_not_track_pays_nothing() -> None:
    """The agent does not import the tracker (nor fsspec): only the job's own code would."""
    code = (
        "import sys, xrun.runtime.agent, xrun.runtime.config; "
        "print(sorted(m for m in sys.modules if 'tracker' in m or m.startswith('fsspec')))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]"
