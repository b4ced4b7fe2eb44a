"""The guard of issue #17 (hypothesis): for ANY input the CLI ends with exit 0, 1 or 2, prints
no traceback, gives a usage error in one line, returns within a few seconds and uses bounded
memory.

Four input families, each through ``xrun run --dryrun`` in-process (``xrun.cli.main``, streams
captured): the ``-j`` grammar, a component's arguments, ``-cfg`` run options of each scheduler,
and saved YAML AppDefs of any shape. Numbers are drawn around the documented limits, past
Python's int-string limit, in other scripts' digits, NaN and infinities. Time and memory are
checked for every example: CPU-time and wall-clock timers stop a run that takes too long (an unbounded loop
fails the test instead of hanging the suite) and tracemalloc's peak bounds what one input may
allocate (the request for 10^20 replicas used to grow by 8 MB/s).
"""

from __future__ import annotations

import contextlib
import io
import signal
import tempfile
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from xrun.cli import main

# A dry run takes milliseconds; a few seconds of its own CPU is a loop, not a slow machine.
# CPU time (ITIMER_PROF), not the clock: on a loaded box (the stress script runs the suite
# beside CPU burners) a cold first dry run under tracemalloc took over 5 s of wall time. The
# clock still bounds a run that blocks without spinning.
TIME_LIMIT_S = 5
WALL_LIMIT_S = 60
# What one dry run may allocate (Python objects, tracemalloc's peak): a few MiB in practice.
MEMORY_LIMIT = 64 * 2**20
GUARD = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=False,
)
_TMP = Path(tempfile.mkdtemp(prefix="xrun-guard-"))
(_TMP / "s.py").write_text("print('hi')\n")


class _TooSlow(Exception):
    pass


@contextlib.contextmanager
def _bounded() -> Iterator[None]:
    """Fail if the block runs over TIME_LIMIT_S or allocates over MEMORY_LIMIT at its peak."""

    def cpu(signum: int, frame: FrameType | None) -> None:
        raise _TooSlow(f"over {TIME_LIMIT_S}s of CPU")

    def wall(signum: int, frame: FrameType | None) -> None:
        raise _TooSlow(f"over {WALL_LIMIT_S}s")

    old_prof = signal.signal(signal.SIGPROF, cpu)
    old_alrm = signal.signal(signal.SIGALRM, wall)
    signal.setitimer(signal.ITIMER_PROF, TIME_LIMIT_S)
    signal.setitimer(signal.ITIMER_REAL, WALL_LIMIT_S)
    tracemalloc.start()
    try:
        yield
        peak = tracemalloc.get_traced_memory()[1]
        assert peak < MEMORY_LIMIT, f"one dry run allocated {peak / 2**20:.0f} MiB at its peak"
    finally:
        tracemalloc.stop()
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGPROF, old_prof)
        signal.signal(signal.SIGALRM, old_alrm)


def xrun(*argv: str) -> tuple[int, str, str]:
    """``xrun ARGV`` in-process, bounded; asserts the guard's promises and returns the result."""
    out, err = io.StringIO(), io.StringIO()
    with _bounded(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as e:  # argparse's --help
            code = e.code if isinstance(e.code, int) else 2
    stderr = err.getvalue()
    assert code in (0, 1, 2), (argv, code, stderr[-2000:])
    assert "Traceback" not in stderr, (argv, stderr[-2000:])
    if code == 2 and "usage:" not in stderr:  # argparse's own usage errors are two lines
        lines = stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("xrun: error: "), (argv, stderr[-2000:])
        assert len(lines[0]) < 2000, lines[0][:300]  # a 6,000-digit value is named, not repeated
    return code, out.getvalue(), stderr


# --------------------------------------------------------------------------- strategies
HUGE = "9" * 6000  # past Python's int-string limit
_LIMITS = [0, 1, 4096, 4097, 65536, 65537, 10**20]
numbers = st.one_of(
    st.sampled_from([str(n) for n in _LIMITS] + [HUGE, "１", "٣", "-1", "+2", " 3", "0x10"]),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["nan", "inf", "-inf", "1e400", "86401", "1e-300", "", "abc"]),
    st.text(alphabet="0123456789１２x:-+.e ", max_size=10),
)


@st.composite
def j_values(draw: st.DrawFn) -> str:
    shape = draw(st.sampled_from(["{n}", "{a}x{n}", "{a}:{b}x{n}", "{a}x{b}x{n}"]))
    return shape.format(a=draw(numbers), b=draw(numbers), n=draw(numbers))


