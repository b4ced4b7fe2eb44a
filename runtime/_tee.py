"""Tee: copy workers' output pipes to their log files and to the agent's console.

One thread serves every pipe through a selector, as data arrives (no polling of files):

* the log file gets the bytes unchanged, chunk by chunk;
* the console gets whole lines only, each with the rank's prefix (``[default0]:``), so lines
  of concurrent workers never interleave mid-line. Prefixing works on whole chunks
  (``bytes.replace``) and cuts at the chunk's last newline: the per-line cost stays in C.

A partial last line is held until its newline arrives, or written (newline added) when the
stream ends or the tee closes.
"""

from __future__ import annotations

import os
import selectors
import threading

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
# What the final drain reads at most per pipe (see ``Tee._drain_all``).
_DRAIN_CAP = 64 << 20


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


class _Stream:
    __slots__ = ("fd", "file_fd", "console_fd", "prefix", "partial", "owned")

    def __init__(self, fd: int, file_fd: int | None, console_fd: int | None, prefix: bytes):
        self.fd = fd
        self.file_fd = file_fd
        self.console_fd = console_fd
        self.prefix = prefix
        self.partial = b""
        # What close() must close, even after a failed target was dropped from the fields.
        self.owned = [fd] if file_fd is None else [fd, file_fd]

    def feed(self, data: bytes) -> None:
        if self.file_fd is not None:
            self._write(self.file_fd, data, is_console=False)
        if self.console_fd is None:
            return
        if self.partial:
            data = self.partial + data
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            if len(data) < _MAX_PARTIAL:
                self.partial = data
                return
            cut, data = len(data) + 1, data + b"\n"
        self.partial = data[cut:]
        self._console(data[:cut])

    def finish(self) -> None:
        """The stream ended: write the held partial line, newline-terminated."""
        if self.partial and self.console_fd is not None:
            self._console(self.partial + b"\n")
        self.partial = b""

    def _console(self, lines: bytes) -> None:
        # ``lines`` ends with a newline: prefix every line in one C-level pass.
        if self.prefix:
            lines = self.prefix + lines[:-1].replace(b"\n", b"\n" + self.prefix) + b"\n"
        assert self.console_fd is not None
        self._write(self.console_fd, lines, is_console=True)

    def _write(self, fd: int, data: bytes, is_console: bool) -> None:
        try:
            write_all(fd, data)
        except OSError:
            # A closed console (``| head``) or a full disk must not stop the other copy, nor
            # stall the worker on a pipe nobody drains: drop this target, keep reading.
            if is_console:
                self.console_fd = None
            else:
                self.file_fd = None


class Tee:
    """Copies pipes to files and/or console fds on one background thread.

    Usage: ``add`` every pipe, ``start``, later ``close``. The tee owns (and closes) the read
    ends and the file fds it is given; console fds stay open.
    """

    def __init__(self, name: str = "xrun-tee") -> None:
        self._streams: list[_Stream] = []
        self._name = name
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC)
        self._stop = False

    def add(self, fd: int, file_fd: int | None, console_fd: int | None, prefix: str = "") -> None:
        os.set_blocking(fd, False)
        self._streams.append(_Stream(fd, file_fd, console_fd, prefix.encode()))

    def __len__(self) -> int:
        return len(self._streams)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def close(self, timeout: float = 1.0) -> None:
        """Wait up to ``timeout`` s for every pipe's end of file, then drain what is buffered
        and stop.

        Everything the workers wrote is in the pipes by now and the drain reads it all, so the
        wait is only a grace for a process that escaped the workers' groups (a daemon started
        with setsid) and still holds a pipe: short, so such a daemon cannot stall every exit.
        """
        if self._thread is not None:
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
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)
        self._wake_r = self._wake_w = -1

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        try:
            for s in self._streams:
                sel.register(s.fd, selectors.EVENT_READ, s)
            sel.register(self._wake_r, selectors.EVENT_READ, None)
            open_streams = len(self._streams)
            while open_streams and not self._stop:
                for key, _ in sel.select():
                    s = key.data
                    if s is None:
                        continue
                    try:
                        more = self._read_once(s)
                    except Exception as exc:  # a bug here must not stop the draining
                        _report(s, exc)
                        more = True
                    if not more:
                        sel.unregister(s.fd)
                        s.finish()
                        open_streams -= 1
            if self._stop:
                self._drain_all()
        finally:
            sel.close()

    def _read_once(self, s: _Stream) -> bool:
        """One read; False at end of file."""
        try:
            data = os.read(s.fd, _READ_SIZE)
        except BlockingIOError:
            return True
        except OSError:
            return False
        if not data:
            return False
        s.feed(data)
        return True

    def _drain_all(self) -> None:
        # Non-blocking reads until each pipe is empty (or ended): nothing a worker wrote before
        # the close is lost, however slowly this thread got scheduled. The byte cap only stops
        # a grandchild that escaped the process group and writes forever.
        for s in self._streams:
            budget = _DRAIN_CAP
            while budget > 0:
                try:
                    data = os.read(s.fd, _READ_SIZE)
                except OSError:  # empty (EAGAIN) or broken
                    break
                if not data:
                    break
                budget -= len(data)
                s.feed(data)


def _report(s: _Stream, exc: Exception) -> None:
    """Drop a stream's copies after an unexpected error and say so once: the pipe is still
    read (and its data discarded), so the worker never blocks on a full pipe."""
    import sys

    s.file_fd = s.console_fd = None
    s.partial = b""
    try:
        sys.stderr.write(f"xrun: tee of fd {s.fd} stopped copying: {type(exc).__name__}: {exc}\n")
    except (OSError, ValueError):
        pass
