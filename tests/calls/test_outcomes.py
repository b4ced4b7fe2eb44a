"""What a call's folder says once workers of several attempts wrote into it, read as
``Job.result()`` reads it: the real worker (``xrun.calls.worker.main``, in this process, with
the environment an agent gives each rank) writes the files; the scheduler's word on the job is
a stand-in that says how it ended (an elastic shrink, a lost node replaced by a spare, an NFS
mount that shows a file late: no local scheduler makes these on demand).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

import xrun.calls.job as job_mod
from xrun.calls import worker
from xrun.calls.files import CALL_FILE, DEFAULT_MAX_BYTES, dump, place_file
from xrun.calls.job import CallFailedError, Job
from xrun.calls.submit import _payload
from xrun.specs import AppState, AppStatus

pytestmark = pytest.mark.timeout(300)

HANDLE = "local_cwd://t/call-1"
# A job whose folder this host may see through NFS, written from another host (a late outcome).
SLURM_HANDLE = "slurm://t/1234"


def on_rank(fail_rank: int = -1) -> str:
    """Runs in the worker: says which rank of which attempt it was; rank ``fail_rank`` raises."""
    rank, world, rnd = os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["XRUN_ROUND"]
    if int(rank) == fail_rank:
        raise ValueError(f"rank {rank} of {world} failed in round {rnd}")
    return f"rank {rank} of {world} in round {rnd}"


class Scheduler:
    """The runner's answer about the job: ended (or running) as ``state``; ``asked`` is set
    once Job has asked."""

    def __init__(self, state: AppState) -> None:
        self.answer = AppStatus(state, msg="" if state == AppState.SUCCEEDED else "as told")
        self.asked = threading.Event()

    def status(self, handle: str) -> AppStatus:
        self.asked.set()
        return self.answer

    def wait(
        self, handle: str, wait_interval: float = 1, timeout: float | None = None
    ) -> AppStatus:
        self.asked.set()
        return self.answer


def make_call(tmp_path: Path, fail_rank: int = -1, all_ranks: bool = False) -> Path:
    folder = tmp_path / "call"
    folder.mkdir()
    payload = _payload(on_rank, all_ranks, args=(fail_rank,), kwargs={})
    dump(payload, folder / CALL_FILE, DEFAULT_MAX_BYTES, "the call")
    return folder


def work(
    mp: pytest.MonkeyPatch, folder: Path, rank: int, world: int, rnd: int, requeues: int = 0
) -> int:
    """Rank ``rank`` of a world of ``world`` in rendezvous round ``rnd`` of the job's Slurm
    attempt ``requeues`` (0: none), as the agent starts it (nproc_per_node 1: replica = rank);
    its exit code."""
    for name in ("SLURM_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT", "XRUN_STOP_DIR"):
        mp.delenv(name, raising=False)
    mp.delenv("XRUN_TRIAL_INDEX", raising=False)
    env = {"RANK": rank, "LOCAL_RANK": 0, "WORLD_SIZE": world, "XRUN_ROUND": rnd}
    if requeues:
        env["SLURM_RESTART_COUNT"] = requeues
    for name, value in env.items():
        mp.setenv(name, str(value))
    return worker.main([str(folder), str(DEFAULT_MAX_BYTES), str(rank)])


def job(state: AppState, folder: Path, handle: str = HANDLE, **kw: object) -> Job[object]:
    return Job(Scheduler(state), handle, folder, "call", **kw)  # type: ignore[arg-type]


# ------------------------------------------------------------------ an earlier attempt's outcome
def test_an_earlier_attempts_error_is_not_the_end_of_a_job_that_shrank_and_succeeded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = make_call(tmp_path, fail_rank=1)
    assert work(monkeypatch, folder, rank=1, world=2, rnd=0) == 1  # raised; then its node left
    assert work(monkeypatch, folder, rank=0, world=1, rnd=1) == 0  # re-formed without it
    done = job(AppState.SUCCEEDED, folder, nproc_per_node=1)
    assert done.exception() is None
    assert done.result() == "rank 0 of 1 in round 1"
    # Attached from elsewhere, as after a restart of the notebook: the same answer.
    assert job(AppState.SUCCEEDED, folder).result() == "rank 0 of 1 in round 1"


def test_all_ranks_gives_the_final_attempts_ranks_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = make_call(tmp_path, all_ranks=True)
    assert work(monkeypatch, folder, rank=1, world=2, rnd=0) == 0  # done; rank 0 then lost
    assert work(monkeypatch, folder, rank=0, world=1, rnd=1) == 0
    done = job(AppState.SUCCEEDED, folder, all_ranks=True)
    assert done.result() == ["rank 0 of 1 in round 1"]


def test_an_early_result_waits_for_every_rank_of_one_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fixed world of 2 whose lost node a spare replaced (a new round, the same world): rank 1
    had returned in round 0; round 1's rank 0 alone is no complete outcome."""
    folder = make_call(tmp_path, all_ranks=True)
    assert work(monkeypatch, folder, rank=1, world=2, rnd=0) == 0
    assert work(monkeypatch, folder, rank=0, world=2, rnd=1) == 0
    running = job(AppState.RUNNING, folder, all_ranks=True, world=2, early=True)
    with pytest.raises(TimeoutError, match="has no outcome after"):
        running.result(timeout=1)
    assert work(monkeypatch, folder, rank=1, world=2, rnd=1) == 0
    assert running.result(timeout=60) == ["rank 0 of 2 in round 1", "rank 1 of 2 in round 1"]


