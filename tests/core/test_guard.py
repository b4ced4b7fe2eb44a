"""The guard of issue #17 (hypothesis): for ANY input the CLI ends with exit 0, 1 or 2, prints
no traceback, gives a usage error in one line, returns within a few seconds and uses bounded
memory.

Four input families, each through ``xrun run --dryrun`` in-process (``xrun.cli.main``, streams
captured): the ``-j`` grammar, a component's arguments, ``-cfg`` run options of each scheduler,
and saved YAML AppDefs of any shape. Numbers are drawn around the documented limits, past
Python's int-string limit, in other scripts' digits, NaN and infinities. Time and memory are
checked for every example: CPU-time and wall-clock timers stop a run that takes too long (an unbounded loop
fails the test instead of hanging the suite) and tracemalloc's peak bounds what one input may
allocate (the request for 10^20 replicas used to grow by 8 MB/s). The bounds are flat, plus a
fixed allowance per replica for a ``-j`` that legitimately asks for many (up to the documented
65,536 nodes): bounded means proportional to what the limits allow, not unbounded.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
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
from xrun.contract import MAX_NODES, MAX_REPLICAS

# A dry run takes milliseconds; a few seconds of its own CPU is a loop, not a slow machine.
# CPU time (ITIMER_PROF), not the clock: on a loaded box (the stress script runs the suite
# beside CPU burners) a cold first dry run under tracemalloc took over 5 s of wall time. The
# clock still bounds a run that blocks without spinning.
TIME_LIMIT_S = 5
WALL_LIMIT_S = 60
# What one dry run may allocate (Python objects, tracemalloc's peak): a few MiB in practice.
MEMORY_LIMIT = 64 * 2**20
# A dry run of N replicas builds (and prints) N replica requests: measured under tracemalloc on
# a quiet box (2026-11-24), 0.12 ms of CPU and 3.8 KiB each; -j 65536x1 (the limit) 7.7 s and
# 240 MiB. The flat bounds above wrongly failed such inputs (-j 4096x1 went over 5 s of CPU on a
# loaded box in a stress run). Allowances of 4-8x that, for a loaded box: a loop, or work that
# grows past the limits, still fails.
PER_REPLICA_CPU_S = 0.001
PER_REPLICA_WALL_S = 0.003
PER_REPLICA_MEMORY = 16 * 2**10
GUARD = settings(
    # A hunt: XRUN_HYPOTHESIS=hunt XRUN_GUARD_EXAMPLES=1000 (fresh random examples; see
    # tests/conftest.py). The suite draws the same 60 each run, so CI's verdict is the code's.
    max_examples=int(os.environ.get("XRUN_GUARD_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
_TMP = Path(tempfile.mkdtemp(prefix="xrun-guard-"))
(_TMP / "s.py").write_text("print('hi')\n")


class _TooSlow(Exception):
    pass


def replicas_asked(j: str) -> int:
    """How many replicas a well-formed ``-j [MIN:]NxM`` within the limits asks for (the
    bounds grow by that many allowances); 0 for anything else, which gets the flat bounds."""
    m = re.fullmatch(r"(?:[0-9]+:)?0*([0-9]{1,6})x[0-9]+", j)
    return int(m.group(1)) if m and int(m.group(1)) <= MAX_NODES else 0


@contextlib.contextmanager
def _bounded(replicas: int = 0) -> Iterator[None]:
    """Fail if the block runs over its CPU or wall-clock time, or allocates over its memory at
    its peak: the flat limits plus ``replicas`` per-replica allowances."""
    cpu_s = TIME_LIMIT_S + replicas * PER_REPLICA_CPU_S
    wall_s = WALL_LIMIT_S + replicas * PER_REPLICA_WALL_S
    memory = MEMORY_LIMIT + replicas * PER_REPLICA_MEMORY

    def cpu(signum: int, frame: FrameType | None) -> None:
        raise _TooSlow(f"over {cpu_s:g}s of CPU")

    def wall(signum: int, frame: FrameType | None) -> None:
        raise _TooSlow(f"over {wall_s:g}s")

    old_prof = signal.signal(signal.SIGPROF, cpu)
    old_alrm = signal.signal(signal.SIGALRM, wall)
    signal.setitimer(signal.ITIMER_PROF, cpu_s)
    signal.setitimer(signal.ITIMER_REAL, wall_s)
    tracemalloc.start()
    try:
        yield
        peak = tracemalloc.get_traced_memory()[1]
        assert peak < memory, f"one dry run allocated {peak / 2**20:.0f} MiB at its peak"
    finally:
        tracemalloc.stop()
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGPROF, old_prof)
        signal.signal(signal.SIGALRM, old_alrm)


def xrun(*argv: str, replicas: int = 0) -> tuple[int, str, str]:
    """``xrun ARGV`` in-process, bounded (see ``_bounded``); asserts the guard's promises and
    returns the result."""
    out, err = io.StringIO(), io.StringIO()
    with _bounded(replicas), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
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
@example(f"{MAX_NODES}x1")  # at the limit: accepted, within the per-replica allowance
@example("4096x4096")  # found by the stress runs: over the flat 5 s of CPU on a loaded box
def test_any_j(j: str) -> None:
    argv = ("run", "--dryrun", "-s", "local_cwd", "dist.ddp", "-j", j, "--script", "s.py")
    xrun(*argv, replicas=replicas_asked(j))


def test_replicas_in_counts_only_integer_num_replicas_within_the_limit() -> None:
    role = {"name": "r", "image": "i"}
    spec = {"roles": [{**role, "num_replicas": 4097}, {**role, "num_replicas": 3}, role]}
    assert replicas_in(spec) == 4100
    bad = [{**role, "num_replicas": v} for v in (65537, 10**11, "4", True, -2, 2.0)]
    assert [replicas_in(s) for s in ({"roles": bad}, {"roles": 5}, [1], None)] == [0] * 4


def test_replicas_asked_reads_only_well_formed_j_within_the_limits() -> None:
    good = {"4": 0, "2x4": 2, "1:3x8": 3, "65536x1": 65536, "0065536x2": 65536}
    assert {j: replicas_asked(j) for j in good} == good
    bad = ["65537x1", "9" * 30 + "x1", "１x２", "2x3x4", ""]
    assert [replicas_asked(j) for j in bad] == [0] * len(bad)


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
        xrun("run", "--dryrun", "-s", scheduler, str(path), replicas=replicas_in(spec))


def replicas_in(spec: object) -> int:
    """How many replicas a saved AppDef's roles legitimately ask for: each integer
    ``num_replicas`` within the limit counts (the bounds grow by that many allowances)."""
    if not isinstance(spec, dict) or not isinstance(spec.get("roles"), list):
        return 0
    counts = [r.get("num_replicas") for r in spec["roles"] if isinstance(r, dict)]
    return sum(n for n in counts if type(n) is int and 0 < n <= MAX_REPLICAS)


@settings(max_examples=30, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_as_a_saved_appdef(data: bytes) -> None:
    path = _TMP / "bytes.yaml"
    path.write_bytes(data)
    xrun("run", "--dryrun", str(path))
