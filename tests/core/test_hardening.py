"""Issue #17, the CLI side: every bad input is one line and exit 2, nothing is unbounded.

One test per item of the issue (the example it gives, and its class). Absurd sizes run in a
box: ``timeout -s KILL`` and TMPDIR/XDG_STATE_HOME on a 4 MiB tmpfs (tests/helpers/box.py), so a
regression fails the test instead of filling the machine.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.box import boxed_xrun, tmpfs

HUGE = "9" * 6000  # past Python's int-string limit (4,300 digits)


@pytest.fixture
def box(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "box") as path:
        yield path


def one_line_exit_2(r: object, *must: str) -> str:
    """The error line of a run that must fail with exit 2, one line, no traceback."""
    code, err, out = r.returncode, r.stderr, r.stdout  # type: ignore[attr-defined]
    assert code == 2, (code, err[-2000:])
    assert "Traceback" not in err and out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("xrun: error: "), err[-2000:]
    for text in must:
        assert text in lines[0], (text, lines[0])
    assert len(lines[0]) < 1000, lines[0]  # a 6,000-digit value is named, not repeated
    return lines[0]


def spec(box: Path, text: str, name: str = "spec.yaml") -> str:
    path = box / name
    path.write_text(text)
    return str(path)


ROLE = "name: x\nroles:\n- name: r\n  image: i\n  entrypoint: echo\n"


# --------------------------------------------------------------------------- unbounded work
@pytest.mark.parametrize(
    "j, limit",
    [
        ("99999999999999999999999999x1", "65,536"),  # the example
        ("65537x1", "65,536"),
        ("1x4097", "4,096"),
        (HUGE + "x1", "65,536"),
        ("1x" + HUGE, "4,096"),
    ],
)
def test_a_huge_j_is_refused_at_once(box: Path, j: str, limit: str) -> None:
    r = boxed_xrun("run", "--dryrun", "dist.ddp", "-j", j, "--script", "s.py", box=box)
    one_line_exit_2(r, "-j", f"over the limit of {limit}")


def test_j_takes_only_ascii_digits(box: Path) -> None:
    r = boxed_xrun(
        "run", "--dryrun", "dist.ddp", "-j", "\uff11x\uff12", "--script", "s.py", box=box
    )
    one_line_exit_2(r, "ASCII digits")


@pytest.mark.parametrize("n", ["99999999999", "65537", HUGE])
def test_a_saved_appdef_with_huge_num_replicas_is_refused(box: Path, n: str) -> None:
    path = spec(box, ROLE + f"  num_replicas: {n}\n")
    r = boxed_xrun("run", "--dryrun", path, box=box)
    line = one_line_exit_2(r, "spec.yaml")
    assert "65,536" in line or "4300 digits" in line


def test_a_huge_sweep_is_refused_before_it_is_expanded(box: Path) -> None:
    values = ",".join(str(i) for i in range(100))
    r = boxed_xrun(
        "run",
        "--dryrun",
        *[f"--sweep=p{k}={values}" for k in range(5)],  # 10^10 trials
        "utils.echo",
        "--msg",
        "{{p0}}",
        box=box,
    )
    one_line_exit_2(r, "more than 10,000 trials")
    r = boxed_xrun(
        "run", "--dryrun", "--sweep", "a=1", "--max-parallel", HUGE, "utils.echo", box=box
    )
    assert r.returncode == 0, r.stderr  # any K above the trial count is the same K
    r = boxed_xrun(
        "run", "--dryrun", "--sweep", "a=1", "--max-parallel", "\uff12", "utils.echo", box=box
    )
    one_line_exit_2(r, "--max-parallel")


def test_an_int_past_the_int_string_limit_is_one_line(box: Path) -> None:
    r = boxed_xrun("run", "--dryrun", "dist.ddp", "--script", "s.py", "--cpu", HUGE, box=box)
    one_line_exit_2(r, "--cpu", "not a valid int")
    r = boxed_xrun(
        "run", "--dryrun", "-s", "docker", "-cfg", f"stop_timeout={HUGE}", "utils.echo", box=box
    )
    one_line_exit_2(r, "stop_timeout")


# --------------------------------------------------------------------------- YAML shapes
@pytest.mark.parametrize(
    "text, field",
    [
        ("name: x\nroles: 5\n", "roles: expected a list, got an integer 5"),
        (ROLE + "  num_replicas: abc\n", "roles[0].num_replicas: expected an integer"),
        (ROLE + "  num_replicas: true\n", "roles[0].num_replicas: expected an integer"),
        (ROLE + "  resource: {cpu: many}\n", "roles[0].resource.cpu: expected an integer"),
        (ROLE + "  resource: 4\n", "roles[0].resource: expected a mapping"),
        (ROLE + "  args: [[1, 2]]\n", "roles[0].args[0]: expected a string"),
        (ROLE + "  args: {a: b}\n", "roles[0].args: expected a list"),
        (ROLE + "  env: [A]\n", "roles[0].env: expected a mapping"),
        (ROLE + "  env: {A: [1]}\n", "roles[0].env.A: expected a string"),
        (ROLE + "  port_map: {p: 70000}\n", "roles[0].port_map.p: 70000 is over the limit"),
        (ROLE + "  mounts: [{type: bind, src: /a, dst: /b, read_only: maybe}]\n", "read_only"),
        (ROLE + "  mounts: [{type: bind, src_path: /a}]\n", "needs src_path and dst_path"),
        (ROLE + "  metadata: 3\n", "roles[0].metadata: expected a mapping"),
        ("name: x\nroles:\n- {name: r, image: null}\n", "roles[0]: the role has no image"),
        ("name: x\nroles:\n- {image: i}\n", "roles[0]: the role has no name"),
        ("name: [x]\nroles: []\n", "name: expected a string"),
        ("name: x\nroles: []\nbogus: 1\n", "unknown field 'bogus'"),
        ("- a\n- b\n", "expected a mapping with 'name' and 'roles'"),
        (ROLE + "  args: [2024-13-45]\n", "cannot be read (month must be in 1..12)"),
        ("name: x\nroles: " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
    ],
)
def test_a_saved_appdef_of_the_wrong_shape_names_the_field(
    box: Path, text: str, field: str
) -> None:
    r = boxed_xrun("run", "--dryrun", spec(box, text), box=box)
    one_line_exit_2(r, "spec.yaml", field)


def test_a_binary_or_huge_file_as_a_spec_is_refused(box: Path) -> None:
    (box / "bin.yaml").write_bytes(bytes(range(256)) * 4)
    one_line_exit_2(boxed_xrun("run", "--dryrun", str(box / "bin.yaml"), box=box), "not UTF-8")
    (box / "nul.yaml").write_bytes(b"name: x\x00\n")
    one_line_exit_2(boxed_xrun("run", "--dryrun", str(box / "nul.yaml"), box=box), "NUL")
    # /dev/zero never ends: it is read up to the limit, not for ever
    os.symlink("/dev/zero", box / "zero.yaml")
    one_line_exit_2(boxed_xrun("run", "--dryrun", str(box / "zero.yaml"), box=box), "16 MiB")


def test_yaml_aliases_cannot_blow_up_a_spec(box: Path) -> None:
    """The "billion laughs": 10 levels of 10 aliases are 10^10 strings once expanded."""
    lines = ["x0: &x0 [a, a, a, a, a, a, a, a, a, a]"]
    lines += [f"x{i}: &x{i} [" + ", ".join([f"*x{i - 1}"] * 10) + "]" for i in range(1, 10)]
    text = "\n".join(lines) + "\n" + ROLE + "  metadata: {m: *x9}\n"
    r = boxed_xrun("run", "--dryrun", spec(box, text), box=box)
    one_line_exit_2(r, "more than 100,000 values")
    sweep = box / "trials.yaml"
    sweep.write_text("\n".join(lines) + "\nt: *x9\n")
    r = boxed_xrun("run", "--dryrun", "--sweep-file", str(sweep), "utils.echo", box=box)
    one_line_exit_2(r, "more than 100,000 values")


# --------------------------------------------------------------------------- directories
@pytest.mark.parametrize("log_dir", ["/etc/passwd", "/etc/passwd/sub"])
def test_a_log_dir_that_is_a_file_is_refused_at_dry_run(box: Path, log_dir: str) -> None:
    r = boxed_xrun("run", "--dryrun", "-cfg", f"log_dir={log_dir}", "utils.echo", box=box)
    one_line_exit_2(r, "not a directory", "log_dir")


def test_a_log_dir_that_cannot_be_created_is_refused_at_submit(box: Path) -> None:
    r = boxed_xrun("run", "-cfg", "log_dir=/proc/nope", "utils.echo", box=box)
    one_line_exit_2(r, "/proc", "log_dir")


def test_an_xdg_state_home_that_is_a_file(box: Path) -> None:
    (box / "file").write_text("")
    env = {"XDG_STATE_HOME": str(box / "file")}
    for argv in (["run", "utils.echo"], ["list"], ["status", "local_cwd://default/x-1"]):
        one_line_exit_2(boxed_xrun(*argv, box=box, env=env), "XDG_STATE_HOME", "not a directory")


def test_a_read_only_state_dir(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "box") as box, tmpfs(tmp_path / "ro", read_only=True) as ro:
        env = {"XDG_STATE_HOME": str(ro)}
        r = boxed_xrun("run", "utils.echo", box=box, env=env)
        one_line_exit_2(r, str(ro))
        # with the logs elsewhere, the index (in the state dir) is the part that fails
        r = boxed_xrun("run", "-cfg", f"log_dir={box}/logs", "utils.echo", box=box, env=env)
        one_line_exit_2(r, "index", "XDG_STATE_HOME")
        assert os.listdir(box / "logs") == []  # nothing of the app that did not start is left


# --------------------------------------------------------------------------- durations
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1", "86401", "1e400"])
def test_every_duration_option_refuses_non_finite_and_absurd_values(box: Path, value: str) -> None:
    one_line_exit_2(
        boxed_xrun("run", "--dryrun", "-cfg", f"stop_grace_s={value}", "utils.echo", box=box),
        "stop_grace_s",
    )
    if value in ("-1", "86401"):  # docker's stop_timeout is whole seconds
        one_line_exit_2(
            boxed_xrun(
                "run",
                "--dryrun",
                "-s",
                "docker",
                "-cfg",
                f"stop_timeout={value}",
                "utils.echo",
                box=box,
            ),
            "stop_timeout",
        )
    for key in ("join_timeout", "heartbeat_timeout", "keep_alive_interval"):
        r = boxed_xrun(
            "run",
            "--dryrun",
            "dist.ddp",
            "--script",
            "s.py",
            "--rdzv_conf",
            f"{key}={value}",
            box=box,
        )
        one_line_exit_2(r, f"{key}=")


def test_a_slurm_signal_time_is_checked(box: Path) -> None:
    for value in ("USR2@abc", "USR2@99999", "USR2@\uff19\uff10"):
        r = boxed_xrun(
            "run", "--dryrun", "-s", "slurm", "-cfg", f"signal={value}", "utils.echo", box=box
        )
        one_line_exit_2(r, "signal=", "0..65535")


# --------------------------------------------------------------------------- env var names
@pytest.mark.parametrize(
    "argv",
    [
        ["dist.ddp", "--script", "s.py", "--env", "A B=1"],
        ["dist.ddp", "--script", "s.py", "--env", "1A=1"],
        ["utils.sh", "--env", "BAD-NAME=1", "true"],
    ],
)
def test_an_invalid_env_var_name_is_refused_by_the_dry_run(box: Path, argv: list[str]) -> None:
    one_line_exit_2(boxed_xrun("run", "--dryrun", *argv, box=box), "env var name", "[A-Za-z_]")


def test_an_invalid_env_var_name_in_yaml_or_a_run_option(box: Path) -> None:
    path = spec(box, ROLE + '  env: {"BAD=NAME": v}\n')
    one_line_exit_2(boxed_xrun("run", "--dryrun", path, box=box), "'BAD=NAME'", "env var name")
    # a real run is refused the same way, before anything is started
    one_line_exit_2(boxed_xrun("run", path, box=box), "'BAD=NAME'")
    assert not (box / "state" / "xrun" / "local_cwd" / "index").exists()
    r = boxed_xrun("run", "--dryrun", "-s", "docker", "-cfg", "env=A B:1", "utils.echo", box=box)
    one_line_exit_2(r, "run option env", "'A B'")


# --------------------------------------------------------------------------- rdzv conf
@pytest.mark.parametrize(
    "conf, why",
    [
        ("join_timeout=abc", "join_timeout='abc'"),
        ("join_timeout=-5", "join_timeout='-5'"),
        ("bogus_key=1", "'bogus_key' is not known"),
        ("is_host=maybe", "is_host='maybe'"),
        ("heartbeat_interval=20,heartbeat_timeout=10", "must be smaller"),
        ("token=secret", "secret on the command line"),
    ],
)
def test_rdzv_conf_is_checked_by_the_runtimes_parser_at_component_time(
    box: Path, conf: str, why: str
) -> None:
    r = boxed_xrun("run", "--dryrun", "dist.ddp", "--script", "s.py", "--rdzv_conf", conf, box=box)
    line = one_line_exit_2(r, "dist.ddp: --rdzv-conf", why)
    assert line.count("dist.ddp:") == 1
