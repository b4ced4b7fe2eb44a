"""The tee's tailing of log files, in-process: inotify wake-ups, the polling fallback, an
overflowed inotify queue, and a burst larger than one read turn.

The end-to-end behaviour (workers, no lost or split lines, a closed console) is in
test_logs.py; these pin the paths a worker cannot steer on demand.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.waiting import poll_until
from xrun.runtime.workers import tee as _tee
from xrun.runtime.workers.inotify import Inotify
from xrun.runtime.workers.tee import Tee


class _Setup:
    def __init__(self, tmp: Path, n_files: int) -> None:
        self.console_path = tmp / "console"
        self.console = os.open(self.console_path, os.O_WRONLY | os.O_CREAT, 0o600)
        self.logs = [tmp / f"{r}.log" for r in range(n_files)]
        # The worker's side: its own fd on the log file, as the launcher hands it over.
        self.writers = [os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600) for p in self.logs]
        self.tee = Tee("test-tee")
        for r, p in enumerate(self.logs):
            self.tee.add_file(str(p), self.console, f"[{r}]:")

    def shown(self) -> str:
        return self.console_path.read_text()

    def close(self) -> None:
        self.tee.close()
        for fd in (*self.writers, self.console):
            os.close(fd)


@pytest.fixture
def two_files(tmp_path: Path) -> Iterator[_Setup]:
    s = _Setup(tmp_path, 2)
    yield s
    if s.tee._wake_r != -1:  # the test did not close it
        s.close()


def test_a_written_line_reaches_the_console_before_close(two_files: _Setup) -> None:
    os.write(two_files.writers[1], b"start\n")
    two_files.tee.start()
    assert two_files.tee._inotify is not None  # woken by inotify, not by polling
    # Only once the start-up read is done does the next line need a wake-up.
    assert poll_until(lambda: two_files.shown() == "[1]:start\n", 5), two_files.shown()
    os.write(two_files.writers[1], b"hello\nhalf")
    want = "[1]:start\n[1]:hello\n"
    assert poll_until(lambda: two_files.shown() == want, 5), two_files.shown()
    two_files.close()
    assert two_files.shown() == want + "[1]:half\n"  # the partial line, ended at close
    assert two_files.logs[1].read_text() == "start\nhello\nhalf"  # the file is untouched


def test_what_was_written_before_start_is_shown(two_files: _Setup) -> None:
    os.write(two_files.writers[0], b"early\n")  # before any watch existed
    two_files.tee.start()
    assert poll_until(lambda: two_files.shown() == "[0]:early\n", 5), two_files.shown()


def test_without_inotify_the_files_are_polled(
    two_files: _Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    class NoInotify:
        def __init__(self) -> None:
            raise OSError(24, "inotify_init1: Too many open files")

    monkeypatch.setattr(_tee, "Inotify", NoInotify)
    os.write(two_files.writers[0], b"start\n")
    two_files.tee.start()
    assert two_files.tee._inotify is None
    assert poll_until(lambda: two_files.shown() == "[0]:start\n", 5), two_files.shown()
    os.write(two_files.writers[0], b"a\n")
    os.write(two_files.writers[1], b"b\n")
    want = ["[0]:a", "[0]:start", "[1]:b"]
    assert poll_until(lambda: sorted(two_files.shown().splitlines()) == want, 5)


def test_an_overflowed_queue_reads_every_file(
    two_files: _Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The kernel reports overflow, not which files changed: the tee must read them all. (A
    # real overflow is shown in the next test; here it is forced on every wake-up.)
    class Overflowing(Inotify):
        def read(self) -> set[int] | None:
            super().read()
            return None

    monkeypatch.setattr(_tee, "Inotify", Overflowing)
    os.write(two_files.writers[0], b"before\n")  # read at start, before any wake-up
    two_files.tee.start()
    assert poll_until(lambda: two_files.shown() == "[0]:before\n", 5), two_files.shown()
    os.write(two_files.writers[0], b"x\n")
    assert poll_until(lambda: two_files.shown() == "[0]:before\n[0]:x\n", 5), two_files.shown()


def test_inotify_reports_a_real_queue_overflow(tmp_path: Path) -> None:
    limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    paths = [tmp_path / "a", tmp_path / "b"]
    fds = [os.open(p, os.O_WRONLY | os.O_CREAT, 0o600) for p in paths]
    ino = Inotify()
    try:
        wds = [ino.watch(str(p)) for p in paths]
        os.write(fds[0], b"1")
        assert ino.read() == {wds[0]}
        assert ino.read() == set()
        # Alternating files: consecutive events differ, so the kernel cannot merge them.
        for i in range(limit + 10):
            os.write(fds[i % 2], b"1")
        assert ino.read() is None
    finally:
        ino.close()
        for fd in fds:
            os.close(fd)


def test_watching_a_missing_file_names_it(tmp_path: Path) -> None:
    ino = Inotify()
    try:
        with pytest.raises(OSError, match="missing.log"):
            ino.watch(str(tmp_path / "missing.log"))
    finally:
        ino.close()


@pytest.mark.timeout(60)
def test_a_burst_longer_than_one_turn_is_shown_without_another_write(
    two_files: _Setup,
) -> None:
    # One wake-up reads at most _FILE_TURN bytes of a file; the rest must follow without
    # waiting for the worker's next write (it may never write again).
    line = b"y" * 99 + b"\n"
    n = 3 * _tee._FILE_TURN // len(line)
    two_files.tee.start()
    os.write(two_files.writers[0], line * n)
    os.write(two_files.writers[1], b"other\n")
    want = n * len(b"[0]:") + n * len(line) + len(b"[1]:other\n")
    assert poll_until(lambda: two_files.console_path.stat().st_size == want, 20)
    shown = two_files.shown().splitlines()
    assert shown.count("[0]:" + "y" * 99) == n and "[1]:other" in shown


@given(
    lines=st.lists(st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"")), max_size=20),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=10),
    unterminated=st.booleans(),
    prefix=st.sampled_from([b"", b"[default3]:"]),
)
@settings(max_examples=300, deadline=None)
def test_console_gets_every_line_whole_and_prefixed_however_the_chunks_fall(
    lines: list[bytes], cuts: list[int], unterminated: bool, prefix: bytes
) -> None:
    text = b"".join(line + b"\n" for line in lines)
    if unterminated:
        text += b"last"
    r, w = os.pipe()
    log_r, log_w = os.pipe()
    try:
        s = _tee._Stream(-1, log_w, w, prefix)
        points = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
        for a, b in pairwise(points):
            s.feed(text[a:b])
        s.finish()
        os.close(w)
        os.close(log_w)
        shown = os.read(r, 1 << 20)
        logged = os.read(log_r, 1 << 20)
    finally:
        for fd in (r, log_r):
            os.close(fd)
    want = [*lines, b"last"] if unterminated else lines
    assert shown == b"".join(prefix + line + b"\n" for line in want)
    assert logged == text  # the log copy is byte for byte


def test_a_line_longer_than_the_cap_goes_out_in_pieces_each_ended(tmp_path: Path) -> None:
    out = tmp_path / "out"
    fd = os.open(out, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        s = _tee._Stream(-1, None, fd, b"[p]:")
        chunk = b"z" * (_tee._MAX_PARTIAL // 2)
        for _ in range(3):
            s.feed(chunk)
        s.feed(b"end\n")
        s.finish()
    finally:
        os.close(fd)
    got = out.read_bytes().split(b"\n")
    assert got[-1] == b"" and all(piece.startswith(b"[p]:") for piece in got[:-1])
    assert b"".join(piece[4:] for piece in got[:-1]) == chunk * 3 + b"end"
    assert max(len(piece) for piece in got) <= _tee._MAX_PARTIAL + len(chunk) + 4


def test_close_shows_everything_however_far_the_tee_lagged(
    two_files: _Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A worker may write far ahead of the tee (a file never blocks it). The final drain reads
    # each file up to its size at close, not up to the byte cap that bounds a pipe's drain.
    monkeypatch.setattr(_tee, "_DRAIN_CAP", 1024)
    os.write(two_files.writers[0], b"".join(b"%d\n" % i for i in range(50000)))  # 290 KiB
    two_files.close()  # never started: close drains
    assert two_files.shown().splitlines() == [f"[0]:{i}" for i in range(50000)]
