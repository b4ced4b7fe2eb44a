"""A lost node's replacement resumes from a surviving peer's memory: 0 steps lost, same bits.

``examples/train_ddp.py --print-steps`` as a real local_cwd job of 2 nodes x 2 gloo workers and
one spare (``dist.ddp -j 2x2 --spares 1 --recover warm``; each replica is its own node, with
its own snapshot dir). Mid-epoch 2 the node that does not serve the store is SIGKILLed (its
agent and workers, its process group); the spare takes its group rank. Asserted: the new world
resumes from shared memory after the last step every rank committed (no ``resuming after
epoch``: not from the disk), so every ``step S`` line appears once (0 steps lost, none
skipped); the spare's workers hold the lost node's RANKs; the final parameters equal an
undisturbed 2x2 run's bit for bit.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from tests.helpers import chaos
from tests.helpers.job_output import STEP_RE, finish, steps
from tests.helpers.net import free_port
from tests.helpers.paths import TRAIN, XRUN

EPOCHS, SPE, KILL_AT = 3, 20, 25
CONF = "heartbeat_interval=0.2,heartbeat_timeout=1.5,last_call_timeout=5,join_timeout=60"
STARTED_RE = re.compile(r"^(\S+) \[(?:default)?\d+\]:rank (\d+)/4: started")  # role "" (#36): [0]:


def _start(tmp: Path, name: str, spares: int, sleep: float) -> tuple[subprocess.Popen[str], int]:
    port = free_port()
    extra = ["--spares", str(spares), "--recover", "warm"] if spares else []
    argv = [
        XRUN, "run", "-s", "local_cwd", "-cfg", f"log_dir={tmp / (name + '-logs')}", "dist.ddp",
        "-j", "2x2", *extra, "--rdzv_port", str(port), "--rdzv_conf", CONF, "--max_retries", "3",
        "--script", str(TRAIN), "--", "--epochs", str(EPOCHS), "--steps-per-epoch", str(SPE),
        "--step-sleep", str(sleep), "--print-steps",
        "--checkpoint-dir", str(tmp / f"{name}-ckpt"), "--out", str(tmp / f"{name}.json"),
    ]  # fmt: skip
    proc = subprocess.Popen(
        argv, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    return proc, port


def _finish(proc: subprocess.Popen[str], lines: list[str], timeout: float = 300) -> str:
    return finish(proc, lines, timeout)


def _ranks(lines: list[str]) -> dict[str, list[int]]:
    """replica (its node id) -> the RANKs its workers said they started as, in ``lines``."""
    out: dict[str, set[int]] = {}
    for line in lines:
        if m := STARTED_RE.search(line):
            out.setdefault(m[1], set()).add(int(m[2]))
    return {k: sorted(v) for k, v in out.items()}


def _steps(text: str) -> list[int]:
    return steps(text)


@pytest.mark.timeout(600)
def test_the_spare_resumes_from_the_peers_memory_bit_for_bit(tmp_path: Path) -> None:
    ref, _ = _start(tmp_path, "ref", 0, 0.0)
    _finish(ref, [])
    undisturbed = json.loads((tmp_path / "ref.json").read_text())

    proc, port = _start(tmp_path, "kill", 1, 0.15)
    marker = str(tmp_path / "kill-ckpt")
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if (m := STEP_RE.search(lines[-1])) and int(m[1]) == KILL_AT:
                break
        else:
            pytest.fail(f"the job ended before step {KILL_AT}:\n" + "\n".join(lines)[-3000:])
        first = _ranks(lines)
        assert sorted(r for rs in first.values() for r in rs) == [0, 1, 2, 3], first
        agents = {chaos.environ(a).get("XRUN_NODE_ID", ""): a for a in chaos.agents(marker)}
        host = chaos.listening_pid(port, [agents[n] for n in first])
        assert host is not None, "no active agent serves the store"
        # never the store's host: its loss ends the job (docs/runtime.md)
        lost = next(n for n in sorted(first) if agents[n] != host)
        os.killpg(agents[lost], signal.SIGKILL)
        seen = len(lines)
        for line in proc.stdout:  # until the new world resumed and trained a step
            lines.append(line.rstrip("\n"))
            if STEP_RE.search(lines[-1]) and "resuming after" in "\n".join(lines[seen:]):
                break
        after = _ranks(lines[seen:])
        spare = next(n for n in after if n not in first)
        # the spare's workers hold the lost node's RANKs; the survivors kept theirs
        assert after[spare] == first[lost], (first, after)
        assert all(after[n] == first[n] for n in first if n != lost), (first, after)
    except BaseException:
        proc.kill()
        chaos.kill_all(marker)
        raise
    text = _finish(proc, lines)
    resumed = re.findall(r"rank 0: resuming after step (\d+) from shared memory", text)
    assert len(resumed) == 1 and int(resumed[0]) >= KILL_AT, text[-4000:]
    assert "resuming after epoch" not in text, "resumed from the disk checkpoint:\n" + text[-4000:]
    # every step printed once: none trained twice (0 steps lost), none skipped
    assert _steps(text) == list(range(1, EPOCHS * SPE + 1)), text[-4000:]
    result = json.loads((tmp_path / "kill.json").read_text())
    assert (result["params_sha256"], result["final_loss"]) == (
        undisturbed["params_sha256"],
        undisturbed["final_loss"],
    ), "the replaced run's parameters differ from the undisturbed run's"