def test_all_ranks_with_a_rank_missing_is_an_error_not_a_short_list(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(job_mod, "OUTCOME_LAG_S", 0.5, raising=False)
    folder = make_call(tmp_path, all_ranks=True)
    assert work(monkeypatch, folder, rank=0, world=2, rnd=0) == 0  # rank 1 wrote nothing
    with pytest.raises(CallFailedError, match=r"rank\(s\) 1 wrote no outcome"):
        job(AppState.SUCCEEDED, folder, all_ranks=True).result()


def test_a_requeued_jobs_attempt_comes_after_every_round_of_the_one_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Slurm requeue starts a new rendezvous (c10d: round 0 again): its outcomes count, not
    those of the attempt before, however many rounds that one had."""
    folder = make_call(tmp_path, all_ranks=True)
    assert work(monkeypatch, folder, rank=0, world=2, rnd=3) == 0
    assert work(monkeypatch, folder, rank=1, world=2, rnd=3) == 0
    assert work(monkeypatch, folder, rank=0, world=1, rnd=0, requeues=1) == 0
    done = job(AppState.SUCCEEDED, folder, all_ranks=True)
    assert done.result() == ["rank 0 of 1 in round 0"]


# ------------------------------------------------------------------ an outcome seen late (NFS)
@pytest.mark.parametrize("state", [AppState.SUCCEEDED, AppState.FAILED])
def test_an_outcome_this_host_sees_after_the_end_still_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: AppState
) -> None:
    """NFS (Slurm: the workers on other hosts): the scheduler says the job ended before this
    host sees the outcome file, rank 0's value or its error."""
    monkeypatch.setattr(job_mod, "OUTCOME_LAG_S", 120.0, raising=False)  # a loaded machine
    failed = state == AppState.FAILED
    folder = make_call(tmp_path, fail_rank=0 if failed else -1)
    done = job(state, folder, SLURM_HANDLE)
    codes: list[int] = []

    def shows_late() -> None:
        done._runner.asked.wait(120)  # type: ignore[attr-defined]
        time.sleep(2.0)  # the lag itself: the file shows this long after the end
        codes.append(work(monkeypatch, folder, rank=0, world=1, rnd=0))

    writer = threading.Thread(target=shows_late)
    writer.start()
    try:
        exc = done.exception()
    finally:
        writer.join(120)
    assert codes == [1 if failed else 0]
    if failed:
        assert isinstance(exc, ValueError) and "rank 0 of 1 failed in round 0" in str(exc)
    else:
        assert exc is None
        assert done.result() == "rank 0 of 1 in round 0"


def test_a_missing_outcome_is_looked_for_a_bounded_time_and_only_when_owed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = make_call(tmp_path)
    monkeypatch.setattr(job_mod, "OUTCOME_LAG_S", 1.0, raising=False)
    t0 = time.monotonic()
    exc = job(AppState.SUCCEEDED, folder, SLURM_HANDLE).exception()
    assert isinstance(exc, CallFailedError) and "rank 0 wrote no outcome" in str(exc)
    assert "looked again for 1 s" in str(exc)
    assert time.monotonic() - t0 >= 1.0  # looked again, then gave up
    # Nothing owed (cancelled), or the outcome there: no wait at all.
    monkeypatch.setattr(job_mod, "OUTCOME_LAG_S", 600.0, raising=False)
    t0 = time.monotonic()
    cancelled = job(AppState.CANCELLED, folder, SLURM_HANDLE).exception()
    assert isinstance(cancelled, CallFailedError) and "ended CANCELLED" in str(cancelled)
    assert work(monkeypatch, folder, rank=0, world=1, rnd=0) == 0
    assert job(AppState.SUCCEEDED, folder, SLURM_HANDLE).result() == "rank 0 of 1 in round 0"
    assert time.monotonic() - t0 < 300


@pytest.mark.parametrize("handle", ["local_cwd://t/call-1", "docker://t/call-1"])
@pytest.mark.parametrize("state", [AppState.FAILED, AppState.SUCCEEDED])
def test_a_one_host_job_that_ended_without_its_outcome_is_answered_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, handle: str, state: AppState
) -> None:
    """local_cwd and docker: the workers wrote on this host, so a job that ended without its
    outcome (an OOM kill, a segfault) has none coming; no look again for a late one."""
    monkeypatch.setattr(job_mod, "OUTCOME_LAG_S", 60.0, raising=False)
    folder = make_call(tmp_path)
    t0 = time.monotonic()
    exc = job(state, folder, handle).exception()
    elapsed = time.monotonic() - t0
    assert isinstance(exc, CallFailedError) and f"ended {state.name}" in str(exc)
    assert "looked again" not in str(exc)
    assert elapsed < 30, f"waited {elapsed:.1f} s for an outcome no host will write"


