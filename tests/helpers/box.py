"""A box for absurd inputs: a small tmpfs (few MiB, few inodes) and a hard time limit.

A bug that turns one argument into unbounded work (a directory per requested worker, a copy
per requested replica) then fills a 4 MiB, 1,000-inode filesystem and is SIGKILLed after a few
seconds, instead of exhausting the machine's disk or inodes. Mounting needs root (the suite
runs as root here); a failed mount fails the test, it never skips it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from tests.helpers.paths import XRUN

# The hard limit of a boxed command: SIGKILL, which no bug can ignore.
BOX_TIMEOUT_S = 60  # a busy 2-core machine (two CPU burners) took over 20 s for a 5000-deep YAML


@contextlib.contextmanager
def tmpfs(
    path: Path, size: str = "4m", inodes: int = 1000, read_only: bool = False
) -> Iterator[Path]:
    """A fresh tmpfs of ``size`` and ``inodes`` mounted at ``path`` while the block runs."""
    path.mkdir(parents=True, exist_ok=True)
    opts = f"size={size},nr_inodes={inodes}" + (",ro" if read_only else "")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], capture_output=True, text=True
    )
    assert done.returncode == 0, f"cannot mount the test's tmpfs box at {path}: {done.stderr}"
    try:
        yield path
    finally:
        # Lazy: a process the test left behind must not keep the mount (and the test) alive.
        subprocess.run(["umount", "-l", str(path)], check=False)


def boxed(
    argv: Sequence[str],
    box: Path,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: int = BOX_TIMEOUT_S,
) -> subprocess.CompletedProcess[str]:
    """``argv`` under ``timeout -s KILL`` with TMPDIR and XDG_STATE_HOME in ``box``."""
    full_env = {
        **os.environ,
        "TMPDIR": str(box),
        "XDG_STATE_HOME": str(box / "state"),
        **(env or {}),
    }
    return subprocess.run(
        ["timeout", "-s", "KILL", str(timeout), *argv],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd or box,
    )


def boxed_xrun(*args: str, box: Path, **kw: object) -> subprocess.CompletedProcess[str]:
    return boxed([XRUN, *args], box, **kw)  # type: ignore[arg-type]


# ``ULIMIT_V + argv``: argv with its address space limited to about 1 GB (ulimit -v), so a bug
# that holds an absurd input in memory fails instead of taking the machine's.
ULIMIT_V = ["bash", "-c", 'ulimit -v 1000000; exec "$@"', "-"]

# Runs a command and writes its peak RSS (KiB: the largest of its process tree's) to a file.
_PEAK_RSS = (
    "import resource, subprocess, sys\n"
    "rc = subprocess.call(sys.argv[2:])\n"
    "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))\n"
    "sys.exit(rc)\n"
)


def boxed_peak_rss(
    argv: Sequence[str], box: Path, **kw: object
) -> tuple[subprocess.CompletedProcess[str], int]:
    """``boxed(argv)``, and the peak RSS of its process tree in KiB (its largest process)."""
    out = box.parent / f"peak-rss-{os.getpid()}"
    r = boxed([sys.executable, "-c", _PEAK_RSS, str(out), *argv], box, **kw)  # type: ignore[arg-type]
    try:
        return r, int(out.read_text() or 0)
    finally:
        out.unlink(missing_ok=True)
