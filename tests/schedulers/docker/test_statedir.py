"""Issue #26: a docker app's records (status.json, job.json) that are JSON of the wrong shape
are one line naming the file (exit 1) for status/describe/log/cancel, and `xrun list -s docker`
still lists the other apps. The records are written here as the watcher writes them (an ended
app needs no engine to be described: see DockerScheduler.describe)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.helpers.cli import Env
from xrun.schedulers.docker.statedir import StateDir

FINAL = {
    "state": "SUCCEEDED",
    "num_restarts": 0,
    "msg": "",
    "cleaned": True,
    "roles": [
        {
            "role": "echo",
            "replicas": [
                {
                    "id": 0,
                    "state": "SUCCEEDED",
                    "role": "echo",
                    "hostname": "h",
                    "exit_code": 0,
                    "structured_error_msg": "",
                }
            ],
        }
    ],
}
JOB = {
    "app_id": "x",
    "app_name": "echo",
    "containers": [{"role": "echo", "image": "i", "command": ["echo", "hi"]}],
}
SHAPES = [
    ("status.json", []),
    ("status.json", {"state": 5}),
    ("status.json", {**FINAL, "num_restarts": "x"}),
    ("status.json", {**FINAL, "roles": 5}),
    ("status.json", {**FINAL, "roles": [{"role": "echo", "replicas": [{"state": "NOPE"}]}]}),
    ("status.json", {**FINAL, "roles": [{"role": "echo", "replicas": [{"bogus": 1}]}]}),
    ("job.json", {"containers": 3}),
    ("job.json", {"containers": [{"role": 1}]}),
    ("job.json", {**JOB, "app_name": 5}),
]


def _record(root: Path, app_id: str) -> Path:
    d = root / app_id
    d.mkdir(parents=True)
    (d / "status.json").write_text(json.dumps(FINAL))
    (d / "job.json").write_text(json.dumps({**JOB, "app_id": app_id}))
    return d


@pytest.mark.parametrize("name, shape", SHAPES, ids=lambda v: json.dumps(v)[:30])
def test_a_damaged_docker_record_is_one_line(tmp_path: Path, name: str, shape: object) -> None:
    env = Env(tmp_path)
    root = StateDir().root
    victim, bystander = f"echo-{tmp_path.name[-6:]}a", f"echo-{tmp_path.name[-6:]}b"
    victim = "".join(c if c.isalnum() or c == "-" else "0" for c in victim).lower()
    bystander = "".join(c if c.isalnum() or c == "-" else "0" for c in bystander).lower()
    d = _record(root, victim)
    _record(root, bystander)
    try:
        _check(env, d, name, shape, victim, bystander)
    finally:  # the suite's state dir is shared: other tests' lists must not see them
        shutil.rmtree(d)
        shutil.rmtree(root / bystander)


def _check(env: Env, d: Path, name: str, shape: object, victim: str, bystander: str) -> None:
    handle = f"docker://default/{victim}"
    assert "State: SUCCEEDED" in env.run("status", handle).stdout  # the good record reads
    (d / name).write_text(json.dumps(shape))
    for command in ("status", "describe"):
        r = env.run(command, handle)
        assert "Traceback" not in r.stderr, (command, r.stderr[-2000:])
        assert r.returncode == 1, (command, r.returncode, r.stderr)
        lines = r.stderr.splitlines()
        assert len(lines) == 1 and str(d / name) in lines[0] and "damaged" in lines[0], lines
    listed = env.run("list", "-s", "docker")
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    assert f"docker://default/{bystander}\tSUCCEEDED\techo" in listed.stdout, listed.stdout
