"""Issue #26, the agent side: its flags take ASCII digits only, '==' is no --rdzv-conf item,
and a token file is read with a size limit (/dev/zero used to take 1.8 GB in 3 s, then a
MemoryError traceback under a memory limit: here it runs under ``ulimit -v`` in a box)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.box import BOX_TIMEOUT_S, tmpfs

ARABIC_2 = "\u0662"  # '٢': float() reads it
# The agent's address space in the box: far above its needs (~60 MiB of Python), far below
# what reading /dev/zero whole would take.
ULIMIT_V_KIB = 512 * 1024


def agent(
    box: Path, *flags: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m xrun.runtime FLAGS x.py`` under ``ulimit -v`` and ``timeout -s KILL``."""
    argv = [sys.executable, "-m", "xrun.runtime", "--nnodes", "1", "--nproc-per-node", "1", *flags]
    script = f'ulimit -v {ULIMIT_V_KIB} && exec "$@"'
    return subprocess.run(
        ["timeout", "-s", "KILL", str(BOX_TIMEOUT_S), "sh", "-c", script, "sh", *argv, "x.py"],
        cwd=box,
        capture_output=True,
        text=True,
        env={**os.environ, "TMPDIR": str(box), **(env or {})},
    )


def one_line_2(r: subprocess.CompletedProcess[str], *must: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("xrun-agent: error: "), r.stderr[-2000:]
    for text in must:
        assert text in lines[0], (text, lines[0])


@pytest.fixture
def box(tmp_path: Path):  # type: ignore[no-untyped-def]
    with tmpfs(tmp_path / "box", size="8m") as path:
        yield path


@pytest.mark.parametrize(
    "flags, must",
    [
        (["--monitor-interval", ARABIC_2], "--monitor-interval"),
        (["--shutdown-timeout", ARABIC_2], "--shutdown-timeout"),
        (["--rdzv-conf", f"join_timeout={ARABIC_2}"], "join_timeout"),
        (["--max-restarts", ARABIC_2], "--max-restarts"),
        (["--rdzv-conf", "=="], "has no key"),
        (["--rdzv-conf", "=600"], "has no key"),
    ],
)
def test_agent_flags_refuse_other_digits_and_keyless_items(
    box: Path, flags: list[str], must: str
) -> None:
    one_line_2(agent(box, *flags), must)


@pytest.mark.parametrize("target", ["/dev/zero", "big"])
def test_a_huge_token_file_is_one_line_in_bounded_memory(box: Path, target: str) -> None:
    if target == "big":
        with open(box / "big", "wb") as f:  # sparse: a 1 GiB file on a 8 MiB tmpfs
            f.truncate(2**30)
        target = str(box / "big")
    r = agent(box, env={"XRUN_RDZV_TOKEN_FILE": target})
    one_line_2(r, target, "over 4,096 bytes")


def test_a_token_fifo_nobody_writes_is_one_line_in_bounded_time(box: Path) -> None:
    os.mkfifo(box / "fifo")
    r = agent(box, env={"XRUN_RDZV_TOKEN_FILE": str(box / "fifo")})  # used to block for ever
    one_line_2(r, "fifo", "nothing to read")
