"""A memory-limited cgroup for the OOM tests: the kernel's own OOM killer, on demand.

This machine mounts cgroup v1's memory controller (``/sys/fs/cgroup/memory``) and the tests run
as root, so a test makes a child of its own memory cgroup with a limit, and moves the process
under test into it (``enter``), as a container engine or Slurm's task/cgroup plugin would."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.helpers.waiting import wait_for

MEMORY_ROOT = Path("/sys/fs/cgroup/memory")


@contextmanager
def memory_cgroup(limit: int = 256 << 20) -> Iterator[Path]:
    """A v1 memory cgroup of ``limit`` bytes, swap included, removed once it is empty."""
    rel = next(
        line.split(":", 2)[2]
        for line in Path("/proc/self/cgroup").read_text().splitlines()
        if "memory" in line.split(":")[1].split(",")
    )
    cg = MEMORY_ROOT / rel.lstrip("/") / f"xrun-test-{uuid.uuid4().hex[:8]}"
    cg.mkdir()
    try:
        (cg / "memory.limit_in_bytes").write_text(str(limit))
        (cg / "memory.memsw.limit_in_bytes").write_text(str(limit))
        yield cg
    finally:
        wait_for(lambda: not (cg / "cgroup.procs").read_text().strip(), 30, f"{cg} to empty")
        cg.rmdir()


def enter(cg: Path, argv: list[str]) -> list[str]:
    """``argv`` run inside ``cg``: a shell moves itself in, then execs it."""
    return ["sh", "-c", f'echo $$ > {cg / "cgroup.procs"} && exec "$@"', "sh", *argv]
