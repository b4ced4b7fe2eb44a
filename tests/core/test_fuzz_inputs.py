"""Fuzzing user inputs (hypothesis): a bad input is ONE line and exit 2, never a traceback.

In-process (``xrun.cli.main(argv)`` with captured streams) for speed; two real subprocess runs at
the end check that the console script behaves the same.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from xrun.cli import main
from xrun.component import analyze, call_component
from xrun.config import load
from xrun.errors import UsageError
from xrun.specs import AppDef, AppHandle, Role, parse_mounts
from xrun.specs.jobspec import JobSize, parse_j

FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# One directory for the whole module: hypothesis reruns a test body many times, and
# function-scoped fixtures would not be reset between examples.
_TMP = Path(tempfile.mkdtemp(prefix="xrun-fuzz-"))


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as e:  # argparse's --help/--version
            code = int(e.code or 0)
    return code, out.getvalue(), err.getvalue()


def assert_usage_error(code: int, err: str, *must_contain: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("xrun: error: "), err
    for text in must_contain:
        assert text in lines[0], (text, lines[0])


# --------------------------------------------------------------------------- -j
def reference_j(text: str) -> JobSize | None:
    """An independent reading of [[MIN:]NNODES x]NPROC (None = invalid), with the documented
    limits: at most 65,536 nodes of 4,096 processes."""
    size = _reference_j(text)
    if size is None or size.nproc_per_node > 4096 or size.max_nnodes > 65536:
        return None
    return size


def _reference_j(text: str) -> JobSize | None:
    nodes, sep, nproc = text.partition("x") if "x" in text else ("", "", text)
    if not nproc.isdigit() or not nproc.isascii() or "x" in nproc or int(nproc) < 1:
        return None
    if not sep:
        return JobSize(1, 1, int(nproc))
    lo, colon, hi = nodes.partition(":")
    if not colon:
        lo = hi = nodes
    if not (lo.isdigit() and hi.isdigit() and lo.isascii() and hi.isascii()):
        return None
    if int(hi) < 1 or int(lo) > int(hi):
        return None
    return JobSize(int(lo), int(hi), int(nproc))


j_text = st.text(alphabet="0123456789x:-+ .aX\n", max_size=8)


@FUZZ
@given(j_text)
@example("x4")
@example("3:2x1")
@example("0:1x4")
@example("1x2:3")
def test_j_grammar_matches_the_reference(text: str) -> None:
    expected = reference_j(text)
    try:
        got = parse_j(text)
    except UsageError as e:
        assert expected is None, (text, expected)
        msg = str(e)
        assert "\n" not in msg and repr(text) in msg and "2x4" in msg
    else:
        assert got == expected


@settings(max_examples=40, deadline=None)
@given(j_text)
def test_j_through_the_cli(text: str) -> None:
    code, out, err = run_cli("run", "--dryrun", "dist.ddp", "--script", "t.py", "-j", text)
    if reference_j(text) is None:
        assert_usage_error(code, err, "-j ")
        assert out == ""
    else:
        assert code == 0 and err == ""


# --------------------------------------------------------------------------- component args
def every_type(  # noqa: PLR0913 - a component under test: one parameter per option
    *rest: str,
    s: str = "",
    i: int = 0,
    f: float = 0.0,
    b: bool = False,
    oi: int | None = None,
    ls: list[str] | None = None,
    li: list[int] | None = None,
    lf: list[float] | None = None,
    d: dict[str, str] | None = None,
) -> AppDef:
    """Echo the parsed values back through metadata."""
    meta = {
        k: repr(v)
        for k, v in dict(rest=rest, s=s, i=i, f=f, b=b, oi=oi, ls=ls, li=li, lf=lf, d=d).items()
    }
    return AppDef(name="t", roles=[Role(name="t", image="", entrypoint="e")], metadata=meta)


EVERY = analyze("fuzz.every_type", every_type)
# Values a command line can carry (no NUL; anything else goes).
arg_text = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=12)


@FUZZ
@given(st.sampled_from(["s", "i", "f", "b", "oi", "ls", "li", "lf", "d"]), arg_text)
def test_any_value_for_any_type_converts_or_names_the_option(name: str, value: str) -> None:
    try:
        app = call_component(EVERY, [f"--{name}", value])
    except UsageError as e:
        msg = str(e)
        assert f"--{name}=" in msg and "fuzz.every_type" in msg
    else:
        assert app.metadata[name] != ""


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.lists(st.from_regex(r"[a-z_-]( ?[a-z_-]){0,4}", fullmatch=True), max_size=4),
    st.lists(st.integers(), max_size=4),
    st.dictionaries(
        st.from_regex(r"[A-Z_][A-Z0-9_]{0,5}", fullmatch=True),
        st.text(alphabet="abc=/:", max_size=6),
        max_size=3,
    ),
    st.lists(arg_text, max_size=3),
)
def test_valid_values_round_trip(
    i: int, f: float, b: bool, ls: list[str], li: list[int], d: dict[str, str], rest: list[str]
) -> None:
    argv = [
        "--i",
        str(i),
        "--f",
        repr(f),
        "--b",
        "yes" if b else "no",
        "--ls",
        ",".join(ls),
        "--li",
        ",".join(map(str, li)),
        "--d",
        ",".join(f"{k}={v}" for k, v in d.items()),
        "--",
        *rest,
    ]
    meta = call_component(EVERY, argv).metadata
    assert meta["i"] == repr(i) and meta["f"] == repr(f) and meta["b"] == repr(b)
    assert meta["ls"] == repr([x.strip() for x in ls]) and meta["li"] == repr(li)
    assert meta["d"] == repr(d) and meta["rest"] == repr(tuple(rest))


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(
        [
            "--cpu",
            "--gpu",
            "--memMB",
            "--debug",
            "--env",
            "--mounts",
            "--tee",
            "--rdzv_port",
            "--max_retries",
            "-h",
            "--name",
        ]
    ),
    arg_text,
)
def test_ddp_options_through_the_cli(flag: str, value: str) -> None:
    code, out, err = run_cli("run", "--dryrun", "dist.ddp", "--script", "t.py", flag, value)
    if code == 0:
        assert err == "" and "xrun.runtime" in out
    else:
        assert_usage_error(code, err)


# --------------------------------------------------------------------------- handles
handle_text = st.one_of(
    arg_text,
    st.builds(
        lambda s, sess, app: f"{s}://{sess}/{app}",
        st.sampled_from(["local_cwd", "slurmm", "", "x y"]),
        st.text(alphabet="ab_-./ ", max_size=5),
        st.text(alphabet="ab_-. :/\n", max_size=8),
    ),
)


@FUZZ
@given(handle_text)
def test_handles(text: str) -> None:
    try:
        h = AppHandle.parse(text)
    except UsageError as e:
        assert "SCHEDULER://SESSION/APP_ID" in str(e)
        parsed = False
    else:
        assert AppHandle.parse(str(h)) == h
        parsed = True
    code, out, err = run_cli("status", "--", text)  # `--`: a text like "-x" is not an option
    assert out == "" and "Traceback" not in err
    if not parsed:
        assert_usage_error(code, err, "malformed app handle")
    else:
        assert code in (1, 2) and len(err.splitlines()) == 1  # not found / unknown scheduler


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet="local_cwd:/ab,01x", max_size=30))
def test_log_targets(text: str) -> None:
    code, out, err = run_cli("log", text)
    assert code in (1, 2) and "Traceback" not in err and len(err.splitlines()) == 1


# --------------------------------------------------------------------------- config files
ini_line = st.one_of(
    st.sampled_from(
        [
            "[local_cwd]",
            "[component:utils.echo]",
            "[cli:run]",
            "[slurmm]",
            "[component:]",
            "msg = hi",
            "num_replicas = 2",
            "num_replicas = two",
            "stop_grace_s = 1.5",
            "stop_grace_s = soon",
            "scheduler = local_cwd",
            "bogus = 1",
            "= x",
            "[",
            "a = %(b)s",
            "  indented = 1",
            "; comment",
        ]
    ),
    arg_text.map(lambda t: t.replace("\n", " ")),
)


@FUZZ
@given(st.lists(ini_line, max_size=8))
def test_config_files(lines: list[str]) -> None:
    from xrun.runner import Runner

    cwd = _TMP / "cfg"
    cwd.mkdir(exist_ok=True)
    (cwd / ".xrunconfig").write_text("\n".join(lines) + "\n", encoding="utf-8")
    try:
        cfg = load(cwd, _TMP / "nohome")
        with Runner(config=cfg) as runner:
            runner.run_cfg("local_cwd", {})
            runner.component_app("utils.echo", [])
    except UsageError as e:
        msg = str(e)
        assert ".xrunconfig" in msg, msg
    except UnicodeEncodeError:  # a surrogate-free but unencodable name: not our concern
        pass


# --------------------------------------------------------------------------- mounts & -cfg
mount_text = st.lists(
    st.one_of(
        st.sampled_from(
            [
                "type=bind",
                "type=volume",
                "type=device",
                "type=nfs",
                "src=/a",
                "dst=/b",
                "readonly",
                "ro=true",
                "perm=rwx",
                "perm=r",
                "bogus",
            ]
        ),
        st.text(alphabet="=,/ab", max_size=6),
    ),
    max_size=5,
).map(",".join)


@FUZZ
@given(mount_text)
def test_mounts(text: str) -> None:
    try:
        mounts = parse_mounts([text])
    except UsageError as e:
        assert "\n" not in str(e) and "mount" in str(e)
        code, _, err = run_cli("run", "--dryrun", "dist.ddp", "--script", "t", "--mounts", text)
        assert_usage_error(code, err, "mount")
    else:
        assert all(m is not None for m in mounts)


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet="log_dir=stop_grace_s,;x1 ", max_size=20))
def test_cfg_option(text: str) -> None:
    code, out, err = run_cli("run", "--dryrun", "-cfg", text, "utils.echo")
    if code != 0:
        assert_usage_error(code, err)


# --------------------------------------------------------------------------- the real script
def test_console_script_on_nasty_inputs() -> None:
    xrun = str(Path(sys.executable).parent / "xrun")
    env = {**os.environ, "HOME": str(_TMP)}
    for argv in (
        ["run", "--dryrun", "dist.ddp", "--script", "t.py", "-j", "1\nx2"],
        ["status", "local_cwd://default/\u00e9\u6f22/x"],
        ["run", "--dryrun", "dist.ddp", "--script", "t.py", "--env", "\u2603"],
    ):
        r = subprocess.run([xrun, *argv], capture_output=True, text=True, env=env, cwd=_TMP)
        assert_usage_error(r.returncode, r.stderr)


# --------------------------------------------------------------------------- dry-run YAML
yaml_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(st.characters(exclude_categories=["Cs"]), max_size=10),
    st.sampled_from(
        [
            "yes",
            "No",
            "on",
            "null",
            "~",
            "1e3",
            ".5",
            "-x",
            "a: b",
            "#c",
            "0x1F",
            "2024-01-01",
            "12:30",
            "'q'",
            "*ref",
            "&a",
            "!tag",
            "[x]",
            "{y}",
            "a b",
        ]
    ),
)
yaml_data = st.recursive(
    yaml_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=12,
)


@FUZZ
@given(yaml_data)
@example(1e-05)  # YAML 1.1 needs "1.0e-05"
@example({"\x7f": None, "\x85": "\u2028"})  # unprintable / line-breaking characters
def test_dryrun_yaml_emitter_round_trips_through_pyyaml(data: object) -> None:
    import yaml

    from xrun.yaml_writer import dump

    assert yaml.safe_load(dump(data)) == data
