"""``xrun.submit`` on local_cwd, for real: each call a job of xrun's runtime agent, its workers
running ``python3 -m xrun.calls.worker``; and the in-process debug mode.

The jobs run in the test's tmp dir (local_cwd runs in the cwd), where this test module cannot
be imported: a function of this module reaches the workers only by value.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import xrun
from xrun.calls.files import TooLargeError, attempt_dir, latest_attempt, outcome_file
from xrun.calls.job import CallFailedError, DebugJob, Job
from xrun.errors import UsageError
from xrun.specs import AppState

pytestmark = pytest.mark.timeout(300)


@dataclasses.dataclass
class Point:
    x: int
    y: int


class BoomError(ValueError):
    pass


def where(tag: str) -> dict[str, object]:
    """Runs in the job: what the worker sees, and whether this module came by value."""
    print(f"hello {tag} from rank {os.environ['RANK']}", flush=True)
    return {
        "tag": tag,
        "rank": int(os.environ["RANK"]),
        "world": int(os.environ["WORLD_SIZE"]),
        "local_rank": int(os.environ["LOCAL_RANK"]),
        "pid": os.getpid(),
        "imported_by_reference": __name__ in sys.modules,
        "point": Point(1, 2),
    }


def boom(batch: int) -> None:
    data = [batch]
    if data:
        raise BoomError(f"bad shape in batch {batch}")


def outcome(folder: Path, rank: int) -> Path:
    """Rank ``rank``'s outcome file in the call's latest attempt."""
    attempt = latest_attempt(folder)
    assert attempt is not None, f"no attempt started in {folder}"
    return outcome_file(attempt_dir(folder, attempt), rank)


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


def test_a_module_function_returns_its_value_from_another_process(tmp_path: Path) -> None:
    job = xrun.submit(where, "one", folder=tmp_path / "calls")
    assert isinstance(job, Job) and job.handle.startswith("local_cwd://")
    out = job.result()
    assert out["tag"] == "one" and (out["rank"], out["world"]) == (0, 1)
    assert out["pid"] != os.getpid()
    # Not imported in the worker (it cannot be from the tmp dir): it came by value.
    assert out["imported_by_reference"] is False
    # A class of this module comes back as the class itself (cloudpickle's class tracking).
    assert out["point"] == Point(1, 2) and type(out["point"]) is Point
    assert job.wait(timeout=120).state == AppState.SUCCEEDED
    assert job.exception() is None
    assert "hello one from rank 0\n" in job.stdout()
    assert job.folder.parent == tmp_path / "calls"


def test_a_lambda_and_a_closure_are_pickled_by_value(tmp_path: Path) -> None:
    k = 7

    def times_k(x: int) -> int:
        return x * k

    jobs = [
        xrun.submit(lambda a, b=0: (a + b, os.environ["WORLD_SIZE"]), 40, kwargs={"b": 2}),
        xrun.submit(times_k, 6),
    ]
    assert jobs[0].result() == (42, "1")
    assert jobs[1].result() == 42


def test_an_exception_comes_back_with_the_remote_traceback() -> None:
    job = xrun.submit(boom, 3)
    with pytest.raises(BoomError, match="bad shape in batch 3") as info:
        job.result()
    tb = info.value.remote_traceback  # type: ignore[attr-defined]
    # The frame names this file and shows its line, though the function came by value.
    assert f'File "{__file__}", line' in tb and "in boom" in tb
    assert 'raise BoomError(f"bad shape in batch {batch}")' in tb
    assert tb.rstrip().endswith("BoomError: bad shape in batch 3")
    assert any("remote traceback" in n and "in boom" in n for n in info.value.__notes__)
    exc = job.exception()
    assert isinstance(exc, BoomError) and exc is not info.value
    assert job.wait(timeout=120).state == AppState.FAILED  # the outcome came first
    # The worker printed it too, and the agent named it as the root cause.
    assert "BoomError: bad shape in batch 3" in job.stderr()
    cause = r"root cause: \S*BoomError: bad shape in batch 3 \(rank 0, test_submit_local\.py:\d+\)"
    assert re.search(cause, job.stderr())


class Raiser:
    def __call__(self) -> None:
        self.fail()

    def fail(self) -> None:
        raise BoomError("from a method")


def test_a_callable_objects_traceback_names_its_file_too() -> None:
    exc = xrun.submit(Raiser()).exception()
    assert isinstance(exc, BoomError)
    tb = exc.remote_traceback  # type: ignore[attr-defined]
    assert f'File "{__file__}", line' in tb and "in fail" in tb and "<dynamic-code>" not in tb


def test_two_nodes_of_two_run_the_call_on_every_rank() -> None:
    job = xrun.submit(where, "dist", j="2x2", all_ranks=True)
    out = job.result()
    assert [o["rank"] for o in out] == [0, 1, 2, 3]
    assert {o["world"] for o in out} == {4}
    assert sorted(o["local_rank"] for o in out) == [0, 0, 1, 1]
    assert len({o["pid"] for o in out}) == 4
    # result() came with the outcome files; the logs are whole once the job has ended.
    assert job.wait(timeout=120).state == AppState.SUCCEEDED
    for rank in range(4):
        assert f"hello dist from rank {rank}\n" in job.stdout(rank)
    # Without all_ranks: rank 0's value only, and only rank 0 writes one.
    job0 = xrun.submit(where, "zero", j="1x2")
    assert job0.result()["rank"] == 0
    assert job0.wait().state == AppState.SUCCEEDED
    assert outcome(job0.folder, 0).exists() and not outcome(job0.folder, 1).exists()


def sleeper(marker: str) -> str:
    Path(marker).write_text("started")
    time.sleep(600)
    return "never"


def test_cancel_ends_the_job_and_result_says_so(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    job = xrun.submit(sleeper, str(marker))
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert time.monotonic() < deadline, "the call never started"
        time.sleep(0.2)
    assert job.status() == AppState.RUNNING
    t0 = time.monotonic()
    job.cancel()
    assert job.wait(timeout=120).state == AppState.CANCELLED
    assert time.monotonic() - t0 < 120
    with pytest.raises(CallFailedError, match="ended CANCELLED"):
        job.result()


def flaky(marker: str) -> str:
    if not Path(marker).exists():
        Path(marker).write_text("first attempt")
        raise RuntimeError("first attempt fails")
    return f"attempt {os.environ.get('TORCHELASTIC_RESTART_COUNT')}"


def test_max_retries_calls_a_failed_function_again(tmp_path: Path) -> None:
    job = xrun.submit(flaky, str(tmp_path / "m1"), max_retries=1)
    assert job.result() == "attempt 1"
    once = xrun.submit(flaky, str(tmp_path / "m2"))
    with pytest.raises(RuntimeError, match="first attempt fails"):
        once.result()


def big(n: int) -> bytes:
    return b"x" * n


def test_a_result_over_the_limit_is_a_clear_error_and_no_big_file() -> None:
    job = xrun.submit(big, 1 << 20, max_result_bytes=64 << 10)
    with pytest.raises(TooLargeError, match=r"result of rank 0 .* over the limit of 64 KiB"):
        job.result()
    assert outcome(job.folder, 0).stat().st_size < 64 << 10
    with pytest.raises(UsageError, match="over the limit of 64 KiB"):
        xrun.submit(big, b"y" * (1 << 20), max_result_bytes=64 << 10)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: xrun.submit(42), r"fn 42 \(a int\) is not callable"),
        (lambda: xrun.submit(big, 1, j="2y"), r"-j '?2y'? is invalid"),
        (lambda: xrun.submit(big, 1, j="0x1"), r"-j '?0x1'? is invalid: NNODES must be >= 1"),
        (lambda: xrun.submit(big, 1, cpus=3), r"unknown option\(s\) cpus; expected .*cpu"),
        (lambda: xrun.submit(big, 1, max_result_bytes=0), "max_result_bytes=0 is invalid"),
        (lambda: xrun.submit(big, 1, scheduler="debug", j="2x2"), "j='2x2'"),
        (lambda: xrun.submit(big, 1, scheduler="nosuch"), "nosuch"),
    ],
)
def test_bad_input_is_a_usage_error_naming_it(call, match: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(UsageError, match=match):
        call()


def test_debug_mode_calls_in_this_process_when_asked() -> None:
    calls: list[int] = []

    def record(x: int) -> int:
        calls.append(x)
        print("debug print")
        return x + 1

    job = xrun.submit(record, 1, scheduler="debug")
    assert isinstance(job, DebugJob)
    assert calls == [] and job.status() == AppState.PENDING  # submitit's: run on result()
    assert job.result() == 2 and calls == [1]  # in this process: the list is ours
    assert job.result() == 2 and calls == [1]  # once
    assert job.status() == AppState.SUCCEEDED and job.stdout() == "debug print\n"
    failing = xrun.submit(boom, 5, scheduler="debug")
    exc = failing.exception()
    assert isinstance(exc, BoomError) and "in boom" in exc.remote_traceback  # type: ignore[attr-defined]
    with pytest.raises(BoomError):
        failing.result()
    cancelled = xrun.submit(record, 9, scheduler="debug")
    cancelled.cancel()
    assert cancelled.status() == AppState.CANCELLED and calls == [1]
    with pytest.raises(CallFailedError):
        cancelled.result()


def test_import_xrun_stays_light() -> None:
    code = (
        "import sys, xrun\n"
        "heavy = [m for m in ('cloudpickle', 'xrun.calls', 'xrun.runner', 'typing')\n"
        "         if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "assert callable(xrun.submit) and 'xrun.calls.submit' in sys.modules\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout == "ok\n", out.stderr


class Resumable:
    """submitit's Checkpointable: ``checkpoint`` says what the next attempt calls."""

    def __init__(self) -> None:
        self.checkpoints = 0

    def __call__(self, folder: str) -> int:
        pid_file = Path(folder, "pid")
        if self.checkpoints == 0:
            if pid_file.exists():
                raise RuntimeError("retried without the checkpoint")
            pid_file.write_text(str(os.getpid()))
            time.sleep(600)  # the test stops this worker with SIGTERM
        return self.checkpoints

    def checkpoint(self, folder: str) -> tuple[Resumable, tuple[str], dict[str, object]]:
        self.checkpoints += 1
        return self, (folder,), {}


