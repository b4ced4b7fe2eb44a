"""Issue #26: a sweep's records. The table and a trial's own status are read from the same
records, so they cannot disagree (a trial whose app's supervisor was SIGKILLed); a record of
the wrong shape is one line naming it (exit 1), and `xrun list` still lists the rest."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.cli import Env
from tests.helpers.waiting import wait_for
from xrun.schedulers.local_cwd import statedir
from xrun.sweeps import records


def _sweep_dir(handle: str) -> str:
    path = records.find("local_cwd", handle.rsplit("/", 1)[1])
    assert path is not None, handle
    return path


def _trial_app(handle: str) -> str:
    state = records.load_state(_sweep_dir(handle), 1)
    return str(state["trials"][0]["app_id"]) if state else ""


def _table_row(env: Env, handle: str) -> list[str]:
    out = env.run("status", handle).stdout
    rows = [line.split() for line in out.splitlines() if re.match(r"\s*0\s", line)]
    assert len(rows) == 1, out
    return rows[0]


def _running_sweep(env: Env, command: str) -> str:
    """The handle of a one-trial ``utils.sh`` sweep whose trial runs ``command``, once it runs."""
    r = env.run("run", "--sweep", "w=1", "utils.sh", command)
    assert r.returncode == 0, r.stderr
    handle = r.stdout.strip()
    wait_for(lambda: "RUNNING" in _table_row(env, handle), 60, "trial 0 runs")
    return handle


def test_a_trial_whose_app_supervisor_was_killed_reads_the_same_in_the_table(
    tmp_path: Path,
) -> None:
    env = Env(tmp_path)
    flag = env.cwd / "go"
    # dist.ddp: its replica runs the runtime agent, which leaves the exit record the app's
    # status settles from once its supervisor is gone
    (env.cwd / "wait.py").write_text(
        f"import os, time\nwhile not os.path.exists({str(flag)!r}):\n    time.sleep(0.1)\n"
    )
    r = env.run("run", "--sweep", "w=1", "dist.ddp", "-j", "1x1", "--script", "wait.py")
    assert r.returncode == 0, r.stderr
    handle = r.stdout.strip()
    wait_for(lambda: _trial_app(handle) != "", 60, "trial 0 has its app")
    app_id = _trial_app(handle)
    paths = statedir.find(app_id)
    assert paths is not None
    wait_for(lambda: statedir.read_state(paths.state) is not None, 30, "the app's state")
    st = statedir.read_state(paths.state)
    assert st is not None
    os.kill(st["supervisor"]["pid"], signal.SIGKILL)  # the trial's app loses its supervisor
    time.sleep(1)
    trial = env.run("status", f"{handle}/0").stdout
    assert "State: UNKNOWN" in trial, trial  # its replica still runs: nobody can say yet
    assert "UNKNOWN" in _table_row(env, handle)
    flag.touch()  # the replica ends, and leaves its exit record
    wait_for(lambda: "State: SUCCEEDED" in env.run("status", f"{handle}/0").stdout, 60, "ok")
    row = _table_row(env, handle)
    assert "SUCCEEDED" in row, row  # it used to say UNKNOWN forever
    time.sleep(1.5)
    assert _table_row(env, handle) == row  # and its duration stopped growing
    assert "State: SUCCEEDED" in env.run("status", handle).stdout


def test_an_ended_trials_duration_is_the_same_before_and_after_the_supervisor_records_it(
    tmp_path: Path,
) -> None:
    """A status that asks a trial's app before the sweep supervisor's next round saw the end
    first: its end time is the one the supervisor records, so the duration never moves (it used
    to be each reader's own clock until the supervisor wrote its own)."""
    env = Env(tmp_path)
    flag = env.cwd / "go"
    handle = _running_sweep(env, f"while [ ! -e {flag} ]; do sleep 0.1; done")
    sup = records.load_supervisor(_sweep_dir(handle))
    assert sup is not None
    os.kill(sup["pid"], signal.SIGSTOP)  # the supervisor records nothing until it goes on
    try:
        flag.touch()
        wait_for(lambda: "SUCCEEDED" in _table_row(env, handle), 60, "the app ended")
        row = _table_row(env, handle)
        time.sleep(0.5)
        assert _table_row(env, handle) == row  # two readers, one end time
    finally:
        os.kill(sup["pid"], signal.SIGCONT)
    state = _sweep_dir(handle)
    wait_for(
        lambda: (
            (records.load_state(state, 1) or {"trials": [{}]})["trials"][0].get("state")
            == "SUCCEEDED"
        ),
        60,
        "the supervisor recorded it",
    )
    assert _table_row(env, handle) == row  # and the supervisor's record says the same


def test_cancelling_a_trial_that_ended_after_its_supervisor_died_keeps_how_it_ended(
    tmp_path: Path,
) -> None:
    """The sweep's supervisor is gone, its record still says RUNNING, and the trial's app has
    since succeeded: ``Runner.cancel("SWEEP/0")`` asks the app and records SUCCEEDED (it used to write
    CANCELLED over an app that had ended well)."""
    env = Env(tmp_path)
    flag = env.cwd / "go"
    handle = _running_sweep(env, f"while [ ! -e {flag} ]; do sleep 0.1; done")
    path = _sweep_dir(handle)
    sup = records.load_supervisor(path)
    assert sup is not None
    os.kill(sup["pid"], signal.SIGKILL)  # nobody records the trial any more
    wait_for(lambda: records.load_supervisor(path) is not None, 5, "still recorded")
    app_id = _trial_app(handle)
    flag.touch()
    # the app itself, not the sweep (whose status would record it): it succeeded
    app = f"local_cwd://default/{app_id}"
    wait_for(lambda: "State: SUCCEEDED" in env.run("status", app).stdout, 60, "the app ended")
    state = records.load_state(path, 1)
    assert state is not None and state["trials"][0]["state"] == "RUNNING", state
    # The Python API (`xrun cancel` asks the status first and says "had already ended")
    cancel = f"from xrun.runner import get_runner; get_runner().cancel({handle + '/0'!r})"
    r = subprocess.run(
        [sys.executable, "-c", cancel], env={**os.environ, **env.env}, cwd=env.cwd,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    state = records.load_state(path, 1)
    assert state is not None and state["trials"][0]["state"] == "SUCCEEDED", state
    assert "SUCCEEDED" in _table_row(env, handle)


def test_a_cancel_that_fails_with_the_supervisor_gone_says_so_and_records_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The app's cancel fails (its processes would not end, the engine is away): the cancel
    raises and the trial stays as it was, so a status still asks its app and a second cancel
    tries again (it used to be recorded CANCELLED, for an app that may still run)."""
    from xrun.errors import SchedulerError
    from xrun.procs import is_alive
    from xrun.schedulers.api import get_scheduler
    from xrun.sweeps.trials import TrialsBackend

    env = Env(tmp_path)
    handle = _running_sweep(env, "sleep 60")
    path = _sweep_dir(handle)
    sup = records.load_supervisor(path)
    assert sup is not None
    os.kill(sup["pid"], signal.SIGKILL)
    wait_for(lambda: not is_alive(sup["pid"], sup["start"]), 30, "the supervisor gone")
    for k, v in env.env.items():
        monkeypatch.setenv(k, v)
    backend = TrialsBackend(get_scheduler("local_cwd", "default"))

    def refuse(app_id: str) -> None:
        raise SchedulerError(f"{app_id}: its processes would not end")

    monkeypatch.setattr(backend.sched, "cancel", refuse)
    with pytest.raises(SchedulerError, match="would not end"):
        backend.cancel(handle.rsplit("/", 1)[1], 0)
    state = records.load_state(path, 1)
    assert state is not None and state["trials"][0]["state"] == "RUNNING", state
    assert env.run("cancel", f"{handle}/0").returncode == 0  # the real cancel: it stops
    assert "CANCELLED" in _table_row(env, handle)


SPEC_SHAPES = [
    [],
    {},
    {"plan": 3},
    {"plan": {"name": "x", "params": ["w"], "trials": []}},
    {"plan": {"name": "x", "params": ["w"], "trials": [5]}},
    {"plan": {"name": 1, "params": ["w"], "trials": [{"w": "1"}]}},
]
STATE_SHAPES = [
    [],
    {"trials": 3},
    {"trials": []},
    {"trials": [{"state": "NOPE"}]},
    {
        "trials": [
            {"state": "NOPE", "app_id": "", "exit_code": None, "host": "", "msg": ""},
        ]
    },
    {"trials": [{"state": "SUCCEEDED", "app_id": 5, "host": "", "msg": ""}]},
]


@pytest.fixture(scope="module")
def two_sweeps(tmp_path_factory: pytest.TempPathFactory) -> tuple[Env, str, str]:
    env = Env(tmp_path_factory.mktemp("sweeps"))
    handles = []
    for _ in range(2):
        r = env.run("run", "--sweep", "w=0", "--wait", "utils.sh", "exit {{w}}")
        assert r.returncode == 0, r.stderr
        handles.append(r.stdout.strip())
    return env, handles[0], handles[1]


@pytest.mark.parametrize(
    "record, shape",
    [(records.SPEC_FILE, s) for s in SPEC_SHAPES]
    + [(records.STATE_FILE, s) for s in STATE_SHAPES]
    + [(records.SUPERVISOR_FILE, s) for s in ([], {"pid": "1"}, {"pid": 1, "start": "x"})],
    ids=lambda v: json.dumps(v)[:30] if not isinstance(v, str) else v,
)
def test_a_damaged_sweep_record_is_one_line(
    two_sweeps: tuple[Env, str, str], record: str, shape: object
) -> None:
    env, victim, bystander = two_sweeps
    path = Path(_sweep_dir(victim)) / record
    good = path.read_text()
    path.write_text(json.dumps(shape))
    try:
        for args in (["status", victim], ["status", f"{victim}/0"], ["log", victim]):
            r = env.run(*args)
            assert "Traceback" not in r.stderr, (args, r.stderr[-2000:])
            if record == records.SUPERVISOR_FILE and r.returncode == 0:
                continue  # an ended sweep's table does not ask for its supervisor
            assert r.returncode == 1, (args, r.returncode, r.stderr)
            lines = r.stderr.splitlines()
            assert len(lines) == 1 and str(path) in lines[0] and "damaged" in lines[0], lines
        listed = env.run("list", "-s", "local_cwd")
        assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
        assert f"{bystander}\tSUCCEEDED" in listed.stdout, listed.stdout
    finally:
        path.write_text(good)
    assert "State: SUCCEEDED" in env.run("status", victim).stdout
