"""Tee: copy workers' output to their log files and to the agent's console.

Two kinds of stream, both served by one thread through a selector, as data arrives:

* **files** (``add_file``, whenever there is a log file, as with the agent): the worker
  writes its log file itself and the tee tails it, woken by inotify. Measured on 2 cores with
  4 workers x 250k lines: this takes about half the kernel time of a pipe, since the bytes
  cross one fewer copy (no pipe, no second write of the file), and a worker never waits for
  the tee (a pipe would block it once full);
* **pipes** (``add``, for console-only tee without a log file): the tee reads the pipe and
  writes the log file (if any) with the bytes unchanged.

The console gets whole lines only, each with the rank's prefix (``[default0]:``), so lines
of concurrent workers never interleave mid-line. The console is the agent's fd 1/2 while
``sys.stdout``/``sys.stderr`` are the process's own, else those Python objects (``Console``):
pytest's capture, Jupyter and ``redirect_stdout`` see a library call's tee as torch's.
Lines matching a ``--duplicate-std*-filters`` string also go, prefixed, to a filtered log. Prefixing works on whole chunks
(``bytes.replace``) and cuts at the chunk's last newline: the per-line cost stays in C.
A partial last line is held until its newline arrives, or written (newline added) when the
stream ends or the tee closes.
"""

from __future__ import annotations

import fcntl
import os
import selectors
import sys
import threading
from typing import Any, NamedTuple

from .inotify import Inotify

# Bigger pipes let a worker print a burst while this thread waits for a CPU. Not bigger:
# pipe buffers count against the user's pipe-user-pages-soft (64 MiB by default), past which
# the kernel gives every new pipe of that user a single page; 8 workers x 2 streams x 256 KiB
# is 4 MiB per agent, so several agents on a node stay well clear of it.
_PIPE_SIZE = 256 << 10
# Not bigger: CPython allocates the whole size before each read, and an allocation of 1 MiB
# goes to mmap/munmap every time (measured: 21 us per read instead of 2 us).
_READ_SIZE = 64 << 10
# A "line" this long without a newline is written out anyway: memory stays bounded.
_MAX_PARTIAL = 1 << 20
# What the final drain reads at most of a pipe (see ``Tee._drain_all``).
_DRAIN_CAP = 64 << 20
# What one wake-up reads of one log file before serving the others (fairness); the rest is
# read on the next turn of the loop, without waiting for another write.
_FILE_TURN = 1 << 20
# How often the files are read where inotify is missing (not Linux, instances used up).
_POLL_INTERVAL = 0.1


def make_pipe() -> tuple[int, int]:
    """A close-on-exec pipe ``(read_fd, write_fd)``, enlarged where the kernel allows."""
    r, w = os.pipe2(os.O_CLOEXEC)
    try:
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, _PIPE_SIZE)
    except (AttributeError, OSError):  # not Linux, or over the user's limit
        pass
    return r, w


def write_all(fd: int, data: bytes | memoryview) -> None:
    """``os.write`` until every byte is out (a pipe or terminal may take less per call)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def writev_all(fd: int, parts: tuple[bytes | memoryview, ...]) -> None:
    """``parts`` in one ``writev`` where the fd takes it all (a file does), else the rest
    through ``write_all``."""
    n = os.writev(fd, parts)
    total = sum(len(p) for p in parts)
    if n < total:
        write_all(fd, memoryview(b"".join(parts))[n:])


class Console(NamedTuple):
    """Where tee'd lines go: the fd, or (when set) the Python text stream that replaced it."""

    fd: int
    stream: Any = None

    def write(self, parts: tuple[bytes | memoryview, ...]) -> None:
        if self.stream is None:
            writev_all(self.fd, parts)
        else:
            self.stream.write(b"".join(parts).decode(errors="replace"))
            self.stream.flush()


# A filtered copy: the file it goes to (shared by the ranks) and the strings a line must hold.
Filter = tuple[int, tuple[bytes, ...]]


