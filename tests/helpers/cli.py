"""Running the real ``xrun`` console script in a subprocess, as a user's shell would."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

from tests.helpers.paths import XRUN


def xrun(
    *args: str,
    cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 60,
    check: bool = False,
) -> subprocess.CompletedProcess[str]:
    """``xrun ARGS`` with captured text output. ``env`` is added to this process's environment
    (the suite's ``XDG_STATE_HOME`` included, so another "shell" sees the same apps)."""
    return subprocess.run(
        [XRUN, *args],
        cwd=cwd,
        env={**os.environ, **env} if env is not None else None,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=check,
    )


class Env:
    """A user's shell of their own: a fresh HOME (so no ``~/.xrunconfig`` leaks in) and a work
    dir as the cwd."""

    def __init__(self, tmp_path: Path) -> None:
        self.home = tmp_path / "home"
        self.cwd = tmp_path / "work"
        self.home.mkdir()
        self.cwd.mkdir()

    @property
    def env(self) -> dict[str, str]:
        return {"HOME": str(self.home), "NO_COLOR": "1"}

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return xrun(*args, cwd=self.cwd, env=self.env, timeout=timeout)
