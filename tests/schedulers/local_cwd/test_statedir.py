"""Issue #26: an app's records (request.json, state.json) that are valid JSON of the wrong
shape are named in one line (exit 1) by status/describe/log/cancel, and `xrun list` still lists
every other app (the damaged one as UNKNOWN)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.cli import Env
from xrun.schedulers.local_cwd import statedir

SHAPES = [
    [],
    {},
    {"state": 5},
    {"state": "NOPE", "replicas": [], "supervisor": {"pid": 1, "start": None}},
    {"state": "RUNNING", "replicas": 5, "supervisor": {"pid": 1, "start": 1}},
    {"state": "RUNNING", "replicas": [], "supervisor": []},
    {"state": "RUNNING", "replicas": [1], "supervisor": {"pid": 1, "start": 1}},
    {
        "state": "RUNNING",
        "replicas": [{"role": "echo", "id": 0, "pid": "a", "start": 1, "state": "RUNNING"}],
        "supervisor": {"pid": 99999999, "start": 1},
    },
    {"app": 3, "replicas": [{"role": 1}]},
    {"app": {"name": "x", "roles": []}, "replicas": [{"role": "echo", "id": "0"}]},
]


@pytest.fixture(scope="module")
def ended(tmp_path_factory: pytest.TempPathFactory) -> tuple[Env, str, str, Path]:
    """Two ended apps of one user: the one whose records the tests damage, and a bystander."""
    env = Env(tmp_path_factory.mktemp("records"))
    handles = []
    for msg in ("victim", "bystander"):
        r = env.run("run", "-s", "local_cwd", "utils.echo", "--msg", msg)
        assert r.returncode == 0, r.stderr
        handles.append(r.stdout.strip().splitlines()[0])
    victim = handles[0].rsplit("/", 1)[1]
    paths = statedir.find(victim)
    assert paths is not None
    return env, handles[0], handles[1], Path(paths.state_dir)


@pytest.mark.parametrize("record", ["state.json", "request.json"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: json.dumps(s)[:40])
def test_a_damaged_record_is_one_line_and_hides_no_other_app(
    ended: tuple[Env, str, str, Path], record: str, shape: object
) -> None:
    env, victim, bystander, state_dir = ended
    path = state_dir / record
    good = path.read_text()
    path.write_text(json.dumps(shape))
    try:
        for command in ("status", "describe", "log", "cancel"):
            r = env.run(command, victim)
            assert "Traceback" not in r.stderr, (command, r.stderr[-2000:])
            assert r.returncode == 1, (command, r.returncode, r.stderr)
            lines = r.stderr.splitlines()
            assert len(lines) == 1 and str(path) in lines[0] and "damaged" in lines[0], lines
        listed = env.run("list", "-s", "local_cwd")
        assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
        assert f"{bystander}\tSUCCEEDED\techo" in listed.stdout
        assert f"{victim}\tUNKNOWN" in listed.stdout
    finally:
        path.write_text(good)
    assert "State: SUCCEEDED" in env.run("status", victim).stdout