def test_a_stopped_call_is_checkpointed_and_the_retry_resumes(tmp_path: Path) -> None:
    job = xrun.submit(Resumable(), str(tmp_path), max_retries=1)
    deadline = time.monotonic() + 120
    while not (tmp_path / "pid").exists():
        assert time.monotonic() < deadline, "the call never started"
        time.sleep(0.2)
    # The worker set its SIGTERM handler before the call wrote its pid.
    os.kill(int((tmp_path / "pid").read_text()), signal.SIGTERM)
    assert job.result(timeout=200) == 1
    assert "checkpointed on signal 15" in job.stderr()


def test_map_array_is_one_submission_with_one_job_per_call() -> None:
    jobs = xrun.map_array(where, ["a", "b", "c"], j="1x1")
    assert len(jobs) == 3
    sweeps = {j.handle.rsplit("/", 1)[0] for j in jobs}
    assert len(sweeps) == 1  # one sweep: its trials are the calls
    assert [j.handle.rsplit("/", 1)[1] for j in jobs] == ["0", "1", "2"]
    assert [j.result()["tag"] for j in jobs] == ["a", "b", "c"]
    assert jobs[1].wait(timeout=120).state == AppState.SUCCEEDED
    assert "hello b from rank 0\n" in jobs[1].stdout()
    assert xrun.map_array(where, []) == []


