"""The guard (tests/core/test_guard.py) extended to issue #26's surfaces, under the same rule
and the same bounds (its ``xrun`` helper: exit 0, 1 or 2, no traceback, a usage error in one
line, bounded CPU, wall-clock time and memory):

- ``--sweep`` flags and ``--sweep-file`` files of any shape;
- component files that exit or raise anything while loading, or from their function;
- ``xrun configure`` over any target (a file, a directory, a dangling symlink, a FIFO, a
  deleted cwd), which also must leave no temporary file behind;
- saved state records of any shape: a real ended local_cwd app's ``request.json`` and
  ``state.json``, and a real ended sweep's ``sweep.json``, ``state.json`` and
  ``supervisor.json``, read by ``status``/``describe``/``log``/``list`` (not ``cancel``: a
  record may name any pid, and the guard never signals processes it did not start);
- env values (a NUL byte is exit 2);
- token files of any content (the absurd ones, /dev/zero and huge files, run in a box with a
  memory limit: tests/runtime/rendezvous/test_conf_limits.py).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from tests.core.test_guard import GUARD, HUGE, _bounded, numbers, text, values, xrun
from tests.helpers.paths import XRUN
from xrun.errors import UsageError
from xrun.runtime.rendezvous.conf import MAX_TOKEN_BYTES, RdzvConfig, load_token
from xrun.schedulers.local_cwd import statedir
from xrun.sweeps import records

_TMP = Path(tempfile.mkdtemp(prefix="xrun-guard-26-"))
_COUNT = itertools.count()


# --------------------------------------------------------------------------- sweeps
sweep_names = st.one_of(st.sampled_from(["lr", "wd", "", "1x", "a b", "lr=", "x" * 300]), text)
sweep_values = st.lists(st.one_of(numbers, text), max_size=4).map(",".join)


@GUARD
@given(st.lists(st.tuples(sweep_names, sweep_values), max_size=3), st.one_of(st.none(), numbers))
@example([("lr", ",".join(["1"] * 101)), ("wd", ",".join(["2"] * 100))], None)  # > 10,000
@example([("lr", "1,2")], HUGE)
@example([("lr", "1")], "\u0662")
def test_any_sweep_flags(flags: list[tuple[str, str]], max_parallel: str | None) -> None:
    argv = [a for name, vals in flags for a in ("--sweep", f"{name}={vals}")]
    if max_parallel is not None:
        argv += ["--max-parallel", max_parallel]
    xrun("run", "--dryrun", "-s", "local_cwd", *argv, "utils.echo", "--msg", "{{lr}}")


trial_maps = st.dictionaries(st.one_of(st.sampled_from(["lr", "wd", ""]), text), values, max_size=3)
sweep_texts = st.sampled_from(
    [
        "- {lr: 1, lr: 2}\n",
        '[{"lr": 1, "lr": 2}]\n',
        "- &a {lr: 1}\n- *a\n",
        "- {lr: [1, 2]}\n",
        "- {lr: " + HUGE + "}\n",
        "lr: 1\n",
        "- {? [1, 2] : 3}\n",
        "[",
    ]
)


@GUARD
@given(st.one_of(values, st.lists(trial_maps, max_size=4)), st.one_of(st.none(), sweep_texts))
@example(None, "- {lr: 1, lr: 2}\n")
def test_any_sweep_file(data: object, raw: str | None) -> None:
    path = _TMP / f"grid-{next(_COUNT)}.yaml"
    path.write_text(raw if raw is not None else yaml.safe_dump(data, allow_unicode=True))
    code, _, err = xrun(
        "run", "--dryrun", "--sweep-file", str(path), "utils.echo", "--msg", "{{lr}}"
    )
    if raw is not None and "lr: 1, lr: 2" in raw.replace('"', ""):
        assert code == 2 and "appears twice" in err, err


# --------------------------------------------------------------------------- component files
failures = st.one_of(
    values.map(lambda v: f"import sys\nsys.exit({v!r})"),
    st.sampled_from(
        [
            "raise SystemExit",
            "raise ValueError('x')",
            "raise RecursionError",
            "raise MemoryError",
            "raise GeneratorExit",
            "raise StopIteration",
            "class E(BaseException):\n    pass\nraise E('own')",
            "1 / 0",
            "import nosuch_module_of_anyone",
            "def g(:",
            "return 5",
            "import torchx.specs as specs\nraise specs.AppDef",
        ]
    ),
)


@GUARD
@given(failures, st.booleans())
@example("import sys\nsys.exit(0)", False)  # the issue's: exit 0, nothing submitted or said
@example("import sys\nsys.exit(3)", True)
def test_any_component_file_that_fails(failure: str, in_function: bool) -> None:
    path = _TMP / f"comp_{next(_COUNT)}.py"
    if in_function:
        body = "".join(f"    {line}\n" for line in failure.splitlines())
        path.write_text(f"def f():\n{body}")
    else:
        path.write_text(f"{failure}\n\ndef f():\n    pass\n")
    code, out, err = xrun("run", "--dryrun", f"{path}:f")
    assert code == 2, (failure, code, err)  # never 0 with nothing said, never the file's code


# --------------------------------------------------------------------------- configure
TARGETS = ["none", "file", "dir", "dangling", "link_to_dir", "link_to_devnull", "fifo", "deleted"]


@contextlib.contextmanager
def _in_dir(target: str) -> Iterator[Path]:
    """A fresh cwd whose ``.xrunconfig`` is ``target``; the old cwd back afterwards."""
    old = os.getcwd()
    d = _TMP / f"cfg-{next(_COUNT)}"
    d.mkdir()
    dest = d / ".xrunconfig"
    if target == "file":
        dest.write_text("[local_cwd]\n")
    elif target == "dir":
        dest.mkdir()
    elif target == "dangling":
        dest.symlink_to(d / "nowhere")
    elif target == "link_to_dir":
        dest.symlink_to(d)
    elif target == "link_to_devnull":
        dest.symlink_to("/dev/null")
    elif target == "fifo":
        os.mkfifo(dest)
    os.chdir(d)
    try:
        if target == "deleted":
            d.rmdir()
        yield d
    finally:
        os.chdir(old)


@GUARD
@given(
    st.sampled_from(TARGETS),
    st.one_of(st.none(), text, st.sampled_from(["", ",", " , ", "local_cwd", "slurm,nosuch"])),
    st.booleans(),
    st.booleans(),
)
@example("dangling", None, False, False)
@example("dir", None, True, False)
@example("none", "", False, True)
@example("deleted", None, False, False)
def test_any_configure_target(
    target: str, schedulers: str | None, force: bool, to_print: bool
) -> None:
    args = ["configure"] + (["-s", schedulers] if schedulers is not None else [])
    args += (["--force"] if force else []) + (["--print"] if to_print else [])
    with _in_dir(target) as d:
        code, _, err = xrun(*args)
    if target != "deleted":
        assert not [p for p in os.listdir(d) if ".tmp." in p], os.listdir(d)  # nothing left
    kept = target in ("dangling", "file", "fifo", "link_to_devnull")
    if kept and schedulers is None and not force and not to_print:
        assert code == 2 and "exists already" in err, err  # kept without --force
    if schedulers is not None and not schedulers.replace(",", "").strip():
        assert code == 2, err  # -s '' names no scheduler


# --------------------------------------------------------------------------- saved records
def _shell(*args: str) -> str:
    r = subprocess.run([XRUN, *args], capture_output=True, text=True, timeout=120, cwd=_TMP)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def ended() -> dict[str, object]:
    """A real ended local_cwd app and a real ended sweep, and their records' good text."""
    app = _shell("run", "-s", "local_cwd", "utils.echo", "--msg", "hi")
    sweep = _shell("run", "--sweep", "w=1", "--wait", "utils.sh", "echo {{w}}")
    paths = statedir.find(app.rsplit("/", 1)[1])
    sweep_dir = records.find("local_cwd", sweep.rsplit("/", 1)[1])
    assert paths is not None and sweep_dir is not None
    files = [Path(paths.request), Path(paths.state)] + [
        Path(sweep_dir) / n
        for n in (records.SPEC_FILE, records.STATE_FILE, records.SUPERVISOR_FILE)
    ]
    return {"app": app, "sweep": sweep, "files": {f: f.read_text() for f in files}}