class _Stream:
    __slots__ = ("fd", "file_fd", "console", "prefix", "partial", "owned", "path", "filt")

    def __init__(
        self,
        fd: int,
        file_fd: int | None,
        console: Console | int | None,
        prefix: bytes,
        filt: Filter | None = None,
    ):
        self.fd = fd
        self.file_fd = file_fd
        self.console = Console(console) if isinstance(console, int) else console
        self.prefix = prefix
        self.partial = b""
        self.filt = filt
        # What close() must close, even after a failed target was dropped from the fields.
        self.owned = [fd] if file_fd is None else [fd, file_fd]
        self.path: str | None = None  # a tailed log file (``fd`` reads it); None: a pipe

    def feed(self, data: bytes) -> None:
        if self.file_fd is not None:
            self._write(self.file_fd, (data,), is_console=False)
        if self.console is None and self.filt is None:
            return
        end = data.rfind(b"\n") + 1
        if end == 0:  # no line ends here
            if len(self.partial) + len(data) < _MAX_PARTIAL:
                self.partial += data
            else:  # a "line" this long goes out anyway, ended here: memory stays bounded
                self._out((self.prefix, self.partial, data, b"\n"))
                self._filter(self.partial + data + b"\n")
                self.partial = b""
            return
        if self.filt is not None:
            self._filter(self.partial + data[:end])
        if self.console is None:
            self.partial = data[end:]
            return
        # The lines in data[:end], each prefixed, with the held partial line in front. One
        # copy in all (the replace): the prefix in front and the held line go out as separate
        # iovecs, and the tail after ``end`` (no newline in it, so unchanged by the replace) is
        # cut off by a view.
        head = (self.partial,) if self.partial else ()
        if self.prefix:
            body = data.replace(b"\n", b"\n" + self.prefix)
            lines = memoryview(body)[: len(body) - (len(data) - end) - len(self.prefix)]
            self._out((self.prefix, *head, lines))
        else:
            self._out((*head, memoryview(data)[:end]))
        self.partial = data[end:]

    def finish(self) -> None:
        """The stream ended: write the held partial line, newline-terminated."""
        if self.partial:
            self._out((self.prefix, self.partial, b"\n"))
            self._filter(self.partial + b"\n")
        self.partial = b""

    def _filter(self, lines: bytes) -> None:
        """Whole lines (each ending in a newline) that hold a filter string, prefixed."""
        if self.filt is None:
            return
        fd, needles = self.filt
        keep = [
            self.prefix + line + b"\n"
            for line in lines.split(b"\n")[:-1]
            if any(n in line for n in needles)
        ]
        if keep:
            try:
                write_all(fd, b"".join(keep))
            except OSError:
                self.filt = None

    def _out(self, parts: tuple[bytes | memoryview, ...]) -> None:
        if self.console is None:
            return
        try:
            self.console.write(parts)
        except (OSError, ValueError):
            # A closed console (``| head``, a closed StringIO) must not stop the log file,
            # nor stall the worker on a pipe nobody drains: drop this target, keep reading.
            self.console = None

    def _write(self, fd: int, parts: tuple[bytes | memoryview, ...], is_console: bool) -> None:
        try:
            writev_all(fd, parts)
        except OSError:
            # A full disk must not stop the console copy: drop this target, keep reading.
            self.file_fd = None


