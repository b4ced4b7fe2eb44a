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
of concurrent workers never interleave mid-line. Prefixing works on whole chunks
(``bytes.replace``) and cuts at the chunk's last newline: the per-line cost stays in C.
A partial last line is held until its newline arrives, or written (newline added) when the
stream ends or the tee closes.
"""

from __future__ import annotations

import os
import selectors
import threading

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
        import fcntl

        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, _PIPE_SIZE)
    except (ImportError, AttributeError, OSError):  # not Linux, or over the user's limit
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


class _Stream:
    __slots__ = ("fd", "file_fd", "console_fd", "prefix", "partial", "owned", "path")

    def __init__(self, fd: int, file_fd: int | None, console_fd: int | None, prefix: bytes):
        self.fd = fd
        self.file_fd = file_fd
        self.console_fd = console_fd
        self.prefix = prefix
        self.partial = b""
        # What close() must close, even after a failed target was dropped from the fields.
        self.owned = [fd] if file_fd is None else [fd, file_fd]
        self.path: str | None = None  # a tailed log file (``fd`` reads it); None: a pipe

    def feed(self, data: bytes) -> None:
        if self.file_fd is not None:
            self._write(self.file_fd, (data,), is_console=False)
        if self.console_fd is None:
            return
        end = data.rfind(b"\n") + 1
        if end == 0:  # no line ends here
            if len(self.partial) + len(data) < _MAX_PARTIAL:
                self.partial += data
            else:  # a "line" this long goes out anyway, ended here: memory stays bounded
                self._write(self.console_fd, (self.prefix, self.partial, data, b"\n"), True)
                self.partial = b""
            return
        # The lines in data[:end], each prefixed, with the held partial line in front. One
        # copy in all (the replace): the prefix in front and the held line go out as separate
        # iovecs, and the tail after ``end`` (no newline in it, so unchanged by the replace) is
        # cut off by a view.
        head = (self.partial,) if self.partial else ()
        if self.prefix:
            body = data.replace(b"\n", b"\n" + self.prefix)
            lines = memoryview(body)[: len(body) - (len(data) - end) - len(self.prefix)]
            self._write(self.console_fd, (self.prefix, *head, lines), True)
        else:
            self._write(self.console_fd, (*head, memoryview(data)[:end]), True)
        self.partial = data[end:]

    def finish(self) -> None:
        """The stream ended: write the held partial line, newline-terminated."""
        if self.partial and self.console_fd is not None:
            self._write(self.console_fd, (self.prefix, self.partial, b"\n"), True)
        self.partial = b""

    def _write(self, fd: int, parts: tuple[bytes | memoryview, ...], is_console: bool) -> None:
        try:
            writev_all(fd, parts)
        except OSError:
            # A closed console (``| head``) or a full disk must not stop the other copy, nor
            # stall the worker on a pipe nobody drains: drop this target, keep reading.
            if is_console:
                self.console_fd = None
            else:
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
        self._name = name
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC)
        self._closing = False  # the workers are gone: read the files to their end and stop
        self._stop = False  # stop now, pipes at end of file or not
        self._inotify: Inotify | None = None
        self._watched: dict[int, _Stream] = {}

    def add(self, fd: int, file_fd: int | None, console_fd: int | None, prefix: str = "") -> None:
        """A pipe's read end: copied to ``file_fd`` unchanged and to ``console_fd`` prefixed."""
        os.set_blocking(fd, False)
        self._streams.append(_Stream(fd, file_fd, console_fd, prefix.encode()))

    def add_file(self, path: str, console_fd: int, prefix: str = "") -> None:
        """A log file a worker writes: its lines go to ``console_fd`` prefixed, as they come."""
        s = _Stream(os.open(path, os.O_RDONLY | os.O_CLOEXEC), None, console_fd, prefix.encode())
        s.path = path
        self._streams.append(s)

    def __len__(self) -> int:
        return len(self._streams)

    def start(self) -> None:
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
        """
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
        self._streams = []
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
    import sys

    if s.file_fd is None and s.console_fd is None:
        return  # said already (or nothing left to stop)
    s.file_fd = s.console_fd = None
    s.partial = b""
    try:
        sys.stderr.write(f"xrun: tee of fd {s.fd} stopped copying: {type(exc).__name__}: {exc}\n")
    except (OSError, ValueError):
        pass
