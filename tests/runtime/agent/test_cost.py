"""What the agent costs: no torch import, a small peak RSS, little overhead over spawning the
workers directly."""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path

from tests.helpers.paths import PY
from tests.runtime.agent.helpers import BEHAVE, agent, run

# -- cost ----------------------------------------------------------------------------------------


def test_agent_does_not_import_torch_and_stays_small(tmp_path: Path) -> None:
    code = (
        "import resource, subprocess, sys\n"
        "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
        "sys.stderr.write(p.stderr)\n"
    )
    p = run(
        [
            PY,
            "-c",
            code,
            PY,
            "-X",
            "importtime",
            "-m",
            "xrun.runtime",
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "1",
            BEHAVE,
            str(tmp_path),
            "fail-rank:0",
        ]
    )
    rc, maxrss_kib = (int(x) for x in p.stdout.split())
    assert rc == 0, p.stderr
    imported = {
        line.split("|")[-1].strip()
        for line in p.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert "xrun.runtime.agent" in imported and "xrun.runtime.rendezvous" in imported
    heavy = {
        m
        for m in imported
        if m.split(".")[0] in ("torch", "numpy", "yaml", "fsspec", "docker", "docstring_parser")
    }
    assert not heavy
    # The store's host runs a selectors loop (runtime/store/loop.py): asyncio alone would add
    # 15-60 ms and ~3 MiB to every standalone job's start-up.
    assert "asyncio" not in imported and "ssl" not in imported
    # Loaded on use only (a failure and a restart included): logging when something goes wrong
    # in the store or the heartbeats, uuid never (it imports platform; see config.random_uuid).
    assert "logging" not in imported and "uuid" not in imported
    # ru_maxrss covers the agent and its (stdlib-only) workers
    assert maxrss_kib < 30 * 1024, f"peak RSS {maxrss_kib} KiB"


def test_overhead_over_spawning_workers_directly(tmp_path: Path) -> None:
    noop = tmp_path / "noop.py"
    noop.write_text("")
    flaky = tmp_path / "flaky.py"  # local rank 1 fails on attempt 0 only
    flaky.write_text(
        "import os, sys\nsys.exit(os.environ['TORCHELASTIC_RESTART_COUNT'] == '0' "
        "and os.environ['LOCAL_RANK'] == '1')\n"
    )

    def direct() -> None:
        ps = [subprocess.Popen([PY, "-u", str(noop)]) for _ in range(4)]
        assert all(p.wait() == 0 for p in ps)

    def clean() -> None:
        assert subprocess.run(agent("--nproc-per-node", "4", str(noop))).returncode == 0

    def with_restart() -> None:
        cmd = agent("--nproc-per-node", "4", "--max-restarts", "1", str(flaky))
        assert subprocess.run(cmd, stderr=subprocess.DEVNULL).returncode == 0

    # interleaved best-of-3: the machine's load shifts all three the same way
    best = dict.fromkeys(("direct", "clean", "restart"), float("inf"))
    for _ in range(3):
        for key, fn in (("direct", direct), ("clean", clean), ("restart", with_restart)):
            t0 = time.perf_counter()
            fn()
            best[key] = min(best[key], time.perf_counter() - t0)
    print(
        f"\n4 no-op workers: direct {best['direct']:.3f}s, via agent {best['clean']:.3f}s "
        f"(+{best['clean'] - best['direct']:.3f}s); with a failure+restart {best['restart']:.3f}s "
        f"(+{best['restart'] - best['clean']:.3f}s, the second start of 4 workers included)"
    )
    # Targets on an idle machine: +0.25 s, and +0.1 s over the second start of the workers.
    # Asserted relative to the measured spawn cost, so that a loaded CI machine (2-4x slower)
    # does not fail it while an agent that sleeps or polls does.
    # The bounds catch an agent that sleeps or polls for seconds; the figures themselves are
    # benchmark 1's and 7's (a 2-core machine beside two CPU burners measured clean 1.7 s
    # against direct 0.13 s here: best-of-3 does not remove that load's noise).
    assert best["clean"] < 4 * best["direct"] + 2.0
    assert best["restart"] < 2 * best["clean"] + 2.0


def test_a_standalone_run_id_is_a_uuid4() -> None:
    from xrun.runtime.config import random_uuid

    ids = {random_uuid() for _ in range(200)}
    assert len(ids) == 200
    for s in ids:
        u = uuid.UUID(s)
        assert str(u) == s and u.version == 4 and u.variant == uuid.RFC_4122
