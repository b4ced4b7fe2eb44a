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


# A worker that prints one line and sleeps: a healthy job that makes no progress to speak of.
IDLE = 'import time\nprint("up", flush=True)\ntime.sleep(300)\n'


def _start(tmp_path: Path, *env: str) -> tuple[subprocess.Popen[str], str]:
    """A running 1x2 dist.ddp job of IDLE with ``--env`` items; its handle."""
    (tmp_path / "idle.py").write_text(IDLE)
    envs = [a for kv in env for a in ("--env", kv)]
    proc = subprocess.Popen(
        [XRUN, "run", "-s", "local_cwd", "dist.ddp", "-j", "1x2", *envs, "--script", "idle.py"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    handle = proc.stdout.readline().strip()
    assert handle.startswith("local_cwd://"), handle
    return proc, handle


def _mains(doc: dict) -> list[str]:
    """Each rank's innermost main-thread frame."""
    ranks = doc["roles"].get("idle", {})
    return [_where({"roles": {"hang": ranks}}, r) for r in range(len(ranks))]


@pytest.mark.timeout(150)
def test_stacks_never_stops_a_job_whose_agent_handles_sigusr1(tmp_path: Path) -> None:
    """P3: the agent stops the job on every signal of PET_SIGNALS_TO_HANDLE (SIGUSR1 is what a
    Slurm job's pre-emption notice uses); `xrun stacks` reads the stacks and the job runs on."""
    proc, handle = _start(tmp_path, "PET_SIGNALS_TO_HANDLE=SIGTERM,SIGINT,SIGUSR1")
    try:
        deadline = time.monotonic() + 90
        doc: dict = {}
        while time.monotonic() < deadline:  # until both workers run their sleep
            p = xrun("stacks", "--json", handle)
            doc = json.loads(p.stdout) if p.stdout.strip() else {}
            if p.returncode == 0 and _mains(doc) == ["<module>", "<module>"]:
                break
            assert "RUNNING" in xrun("status", handle).stdout, p.stderr
            time.sleep(0.5)
        assert _mains(doc) == ["<module>", "<module>"], (doc, p.stderr)
        for _ in range(3):  # asked again and again: nothing stops
            assert xrun("stacks", handle).returncode == 0
        time.sleep(1)
        status = xrun("status", handle).stdout
        assert "State: RUNNING" in status and "exit_code" not in status, status
        assert proc.poll() is None
    finally:
        xrun("cancel", handle)
        proc.wait(60)


@pytest.mark.timeout(150)
def test_stacks_exits_1_when_no_stack_was_read(tmp_path: Path) -> None:
    """Every rank's read failed (no py-spy where XRUN_PYSPY points): exit 1, and the lines say
    why, not exit 0 with the reasons among the groups."""
    proc, handle = _start(tmp_path, "XRUN_PYSPY=/nonexistent/py-spy")
    why = "py-spy was not found: XRUN_PYSPY=/nonexistent/py-spy is no executable file"
    try:
        deadline = time.monotonic() + 90
        p = xrun("stacks", handle)
        while why not in p.stdout and time.monotonic() < deadline:  # the agents answered
            time.sleep(0.5)
            p = xrun("stacks", handle)
        assert p.returncode == 1, (p.stdout, p.stderr)
        assert p.stdout.splitlines()[0] == f"2 ranks, 1 group(s): ranks 0,1: {why}", p.stdout
        assert p.stderr.splitlines()[-1] == f"xrun: no stack read from {handle}: {why}"
        j = xrun("stacks", "--json", handle)
        assert j.returncode == 1 and j.stderr.splitlines()[-1] == p.stderr.splitlines()[-1]
        assert "State: RUNNING" in xrun("status", handle).stdout
    finally:
        xrun("cancel", handle)
        proc.wait(60)


@pytest.mark.parametrize(
    "record",
    [
        '{"replicas": [5]}',
        '{"replicas": 5, "state": 7}',
        '{"replicas": {"a": 5}}',
        '{"app": 5, "state": "RUNNING", "supervisor": {"pid": 1, "start": 1}, "replicas": 5}',
        '{"state": "RUNNING", "supervisor": {"pid": "x"}, "replicas": []}',
    ],
)
def test_stacks_of_a_damaged_record_is_the_status_line(tmp_path: Path, record: str) -> None:
    """P1: the same one line (exit 1) as `xrun status`, not a traceback."""
    from xrun.schedulers.local_cwd import statedir

    run = xrun("run", "-s", "local_cwd", "utils.echo", "--msg", "hi", cwd=tmp_path)
    handle = run.stdout.strip().splitlines()[0]
    paths = statedir.find(handle.rsplit("/", 1)[1])
    assert paths is not None
    Path(paths.state).write_text(record)
    status = xrun("status", handle)
    assert status.returncode == 1 and "is damaged (" in status.stderr, status.stderr
    p = xrun("stacks", handle)
    assert (p.returncode, p.stderr) == (1, status.stderr)


@pytest.mark.parametrize(
    "value", ["١", "０.5", "0", "0.001", "1e-9", "5e-324", "-1", "nan", "soon"]
)
def test_a_bad_stacks_timeout_is_one_line(value: str) -> None:
    """M2/M3: other scripts' digits and waits too short for any answer are refused up front."""
    p = xrun("stacks", "--timeout", value, "local_cwd://default/nosuchapp-123")
    assert p.returncode == 2
    assert p.stderr == (
        f"xrun: error: --timeout {value!r} is invalid: expected a number of seconds from 1 to "
        "86400, e.g. 10\n"
    )
