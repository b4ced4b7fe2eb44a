"""The real etcd the suite starts for the etcd rendezvous: the session fixture ``etcd``.

Imported by tests/conftest.py (``from tests.helpers.etcd import etcd``). The first use installs
Debian's etcd-server if missing and starts it on 127.0.0.1 (scripts/etcd-server.sh, idempotent:
an etcd that answers already is used as it is, and left running). If etcd cannot start, the
test fails with the script's output: it never skips.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.helpers.paths import REPO

SCRIPT = REPO / "scripts" / "etcd-server.sh"
PORT = int(os.environ.get("XRUN_ETCD_PORT", "2379"))


@pytest.fixture(scope="session")
def etcd() -> str:
    """etcd's client endpoint, ``127.0.0.1:PORT``, with etcd answering there."""
    proc = subprocess.run(["bash", str(SCRIPT), "up"], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        pytest.fail(
            f"scripts/etcd-server.sh up failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}",
            pytrace=False,
        )
    return f"127.0.0.1:{PORT}"