DDP_FLAGS = [
    "--cpu", "--gpu", "--memMB", "--max_retries", "--rdzv_port", "--tee", "--rdzv_conf",
    "--rdzv_backend", "--env", "--mounts", "--name", "-h",
]  # fmt: skip
_conf_keys = st.sampled_from(
    ["join_timeout", "last_call_timeout", "close_timeout", "timeout", "keep_alive_interval",
     "keep_alive_max_attempt", "is_host", "bogus", ""]
)  # fmt: skip
text = st.text(max_size=20)
flag_values = st.one_of(
    numbers,
    text,
    st.builds(lambda k, v: f"{k}={v}", _conf_keys, numbers),
    st.builds(lambda k, v: f"{k}={v}", st.sampled_from(["A", "BAD=NAME", "A B", "", "1X"]), text),
)

CFG = {
    "local_cwd": ["log_dir", "prepend_cwd", "auto_set_cuda_visible_devices", "stop_grace_s"],
    "docker": ["copy_env", "env", "shm_size", "privileged", "stop_timeout"],
    "slurm": ["partition", "time", "signal", "exclusive", "job_dir", "extra_sbatch_args", "qos"],
}

# YAML values of any shape (what a hand-edited or corrupted saved AppDef may hold).
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**25), max_value=10**25),
    st.sampled_from([65537, 4097, 10**11]),
    st.floats(),
    text,
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.one_of(text, scalars), inner, max_size=3)
    ),
    max_leaves=12,
)
ROLE_FIELDS = [
    "name", "image", "entrypoint", "args", "env", "num_replicas", "min_replicas", "max_retries",
    "retry_policy", "resource", "port_map", "metadata", "mounts", "bogus",
]  # fmt: skip
RESOURCE_FIELDS = ["cpu", "gpu", "memMB", "capabilities", "devices"]


@st.composite
def appdefs(draw: st.DrawFn) -> object:
    """Mostly the right skeleton with wrong or absurd leaves; sometimes anything at all."""
    if draw(st.integers(0, 9)) == 0:
        return draw(values)
    roles = []
    for _ in range(draw(st.integers(0, 2))):
        role: dict[object, object] = {"name": "r", "image": "i", "entrypoint": "echo"}
        for key in draw(st.lists(st.sampled_from(ROLE_FIELDS), max_size=3)):
            role[key] = draw(values)
        if draw(st.booleans()):
            role["resource"] = draw(st.dictionaries(st.sampled_from(RESOURCE_FIELDS), values))
        roles.append(role)
    return {"name": draw(st.one_of(st.just("app"), values)), "roles": roles}


# --------------------------------------------------------------------------- the guard
@GUARD
@given(j_values())
@example("99999999999999999999999999x1")
@example("１x２")
@example(HUGE + "x1")
def test_any_j(j: str) -> None:
    xrun("run", "--dryrun", "-s", "local_cwd", "dist.ddp", "-j", j, "--script", "s.py")


@GUARD
@given(st.lists(st.tuples(st.sampled_from(DDP_FLAGS), flag_values), max_size=3))
@example([("--rdzv_conf", "join_timeout=abc")])
@example([("--rdzv_conf", "9" * 6_000)])  # found by the stress run: quoted back whole
@example([("--env", "A B=1")])
@example([("--memMB", HUGE)])
def test_any_component_arguments(flags: list[tuple[str, str]]) -> None:
    argv = [arg for flag, value in flags for arg in (flag, value)]
    xrun("run", "--dryrun", "-s", "local_cwd", "dist.ddp", *argv, "--script", "s.py")


@GUARD
@given(st.sampled_from(sorted(CFG)), st.data())
@example("local_cwd", None)
def test_any_cfg_value(scheduler: str, data: st.DataObject | None) -> None:
    if data is None:  # the examples
        for cfg in ("stop_grace_s=nan", "stop_grace_s=inf", "log_dir=/proc/nope"):
            xrun("run", "--dryrun", "-s", scheduler, "-cfg", cfg, "utils.echo")
        return
    pairs = data.draw(st.lists(st.tuples(st.sampled_from(CFG[scheduler]), flag_values), max_size=3))
    cfg = ",".join(f"{k}={v}" for k, v in pairs)
    xrun("run", "--dryrun", "-s", scheduler, "-cfg", cfg, "utils.echo")


@GUARD
@given(appdefs())
@example({"name": "x", "roles": 5})
@example({"name": "x", "roles": [{"name": "r", "image": "i", "num_replicas": 99999999999}]})
@example({"name": "x", "roles": [{"name": "r", "image": "i", "env": {"BAD=NAME": "v"}}]})
@example({"name": "x", "roles": [{"name": "r", "image": None}]})  # found by the guard
def test_any_saved_appdef(spec: object) -> None:
    path = _TMP / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, allow_unicode=True))
    for scheduler in ("local_cwd", "docker"):
        xrun("run", "--dryrun", "-s", scheduler, str(path))


@settings(max_examples=30, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_as_a_saved_appdef(data: bytes) -> None:
    path = _TMP / "bytes.yaml"
    path.write_bytes(data)
    xrun("run", "--dryrun", str(path))
