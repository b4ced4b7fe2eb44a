"""Reading and following a replica's log files: shared by the schedulers that write plain files.

``local_cwd`` (``<log_dir>/<app_id>/<role>/<i>/{stdout,stderr}.log``) and ``slurm``
(``slurm-logs/<jobid>/<role>/<i>.{stdout,stderr}``) both hand their files to
:func:`iter_log_lines` with their own "has the app ended?" check.

Lines are yielded with their ``\\n`` (a progress bar's ``\\r`` survives). Following is cheap
and ends promptly: between reads the follower blocks on "has the app ended?" (for local_cwd a
pidfd of the supervisor) rather than sleeping, so the last lines come out as soon as the app
ends. No line is lost at the end: the local_cwd supervisor marks the app terminal only after
every replica is reaped, so once ``wait_done`` says so, one more read gets everything.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence

# How long a follower waits for new output before it reads again (while the app runs).
POLL_S = 0.05
_CHUNK = 1 << 16


class LineReader:
    """Incremental reader of one growing file: whole lines out, the partial tail held back."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd: int | None = None
        self.partial = b""

    def read_lines(self) -> list[str]:
        if self.fd is None:
            try:
                self.fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                return []
        data = bytearray(self.partial)
        while True:
            chunk = os.read(self.fd, _CHUNK)
            if not chunk:
                break
            data += chunk
        cut = data.rfind(b"\n") + 1
        self.partial = bytes(data[cut:])
        if not cut:
            return []
        return [ln.decode("utf-8", "replace") for ln in bytes(data[:cut]).splitlines(True)]

    def flush(self) -> list[str]:
        """The held-back last line (no newline at the end of the file), if any."""
        rest, self.partial = self.partial, b""
        return [rest.decode("utf-8", "replace")] if rest else []

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def iter_log_lines(
    paths: Sequence[str], should_tail: bool, wait_done: Callable[[float], bool]
) -> Iterator[str]:
    """Lines of ``paths`` (several files: interleaved as they are read).

    ``should_tail``: keep following until ``wait_done(timeout)`` (which blocks up to ``timeout``
    seconds) reports that the app has ended.
    """
    readers = [LineReader(p) for p in paths]
    try:
        while True:
            got = False
            for r in readers:
                for line in r.read_lines():
                    got = True
                    yield line
            if not should_tail:
                break
            if got:
                continue
            if wait_done(POLL_S):
                for r in readers:  # the app is over and its output complete: one last read
                    yield from r.read_lines()
                break
        for r in readers:
            yield from r.flush()
    finally:
        for r in readers:
            r.close()


def root_cause_in(path: str, tail: int = 4096) -> str:
    """The runtime agent's root-cause line (``contract.ROOT_CAUSE_PREFIX``) among the last
    ``tail`` bytes of a replica's stderr file, without the prefix; "" when it has none."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - tail))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return root_cause_of(text.splitlines())


def root_cause_of(lines: Sequence[str]) -> str:
    """The cause on the last root-cause line among ``lines`` (a replica's stderr), or ""."""
    from xrun.contract import ROOT_CAUSE_PREFIX

    for line in reversed(lines):
        _, sep, cause = line.rstrip("\n").partition(ROOT_CAUSE_PREFIX)
        if sep:
            return cause.strip()
    return ""
