"""Reading a job's merged output to its end: the e2e drills that watch `step N` lines."""

from __future__ import annotations

import re
import subprocess
import time

# examples/train_ddp.py --print-steps: rank 0's "step N" line, after the tee's prefix.
STEP_RE = re.compile(r"\]:step (\d+)$")


def finish(proc: subprocess.Popen[str], lines: list[str], timeout: float) -> str:
    """Read ``proc``'s output (appended to ``lines``) until it ends; its text. Asserts that it
    ended within ``timeout`` seconds with exit code 0 (it is killed otherwise)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    try:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            assert time.monotonic() < deadline, "the job did not end in time"
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
    text = "\n".join(lines)
    assert proc.returncode == 0, text[-4000:]
    return text


def steps(text: str) -> list[int]:
    """The steps rank 0 printed, in order."""
    return [int(m[1]) for line in text.splitlines() if (m := STEP_RE.search(line))]
