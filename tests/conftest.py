"""Suite-wide settings.

- Every test's state (local_cwd app index, logs) goes under a per-session temp dir through
  XDG_STATE_HOME, so the suite never writes into the user's home and runs don't see each other.
- A skipped test is a test that does not exist: a run with skips fails, unless
  XRUN_ALLOW_SKIPS=1 is set on purpose (e.g. a developer without root).
- The real Slurm cluster and Docker Engine fixtures live in their own modules.
- SIGINT is at its default in the suite's processes, whatever the suite was started from (see
  below).
- Property tests (hypothesis) draw the same examples on every run: a CI verdict, pass or fail,
  is the code's, not the draw's (a fresh-clone CI run once failed on a draw no earlier run had
  made). ``XRUN_HYPOTHESIS=hunt`` draws fresh random ones: a bug hunt, whose every find becomes
  an ``@example`` of its test.
"""

from __future__ import annotations

import os
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

# The real backends: session fixtures that start them (idempotent scripts under scripts/).
from tests.helpers.docker import docker_engine, no_watcher  # noqa: F401
from tests.helpers.etcd import etcd  # noqa: F401
from tests.helpers.paths import REPO
from tests.helpers.slurm import slurm_cluster  # noqa: F401

settings.register_profile("suite", derandomize=True, database=None)
settings.register_profile("hunt", derandomize=False)
settings.load_profile("hunt" if os.environ.get("XRUN_HYPOTHESIS") == "hunt" else "suite")

_STATE = tempfile.mkdtemp(prefix="xrun-test-state-")
os.environ["XDG_STATE_HOME"] = _STATE
os.environ.setdefault("NO_COLOR", "1")

# Tests press Ctrl-C (SIGINT) on the xrun commands they start, as a terminal would. A suite
# started from a background job (`cmd &` in a script, nohup, some CI runners) inherits SIGINT
# ignored, and an ignored signal stays ignored in every child across exec: the xrun CLI rightly
# keeps it so (a background job must not die of the terminal's Ctrl-C), and those tests then
# waited for an exit that never came. Catching SIGINT here, as an interactive Python does,
# gives every child the default again. Runs in the controller and in each xdist worker.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture
def state_home() -> Iterator[Path]:
    yield Path(_STATE)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or os.environ.get("XRUN_ALLOW_SKIPS") == "1":
        return
    skipped = reporter.stats.get("skipped", [])
    if skipped and exitstatus == 0:
        reporter.write_line(
            f"xrun: {len(skipped)} test(s) skipped; the suite must run everything "
            "(set XRUN_ALLOW_SKIPS=1 to allow skips locally)",
            red=True,
        )
        session.exitstatus = 1