def _mutated(good: str, key: str, value: object, whole: bool) -> object:
    """The good record with ``key`` (at the top, or in its first list item) set to ``value``;
    or, with ``whole``, ``value`` itself."""
    if whole:
        return value
    data = json.loads(good)
    for v in data.values():  # the first list of records in it: replicas, trials
        if isinstance(v, list) and v and isinstance(v[0], dict) and key in v[0]:
            v[0][key] = value
            return data
    data[key] = value
    return data


RECORD_KEYS = st.sampled_from(
    ["state", "supervisor", "replicas", "msg", "app", "tolerate", "grace_s", "pid", "start",
     "role", "id", "exit_code", "plan", "trials", "app_id", "ended", "started", "host"]
)  # fmt: skip


@GUARD
@given(st.integers(0, 4), RECORD_KEYS, values, st.booleans())
@example(1, "role", "", False)  # a replica of no role: KeyError in status (fresh-clone CI)
@example(2, "state", None, True)  # sweep.json holding null: FileNotFoundError traceback
def test_any_saved_record(
    ended: dict[str, object], which: int, key: str, value: object, whole: bool
) -> None:
    files: dict[Path, str] = ended["files"]  # type: ignore[assignment]
    path = list(files)[which]
    path.write_text(json.dumps(_mutated(files[path], key, value, whole)))
    try:
        handle = str(ended["app"] if which < 2 else ended["sweep"])
        for args in (["status", handle], ["describe", handle], ["log", handle], ["list"]):
            xrun(*args)
        if which >= 2:
            xrun("status", f"{handle}/0")
    finally:
        path.write_text(files[path])


# --------------------------------------------------------------------------- env values
@GUARD
@given(st.text(max_size=30))
@example("b\0c")
def test_any_env_value(value: str) -> None:
    code, _, err = xrun(
        "run", "--dryrun", "-s", "local_cwd", "utils.sh", "--env", f"A={value}", "true"
    )
    if "\0" in value:
        assert code == 2 and "NUL byte" in err, err  # used to kill the supervisor at run time


# --------------------------------------------------------------------------- token files
@GUARD
@given(st.one_of(st.binary(max_size=2 * MAX_TOKEN_BYTES), st.sampled_from(["dir", "missing"])))
@example(b"")
@example(b" \n\t")
@example(b"x" * (MAX_TOKEN_BYTES + 1))
def test_any_token_file(content: bytes | str) -> None:
    path = _TMP / f"token-{next(_COUNT)}"
    if content == "dir":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    with _bounded():
        try:
            token = load_token(RdzvConfig(token_file=str(path)), env={})
        except UsageError as e:
            assert "\n" not in str(e) and str(path) in str(e), str(e)
            return
    assert token is not None and 0 < len(token) <= MAX_TOKEN_BYTES