def test_the_look_for_a_late_outcome_ends_at_the_callers_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller's timeout shorter than the lag: TimeoutError at the timeout (the outcome not
    known yet), and a later call goes on looking within the same lag."""
    monkeypatch.setattr(job_mod, "OUTCOME_LAG_S", 120.0, raising=False)
    folder = make_call(tmp_path, fail_rank=0)
    failed = job(AppState.FAILED, folder, SLURM_HANDLE)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="ended FAILED, its outcome not seen after 1 s"):
        failed.exception(timeout=1)
    elapsed = time.monotonic() - t0
    assert 1.0 <= elapsed < 60, f"a timeout of 1 s returned after {elapsed:.1f} s"
    assert work(monkeypatch, folder, rank=0, world=1, rnd=0) == 1  # its error shows up now
    exc = failed.exception(timeout=60)
    assert isinstance(exc, ValueError) and "rank 0 of 1 failed in round 0" in str(exc)


# ------------------------------------------------------------------ the place file
def test_the_place_file_is_replaced_whole_not_rewritten_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader that opened the last place file keeps reading it whole: the worker writes a
    new file and renames it over (seen here through a second link to the old one)."""
    folder = make_call(tmp_path)
    old = tmp_path / "old-place"
    old.write_text("1 0\n")
    os.link(old, place_file(folder, 0))
    assert work(monkeypatch, folder, rank=0, world=1, rnd=0) == 0
    assert place_file(folder, 0).read_text() == "0 0\n"
    assert old.read_text() == "1 0\n"
    assert os.stat(old).st_ino != os.stat(place_file(folder, 0)).st_ino
    assert [n for n in os.listdir(folder) if n.endswith(".tmp")] == []


# ------------------------------------------------------------------ a call folder of an older xrun
def test_outcomes_an_older_xrun_wrote_into_the_call_folder_still_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job dir from before attempt folders (or a worker whose image has an older xrun): the
    outcomes lie in the call's folder itself, ``outcome.<RANK>.pkl``. Read as before, not taken
    for a job that wrote none."""
    monkeypatch.setattr(job_mod, "OUTCOME_LAG_S", 0.5, raising=False)
    folder = make_call(tmp_path, all_ranks=True)
    for rank in (0, 1):
        out = ("ok", f"rank {rank} of 2, written flat")
        dump(out, folder / f"outcome.{rank}.pkl", DEFAULT_MAX_BYTES, "the result")
    assert job(AppState.SUCCEEDED, folder, all_ranks=True).result() == [
        "rank 0 of 2, written flat",
        "rank 1 of 2, written flat",
    ]
    assert job(AppState.SUCCEEDED, folder).result() == "rank 0 of 2, written flat"
    failed = ("error", ValueError("flat failure"), "Traceback: ...\n", 1)
    dump(failed, folder / "outcome.1.pkl", DEFAULT_MAX_BYTES, "the exception")
    exc = job(AppState.FAILED, folder).exception()
    assert isinstance(exc, ValueError) and "flat failure" in str(exc)
    # Once a worker of this xrun started, its attempt's outcomes are the ones that count.
    assert work(monkeypatch, folder, rank=0, world=1, rnd=0) == 0
    assert job(AppState.SUCCEEDED, folder, all_ranks=True).result() == ["rank 0 of 1 in round 0"]