class Tee:
    """Copies pipes and tails log files to console fds (pipes: to files too) on one background
    thread.

    Usage: ``add``/``add_file`` every stream, ``start``, later ``close`` (after the workers
    exited: a tailed file has no end of its own). The tee owns (and closes) the read ends and
    the file fds it is given; console fds stay open.
    """

    def __init__(self, name: str = "xrun-tee") -> None:
        self._streams: list[_Stream] = []
        self._owned: list[int] = []  # filtered-log fds, shared by streams
        self._stopped = False
        self._name = name
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC)
        self._closing = False  # the workers are gone: read the files to their end and stop
        self._stop = False  # stop now, pipes at end of file or not
        self._inotify: Inotify | None = None
        self._watched: dict[int, _Stream] = {}

    def add(
        self,
        fd: int,
        file_fd: int | None,
        console: Console | int | None,
        prefix: str = "",
        filt: Filter | None = None,
    ) -> None:
        """A pipe's read end: copied to ``file_fd`` unchanged and to ``console`` prefixed."""
        os.set_blocking(fd, False)
        self._streams.append(_Stream(fd, file_fd, console, prefix.encode(), filt))

    def add_file(
        self, path: str, console: Console | int, prefix: str = "", filt: Filter | None = None
    ) -> None:
        """A log file a worker writes: its lines go to ``console`` prefixed, as they come."""
        s = _Stream(os.open(path, os.O_RDONLY | os.O_CLOEXEC), None, console, prefix.encode(), filt)
        s.path = path
        self._streams.append(s)

    def own(self, fd: int) -> None:
        """Close ``fd`` (a filtered log) when the tee closes."""
        self._owned.append(fd)

    def __len__(self) -> int:
        return len(self._streams)

    def stopped(self) -> bool:
        """True once ``close`` copied everything and stopped (torch's ``TailLog.stopped``)."""
        return self._stopped

    def start(self) -> None:
        if not self._streams:
            return  # nothing to copy: no thread
        files = [s for s in self._streams if s.path is not None]
        if files:
            try:
                self._inotify = Inotify()
                for s in files:
                    assert s.path is not None
                    self._watched[self._inotify.watch(s.path)] = s
            except OSError:  # no inotify here: poll the files instead
                if self._inotify is not None:
                    self._inotify.close()
                self._inotify = None
                self._watched = {}
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def close(self, timeout: float = 1.0) -> None:
        """Copy what is left and stop: the tailed files to their end, the pipes to end of file
        within ``timeout`` s, then whatever they hold.

        Everything the workers wrote is in the pipes by now and the drain reads it all, so the
        wait is only a grace for a process that escaped the workers' groups (a daemon started
        with setsid) and still holds a pipe: short, so such a daemon cannot stall every exit.
        Idempotent.
        """
        if self._stopped:
            return
        if self._thread is not None:
            self._closing = True
            os.write(self._wake_w, b"x")
            self._thread.join(timeout)
            if self._thread.is_alive():
                self._stop = True
                os.write(self._wake_w, b"x")
                self._thread.join()
            self._thread = None
        else:  # never started: still flush and close
            self._drain_all()
        for s in self._streams:
            s.finish()
            for fd in s.owned:
                os.close(fd)
        for fd in self._owned:
            os.close(fd)
        self._streams = []
        self._owned = []
        self._stopped = True
        if self._inotify is not None:
            self._inotify.close()
            self._inotify = None
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)
        self._wake_r = self._wake_w = -1

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        files = [s for s in self._streams if s.path is not None]
        # Read before the first wake-up: a worker may have written before its watch existed.
        behind = set(files)
        try:
            for s in self._streams:
                if s.path is None:
                    sel.register(s.fd, selectors.EVENT_READ, s)
            sel.register(self._wake_r, selectors.EVENT_READ, None)
            if self._inotify is not None:
                sel.register(self._inotify.fd, selectors.EVENT_READ, self._inotify)
            poll = None if self._inotify is not None or not files else _POLL_INTERVAL
            open_pipes = len(self._streams) - len(files)
            while (open_pipes or (files and not self._closing)) and not self._stop:
                for s in list(behind):
                    if not self._read_up_to(s, _FILE_TURN):
                        behind.discard(s)
                events = sel.select(0 if behind else poll)
                if not events and poll is not None:
                    behind.update(files)
                for key, _ in events:
                    s = key.data
                    if s is None:
                        os.read(self._wake_r, 512)  # a close() wake-up: the loop test decides
                    elif s is self._inotify:
                        changed = self._inotify.read()
                        behind.update(
                            files
                            if changed is None
                            else (self._watched[wd] for wd in changed if wd in self._watched)
                        )
                    elif not self._read_pipe(s):
                        sel.unregister(s.fd)
                        s.finish()
                        open_pipes -= 1
            self._drain_all()
        finally:
            sel.close()

    def _read_pipe(self, s: _Stream) -> bool:
        """One read; False at end of file."""
        try:
            data = os.read(s.fd, _READ_SIZE)
        except BlockingIOError:
            return True
        except OSError:
            return False
        if not data:
            return False
        self._feed(s, data)
        return True

    def _read_up_to(self, s: _Stream, budget: int) -> bool:
        """Read until the stream is empty (a pipe), at its current end (a tailed file) or
        ``budget`` bytes are read; True if there may be more (the budget ran out)."""
        while budget > 0:
            try:
                data = os.read(s.fd, _READ_SIZE)
            except BlockingIOError:  # an empty pipe
                return False
            except OSError as exc:  # a broken pipe just ends; a file that fails says so
                if s.path is not None:
                    _report(s, exc)
                return False
            if not data:
                return False
            budget -= len(data)
            self._feed(s, data)
        return True

    def _feed(self, s: _Stream, data: bytes) -> None:
        try:
            s.feed(data)
        except Exception as exc:  # a bug here must not stop the copying of the other streams
            _report(s, exc)

    def _drain_all(self) -> None:
        # Until each pipe is empty (or ended) and each file read to its end: nothing a worker
        # wrote before the close is lost, however slowly this thread got scheduled or however
        # far a fast writer got ahead of it. What bounds the reading is only there to stop a
        # grandchild that escaped the process group and writes forever: for a file, its size
        # now; for a pipe, a byte cap.
        for s in self._streams:
            budget = _DRAIN_CAP
            if s.path is not None:
                try:
                    budget = os.fstat(s.fd).st_size - os.lseek(s.fd, 0, os.SEEK_CUR)
                except OSError:
                    pass
            self._read_up_to(s, budget)


def _report(s: _Stream, exc: Exception) -> None:
    """Drop a stream's copies after an unexpected error and say so once: the pipe is still
    read (and its data discarded), so the worker never blocks on a full pipe."""
    if s.file_fd is None and s.console is None:
        return  # said already (or nothing left to stop)
    s.file_fd = s.console = None
    s.partial = b""
    try:
        sys.stderr.write(f"xrun: tee of fd {s.fd} stopped copying: {type(exc).__name__}: {exc}\n")
    except (OSError, ValueError):
        pass
