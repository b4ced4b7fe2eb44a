"""``xrun log`` of a docker app while another process finalises it (no engine needed).

The finaliser (``DockerScheduler._finalize``: ``xrun run``'s poll, an ``xrun status`` from
another shell, the app's watcher) keeps each replica's stdout, then its stderr, in the state
dir, and removes the containers only after. A reader that came between the two saves took the
saved stdout as "the logs are kept" and read a stderr file that was not there yet: no line at
all (``Job.stderr()`` without the call's traceback). Here the reader is put exactly there.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from xrun.schedulers.docker import DockerScheduler

APP = "app-1"


class _Container:
    def __init__(self, stderr: bytes) -> None:
        self._stderr = stderr

    def logs(self, *, stdout: bool, stderr: bool, **_: Any) -> list[bytes]:
        return [self._stderr] if stderr and not stdout else []


def _client(container: _Container) -> Any:
    return SimpleNamespace(containers=SimpleNamespace(list=lambda **_: [container]))


def test_a_reader_between_the_saves_of_stdout_and_stderr_reads_the_container(
    tmp_path: Path,
) -> None:
    sched = DockerScheduler("default", state_dir=str(tmp_path))
    # The finaliser has kept stdout; stderr is still only in the (not yet removed) container.
    sched._state_dir.save_log(APP, "r", 0, "stdout", b"2026-01-01T00:00:01Z out\n")
    sched._DockerScheduler__client = _client(  # type: ignore[attr-defined]
        _Container(b"Traceback (most recent call last):\nValueError: boom\n")
    )
    lines = list(sched._log_lines(APP, "r", 0, ["stderr"], None, None, False))
    assert lines == ["Traceback (most recent call last):\n", "ValueError: boom\n"]


def test_kept_logs_are_read_once_both_streams_are_saved(tmp_path: Path) -> None:
    sched = DockerScheduler("default", state_dir=str(tmp_path))
    sched._state_dir.save_log(APP, "r", 0, "stdout", b"2026-01-01T00:00:01Z out\n")
    sched._state_dir.save_log(APP, "r", 0, "stderr", b"2026-01-01T00:00:02Z err\n")
    # No engine is asked: the kept files are complete.
    sched._DockerScheduler__client = SimpleNamespace()  # type: ignore[attr-defined]
    assert list(sched._log_lines(APP, "r", 0, ["stderr"], None, None, False)) == ["err\n"]
    assert not list(tmp_path.glob("**/*.tmp"))  # saved through a temporary name