def test_an_executor_passes_keyword_arguments_to_the_function() -> None:
    ex = xrun.Executor("local_cwd", j="1x1")
    ex.update_parameters(j="1x2", all_ranks=True, env={"CALL_TAG": "t1"})
    job = ex.submit(lambda a, *, b: (a, b, os.environ["CALL_TAG"], os.environ["RANK"]), 1, b=2)
    assert job.result() == [(1, 2, "t1", "0"), (1, 2, "t1", "1")]
    with pytest.raises(UsageError, match="unknown option"):
        ex.update_parameters(gpus=1, j="2x2")
    assert ex.j == "1x2" and "gpus" not in ex.options  # unchanged
    dbg = xrun.Executor("debug").map_array(lambda x: x * 3, [1, 2])
    assert [j.result() for j in dbg] == [3, 6]


def test_an_argument_the_job_cannot_import_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A class pickled by reference (its module is importable here, not in the job) makes
    the call unloadable there: the outcome says so, not only a log."""
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "onlyhere_h39.py").write_text("class Thing:\n    pass\n")
    monkeypatch.syspath_prepend(str(mods))
    import onlyhere_h39  # type: ignore[import-not-found]

    job = xrun.submit(repr, onlyhere_h39.Thing())
    with pytest.raises(
        RuntimeError,
        match=r"could not be loaded in the job \(rank 0\): "
        r"ModuleNotFoundError: No module named 'onlyhere_h39'",
    ):
        job.result(timeout=120)


def test_only_the_users_own_modules_are_pickled_by_value() -> None:
    import functools
    import json

    import yaml

    from xrun.calls.submit import _user_module

    assert _user_module(where) is sys.modules[__name__]  # this file: the user's code
    assert _user_module(functools.partial(where, "x")) is sys.modules[__name__]
    assert _user_module(Resumable()) is sys.modules[__name__]  # a callable object: its class's
    assert _user_module(json.dumps) is None  # the standard library: by reference
    assert _user_module(yaml.safe_load) is None  # an installed package: by reference
    assert _user_module(len) is None


def test_another_process_attaches_to_a_call_by_its_folder(tmp_path: Path) -> None:
    """submitit's ``Job(folder, job_id)``: a job is found again later, from another process
    (a notebook restarted), by its call's folder; a map_array call too."""
    job = xrun.submit(where, "later", folder=tmp_path / "calls")
    [mapped] = xrun.map_array(where, ["m"], folder=tmp_path / "calls")
    code = (
        "import sys, xrun\n"
        "for folder in sys.argv[1:]:\n"
        "    job = xrun.Job.attach(folder)\n"
        "    print(job.handle, job.result()['tag'], job.wait(timeout=120).state.name)\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code, str(job.folder), str(mapped.folder)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.splitlines() == [
        f"{job.handle} later SUCCEEDED",
        f"{mapped.handle} m SUCCEEDED",
    ]
    with pytest.raises(UsageError, match=r"is no call's folder \(job.json: No such file"):
        Job.attach(tmp_path)
    (tmp_path / "job.json").write_text("{not json")
    with pytest.raises(UsageError, match=r"is no call's folder \(job.json: JSONDecodeError\)"):
        Job.attach(tmp_path)


