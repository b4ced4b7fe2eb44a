"""Issue #26, the CLI side: the last tracebacks and lies of `configure`, a deleted cwd,
component files that exit while loading, `cancel` of what already ended.

Every test runs the real ``xrun`` console script, as a user's shell would. Absurd situations
(a read-only or full filesystem) are made with a small tmpfs box (tests/helpers/box.py).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.core.test_hardening import one_line_exit_2
from tests.helpers.box import tmpfs
from tests.helpers.cli import Env
from tests.helpers.paths import XRUN


@pytest.fixture
def cli(tmp_path: Path) -> Env:
    return Env(tmp_path)


def leftovers(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if ".tmp" in p.name)


# --------------------------------------------------------------------------- configure
@pytest.mark.parametrize("names", ["", ",", " , "])
def test_configure_with_an_empty_scheduler_list_is_refused(cli: Env, names: str) -> None:
    one_line_exit_2(cli.run("configure", "-s", names, "--print"), "-s", "S1,S2")


def test_configure_keeps_a_dangling_symlink_without_force(cli: Env) -> None:
    link = cli.cwd / ".xrunconfig"
    link.symlink_to(cli.cwd / "nowhere")
    one_line_exit_2(cli.run("configure"), "exists already", "--force")
    assert link.is_symlink() and not (cli.cwd / "nowhere").exists()


def test_configure_over_a_directory_is_one_line(cli: Env) -> None:
    (cli.cwd / ".xrunconfig").mkdir()
    one_line_exit_2(cli.run("configure", "--force"), "is a directory")
    assert leftovers(cli.cwd) == []


def test_configure_in_a_read_only_dir_is_one_line(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "ro", read_only=True) as ro:
        r = subprocess.run([XRUN, "configure"], cwd=ro, capture_output=True, text=True, timeout=60)
        one_line_exit_2(r, "cannot write", "Read-only file system")


def test_configure_on_a_full_disk_is_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "full", size="4k") as full:
        (full / "filler").write_bytes(b"x" * 4096)  # the one page there is
        r = subprocess.run(
            [XRUN, "configure"], cwd=full, capture_output=True, text=True, timeout=60
        )
        one_line_exit_2(r, "cannot write", "No space left on device")
        assert leftovers(full) == [] and not (full / ".xrunconfig").exists()


# --------------------------------------------------------------------------- a deleted cwd
def _in_a_deleted_cwd(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    gone = tmp_path / "gone"
    gone.mkdir()
    # The shell enters the dir, deletes it, then runs xrun there (as a user's shell can).
    script = f'cd "{gone}" && rmdir "{gone}" && exec "$@"'
    env = {**os.environ, "HOME": str(tmp_path)}
    return subprocess.run(
        ["sh", "-c", script, "sh", XRUN, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_configure_in_a_deleted_cwd_is_one_line(tmp_path: Path) -> None:
    one_line_exit_2(_in_a_deleted_cwd(tmp_path, "configure"), "current directory")


@pytest.mark.parametrize(
    "args, code",
    [
        (["status", "local_cwd://default/nosuch-app"], 1),
        (["list", "-s", "local_cwd"], 0),
        # docker builds the cwd as the workspace by default, and the dry run names it
        (["run", "--dryrun", "-s", "docker", "utils.echo"], 2),
    ],
)
def test_every_command_runs_in_a_deleted_cwd(tmp_path: Path, args: list[str], code: int) -> None:
    r = _in_a_deleted_cwd(tmp_path, *args)
    assert r.returncode == code, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    if code == 2:
        assert r.stderr.count("\n") == 1 and "current directory" in r.stderr, r.stderr


@pytest.mark.parametrize("scheduler", ["local_cwd", "slurm"])
def test_a_run_in_a_deleted_cwd_is_one_line(tmp_path: Path, scheduler: str) -> None:
    r = _in_a_deleted_cwd(tmp_path, "run", "--dryrun", "-s", scheduler, "utils.echo")
    one_line_exit_2(r, "current directory")


# --------------------------------------------------------------------------- component files
@pytest.mark.parametrize(
    "body, code",
    [
        ("import sys\nsys.exit(0)\n", "0"),
        ("import sys\nsys.exit(3)\n", "3"),
        ("raise SystemExit('bye')\n", "'bye'"),
        ("import sys\nsys.exit()\n", "None"),
    ],
)
def test_a_component_file_that_exits_while_loading_is_one_line(
    cli: Env, body: str, code: str
) -> None:
    (cli.cwd / "comp.py").write_text(body + "def f() -> None:\n    pass\n")
    r = cli.run("run", "--dryrun", "-s", "local_cwd", "comp.py:f")
    one_line_exit_2(r, "comp.py", f"sys.exit({code}) while loading")


@pytest.mark.parametrize(
    "body, must",
    [
        ("class E(BaseException):\n    pass\n\nraise E('x')\n", "failed to import: E: x"),
        ("def f() -> None:\n    raise RuntimeError('boom')\n", "failed: RuntimeError: boom"),
    ],
)
def test_a_component_file_raising_anything_is_one_line(cli: Env, body: str, must: str) -> None:
    (cli.cwd / "comp.py").write_text(body)
    one_line_exit_2(cli.run("run", "--dryrun", "comp.py:f"), must)


def test_a_component_that_exits_instead_of_returning_is_one_line(cli: Env) -> None:
    (cli.cwd / "comp.py").write_text("import sys\n\ndef f() -> None:\n    sys.exit(4)\n")
    one_line_exit_2(cli.run("run", "--dryrun", "comp.py:f"), "comp.py:f", "sys.exit(4)")


# --------------------------------------------------------------------------- cancel
def _handle(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.strip().splitlines()[-1]


def test_cancel_of_an_ended_app_says_it_had_ended_and_in_what_state(cli: Env) -> None:
    ok = _handle(cli.run("run", "-s", "local_cwd", "utils.echo", "--msg", "hi"))
    r = cli.run("cancel", ok)
    assert r.returncode == 3, r.stderr
    assert r.stderr == f"xrun: {ok} had already ended SUCCEEDED; nothing to cancel\n"
    assert "State: SUCCEEDED" in cli.run("status", ok).stdout  # and it still says so


def test_cancel_of_a_running_app_still_cancels_it(cli: Env) -> None:
    # local_cwd's `run` waits: its handle is its first line, printed at submission
    waiting = subprocess.Popen(
        [XRUN, "run", "-s", "local_cwd", "utils.sh", "sleep 60"],
        cwd=cli.cwd,
        env={**os.environ, **cli.env},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert waiting.stdout is not None
    handle = waiting.stdout.readline().strip()
    r = cli.run("cancel", handle)
    waiting.wait(60)
    assert r.returncode == 0, r.stderr
    assert r.stderr == f"xrun: cancelled {handle}\n"
    assert "State: CANCELLED" in cli.run("status", handle).stdout


def test_cancel_of_an_ended_sweep_and_trial_say_so(cli: Env) -> None:
    r = cli.run("run", "--sweep", "w=0,1", "--wait", "utils.sh", "exit {{w}}")
    assert r.returncode == 1, r.stderr  # trial 1 failed
    sweep = r.stdout.strip()
    whole = cli.run("cancel", sweep)
    assert whole.returncode == 3, whole.stderr
    assert whole.stderr == f"xrun: {sweep} had already ended FAILED; nothing to cancel\n"
    one = cli.run("cancel", f"{sweep}/0")
    assert one.returncode == 3, one.stderr
    assert "had already ended SUCCEEDED" in one.stderr


# --------------------------------------------------------------------------- caught at submit
ARABIC_2 = "\u0662"  # '٢': int() and float() read it


@pytest.mark.parametrize(
    "args, must",
    [
        (
            ["dist.ddp", "-j", "1x1", "--max_retries", "10000000000", "--script", "s.py"],
            "over the limit of 2,147,483,647",
        ),
        (["dist.ddp", "-j", "1x1", "--max_retries", ARABIC_2, "--script", "s.py"], "ASCII"),
        (
            [
                "dist.ddp",
                "-j",
                "1x1",
                "--rdzv_conf",
                f"join_timeout={ARABIC_2}",
                "--script",
                "s.py",
            ],
            "join_timeout",
        ),
        (["-cfg", f"stop_grace_s={ARABIC_2}", "utils.echo"], "stop_grace_s"),
    ],
)
def test_bad_values_are_refused_at_the_dry_run(cli: Env, args: list[str], must: str) -> None:
    (cli.cwd / "s.py").write_text("print('hi')\n")
    one_line_exit_2(cli.run("run", "--dryrun", "-s", "local_cwd", *args), must)


@pytest.mark.parametrize(
    "field", ['  env: {A: "b\\0c"}\n', '  args: ["a\\0b"]\n', '  entrypoint: "ec\\0ho"\n']
)
def test_a_nul_byte_in_a_saved_appdef_is_refused_before_anything_runs(cli: Env, field: str) -> None:
    # A command line cannot carry NUL, a YAML "\0" can: it used to pass validation and kill
    # the supervisor (ValueError: embedded null byte, rc 1)
    (cli.cwd / "spec.yaml").write_text(
        "name: x\nroles:\n- name: r\n  image: i\n"
        + ("  entrypoint: echo\n" if "entrypoint" not in field else "")
        + field
    )
    before = cli.run("list", "-s", "local_cwd").stdout  # the suite shares one state dir
    for args in (["--dryrun"], []):
        one_line_exit_2(cli.run("run", "-s", "local_cwd", *args, "spec.yaml"), "NUL byte")
    assert cli.run("list", "-s", "local_cwd").stdout == before  # nothing was submitted


def test_a_missing_script_on_local_cwd_is_refused_at_submit(cli: Env) -> None:
    before = cli.run("list", "-s", "local_cwd").stdout  # the suite shares one state dir
    r = cli.run("run", "-s", "local_cwd", "dist.ddp", "-j", "1x1", "--script", "nosuch.py")
    one_line_exit_2(r, "nosuch.py", str(cli.cwd))
    assert cli.run("list", "-s", "local_cwd").stdout == before  # nothing was submitted
    # the dry run may be written anywhere: it does not look for the file
    assert cli.run("run", "--dryrun", "dist.ddp", "--script", "nosuch.py").returncode == 0


@pytest.mark.parametrize(
    "text, must",
    [
        ("- {lr: 1, lr: 2}\n", "'lr' appears twice"),
        ('[{"lr": "1", "lr": "2"}]\n', "'lr' appears twice"),
    ],
)
def test_a_duplicate_key_in_a_sweep_file_is_refused(cli: Env, text: str, must: str) -> None:
    (cli.cwd / "grid.yaml").write_text(text)
    r = cli.run("run", "--dryrun", "--sweep-file", "grid.yaml", "utils.echo", "--msg", "{{lr}}")
    one_line_exit_2(r, "grid.yaml", must)


def test_a_saved_appdef_without_a_name_is_refused(cli: Env) -> None:
    (cli.cwd / "spec.yaml").write_text(
        'name: ""\nroles:\n- name: r\n  image: i\n  entrypoint: echo\n'
    )
    one_line_exit_2(cli.run("run", "--dryrun", "spec.yaml"), "app name '' is empty")


def test_a_huge_config_file_is_read_with_a_limit(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "box", size="64m") as box:
        with open(box / ".xrunconfig", "wb") as f:  # sparse: 17 MiB of NULs, no disk
            f.truncate(17 * 2**20)
        r = subprocess.run(
            ["timeout", "-s", "KILL", "20", XRUN, "run", "--dryrun", "utils.echo"],
            cwd=box,
            capture_output=True,
            text=True,
            env={**os.environ, "HOME": str(box)},
        )
        one_line_exit_2(r, ".xrunconfig", "larger than 16 MiB")
