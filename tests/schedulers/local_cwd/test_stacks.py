"""``xrun stacks`` on local_cwd: the real CLI, a real 1x3 gloo job with one rank hung."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.cli import xrun
from tests.helpers.paths import SCRIPTS, XRUN

HANG = SCRIPTS / "hang.py"


def line_of(text: str) -> int:
    """The line of hang.py that holds ``text``."""
    return next(i for i, ln in enumerate(HANG.read_text().splitlines(), 1) if text in ln)


def _where(doc: dict, rank: int) -> str:
    r = doc["roles"]["hang"].get(str(rank), {})
    main = [t for t in r.get("threads", ()) if t["main"]]
    return main[0]["frames"][0]["name"] if main else ""


@pytest.mark.timeout(120)
def test_stacks_groups_a_hung_local_job(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [XRUN, "run", "-s", "local_cwd", "dist.ddp", "-j", "1x3", "--script", str(HANG)]
        + ["--", "1000", "--hang-rank", "2", "--hang-step", "2"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        handle = proc.stdout.readline().strip()
        assert handle.startswith("local_cwd://"), handle
        deadline = time.monotonic() + 90
        doc: dict = {}
        while time.monotonic() < deadline:  # until rank 2 reached its hang and the others wait
            p = xrun("stacks", "--json", handle)
            if p.returncode == 0:
                doc = json.loads(p.stdout)
                if [_where(doc, r) for r in range(3)] == ["all_reduce", "all_reduce", "stuck_here"]:
                    break
            time.sleep(0.5)
        assert sorted(doc["roles"]["hang"]) == ["0", "1", "2"], doc
        t0 = time.monotonic()
        p = xrun("stacks", handle)
        took = time.monotonic() - t0
        assert p.returncode == 0, p.stderr
        lines = p.stdout.splitlines()
        stuck, reduce = line_of("time.sleep(3600)"), line_of("dist.all_reduce(t)")
        assert lines[0] == (
            f"3 ranks, 2 group(s): rank 2 in stuck_here (hang.py:{stuck}); "
            f"ranks 0,1 in all_reduce (hang.py:{reduce})"
        )
        assert lines[1].startswith("rank 2 (1/3) on ") and lines[1].endswith(
            f": stuck_here (hang.py:{stuck})"
        )
        assert lines[2] == "  Thread MainThread:"
        assert lines[3] == f"    stuck_here ({HANG}:{stuck})"
        assert any(ln.startswith("ranks 0,1 (2/3) on ") for ln in lines)
        assert took < 5, took
    finally:
        xrun("cancel", handle)
        proc.wait(60)


def test_stacks_of_an_ended_app_is_one_line(tmp_path: Path) -> None:
    run = xrun("run", "-s", "local_cwd", "utils.echo", "--msg", "hi", cwd=tmp_path)
    handle = run.stdout.strip().splitlines()[0]
    p = xrun("stacks", handle)
    assert p.returncode == 2
    app_id = handle.rsplit("/", 1)[1]
    assert p.stderr == (
        f"xrun: error: local_cwd app {app_id} is SUCCEEDED: stacks are read from running "
        f"workers (`xrun status local_cwd://default/{app_id}`)\n"
    )
    bad = xrun("stacks", "--timeout", "soon", handle)
    assert bad.returncode == 2
    assert bad.stderr == (
        "xrun: error: --timeout 'soon' is invalid: expected a number of seconds, e.g. 10\n"
    )


def test_stacks_of_an_unknown_app(tmp_path: Path) -> None:
    p = xrun("stacks", "local_cwd://default/nosuchapp-123")
    assert p.returncode == 1 and p.stderr.startswith(
        "xrun: error: local_cwd app 'nosuchapp-123' not found"
    )


@pytest.mark.timeout(180)
def test_stall_timeout_ends_a_hung_job_with_its_root_cause(tmp_path: Path) -> None:
    """dist.ddp --stall_timeout on local_cwd: the hung attempt is restarted once
    (--max_retries 1), the second ends the app FAILED; status names the rank and its line."""
    run = xrun(
        *("run", "-s", "local_cwd", "dist.ddp", "-j", "1x2", "--stall_timeout", "5"),
        *("--max_retries", "1", "--script", str(HANG), "--", "1000", "--hang-rank", "1"),
        cwd=tmp_path,
        timeout=170,
    )
    assert run.returncode == 1, run.stderr[-2000:]
    reason = (
        f"stalled 5 s: rank 1 in stuck_here (hang.py:{line_of('time.sleep(3600)')}); "
        f"rank 0 in all_reduce (hang.py:{line_of('dist.all_reduce(t)')})"
    )
    assert f"{reason}; restarting the workers (1/1)" in run.stderr
    handle = run.stdout.splitlines()[0]
    status = xrun("status", handle)
    assert f"    error: {reason}\n" in status.stdout, status.stdout
