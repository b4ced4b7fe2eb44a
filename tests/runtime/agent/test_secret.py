"""The rendezvous secret end to end: a standalone store is token-protected on loopback, and
the secret never reaches the workers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.runtime.agent.helpers import PROBE, SECRET_ENV, agent, run

# -- the rendezvous secret -----------------------------------------------------------------------


def test_standalone_store_is_token_protected_and_on_loopback(tmp_path: Path) -> None:
    # No secret configured: the standalone agent makes one up, so another local user who finds
    # its port (here: its own worker, which has no token) is refused.
    env = {k: v for k, v in os.environ.items() if k not in SECRET_ENV}
    p = run(agent("--nproc-per-node", "1", PROBE, str(tmp_path)), env=env)
    assert p.returncode == 0, p.stderr
    probe = json.loads((tmp_path / "probe.json").read_text())
    ((addr, port),) = probe["listen"]  # the store: 127.0.0.1 only, never 0.0.0.0 / ::
    assert addr == "127.0.0.1" and port > 0
    assert probe["refused"] == [True]


@pytest.mark.parametrize("entry", ["script", "binary"])
def test_the_secret_never_reaches_workers(tmp_path: Path, entry: str) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("tok-f1le-8f3a\n")
    token_file.chmod(0o600)
    env = {**os.environ, "XRUN_RDZV_TOKEN": "tok-env-91c2", "XRUN_RDZV_TOKEN_FILE": str(token_file)}
    if entry == "script":
        p = run(agent("--nproc-per-node", "2", PROBE, str(tmp_path)), env=env)
        assert p.returncode == 0, p.stderr
        probe = json.loads((tmp_path / "probe.json").read_text())
        assert probe["env"] == dict.fromkeys(SECRET_ENV)
        assert probe["refused"] == [True]  # the job's secret protects the store
    else:
        p = run(
            agent(
                "--nproc-per-node", "1", "--no-python", "/bin/sh", "-c", f"env > {tmp_path}/env.txt"
            ),
            env=env,
        )
        assert p.returncode == 0, p.stderr
        seen = (tmp_path / "env.txt").read_text()
        assert "XRUN_RDZV" not in seen and "tok-" not in seen
        assert "TORCHELASTIC_RUN_ID=" in seen  # the worker env is otherwise intact