class SlowCheckpoint:
    """A Checkpointable whose ``checkpoint`` takes a while and logs each call."""

    def __call__(self, folder: str) -> str:
        Path(folder, "pid").write_text(str(os.getpid()))
        time.sleep(600)  # the test stops this worker
        return "never"

    def checkpoint(self, folder: str) -> None:
        with open(Path(folder, "checkpoints"), "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(2)  # the agent's stop flag comes meanwhile
        return None


def test_a_stop_that_comes_twice_checkpoints_once(tmp_path: Path) -> None:
    """A Slurm preemption signals the worker and its agent at once; the agent then raises its
    stop flag, which the worker turns into a second SIGTERM. ``checkpoint`` runs once."""
    job = xrun.submit(SlowCheckpoint(), str(tmp_path))
    deadline = time.monotonic() + 120
    while not (tmp_path / "pid").exists():
        assert time.monotonic() < deadline, "the call never started"
        time.sleep(0.2)
    os.kill(int((tmp_path / "pid").read_text()), signal.SIGTERM)  # Slurm's signal
    while not (tmp_path / "checkpoints").exists():
        assert time.monotonic() < deadline, "checkpoint was never called"
        time.sleep(0.05)
    job.cancel()  # the agent's stop flag, while checkpoint still runs
    job.wait(timeout=120)
    assert len((tmp_path / "checkpoints").read_text().splitlines()) == 1
