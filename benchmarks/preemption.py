"""Measure 19 (issue #33): real preemptions of a 2-node x 2-worker CPU training job on the suite's
Slurm cluster (partition ``low``: PreemptMode=REQUEUE, GraceTime=60), K times by real jobs on
``high``, with a checkpoint that takes C seconds on purpose, side by side for:

* ``xrun``: ``xrun run -s slurm dist.ddp`` with examples/train_ddp.py's stop recipe
  (``xrun.runtime.stop.requested``); xrun's batch script requeues;
* ``torchrun-sbatch``: torchrun under a hand-written sbatch script
  (workers/torchrun_preempt.sbatch), a SIGTERM handler that sets a flag the ranks all_reduce
  at every step; the script requeues;
* ``submitit``: submitit 1.5.4's checkpoint()/requeue, installed by this module into a venv
  of its own (never the project's), see ``submitit_python``;
* ``lightning``: Lightning 2.5.6's Trainer with its SLURM auto-requeue
  (workers/lightning_preempt.py under workers/lightning_preempt.sbatch), in a venv of its own
  too (``lightning_python``).

The same worker (workers/preempt_train.py: the example's model, data and checkpoint) runs for
every contender (Lightning's: the same as a LightningModule). Per contender: preemptions that ended with a complete checkpoint of one
agreed step (k of K), steps lost per preemption, final parameters bit-identical to an
undisturbed run, logical runs (Slurm job ids), double or lost requeues, seconds from the
preemption to the nodes running the preemptor and from the requeue to the first resumed step.
Slurm holds a requeued job ~120 s (BeginTime = requeue + AuthInfo's cred_expire + 1): the
driver cuts each hold short after HOLD_CUT_S with ``scontrol update StartTime=now`` (as the
tests do) and the last row measures the hold itself.

Sizes: ``--smoke`` K=1, C=2 s, xrun and torchrun-sbatch only; else K=20, C=45 s (the issue's full run: ~20 min per
contender). XRUN_BENCH_PREEMPT_K / _C / _CONTENDERS (comma list) / _HOLD (1: wait out one
natural hold, ~2 min) override them; _USER_SIGNAL=1 runs them with the cluster's
SlurmctldParameters=preempt_send_user_signal (set for the run, taken away after it: the only
change to the shared cluster, the one its tests make too).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import contenders as c
from benchmarks.harness import Row, RunFailed, Stats, Unavailable, one_line, peer_venv

REPO = c.WORKERS.parent.parent
WORKER = c.WORKERS / "preempt_train.py"
SBATCH = c.WORKERS / "torchrun_preempt.sbatch"
LIGHTNING_WORKER = c.WORKERS / "lightning_preempt.py"
LIGHTNING_SBATCH = c.WORKERS / "lightning_preempt.sbatch"
LIGHTNING = "lightning==2.5.6"
LIGHTNING_VENV = Path(os.environ.get("XRUN_BENCH_LIGHTNING_VENV", "/var/tmp/xrun-bench-lightning"))
RECIPE = REPO / "examples" / "train_ddp.py"
SUBMITIT = "submitit==1.5.4"
SUBMITIT_VENV = Path(os.environ.get("XRUN_BENCH_SUBMITIT_VENV", "/var/tmp/xrun-bench-submitit"))
CONTENDERS = ("xrun", "torchrun-sbatch", "submitit", "lightning")
NAME = "bench-preempt"  # job names: never the tests' "preempt-me"/"preemptor" (they scancel those)
STEP_SLEEP = 0.2
STEPS_BEFORE = 5  # steps each attempt trains before the next preemption
GRACE_S = 60  # low's GraceTime (scripts/slurm-cluster.sh)
HOLD_CUT_S = 3.0  # slurmd refuses a job id it killed a moment ago: not at once


@dataclass
class Preemption:
    t: float  # the preemptor's sbatch
    released: float | None = None  # the preemptor started (the nodes were released to it)
    requeued: float | None = None  # the job was seen PENDING again


@dataclass
class Outcome:
    preemptions: list[Preemption] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)
    sha: str | None = None
    restarts: int = 0
    job_ids: set[str] = field(default_factory=set)
    state: str = ""
    trace: list[tuple[float, str, str]] = field(default_factory=list)


# --- slurm ---------------------------------------------------------------------------------------


def _job(job_id: str) -> dict[str, str]:
    out = subprocess.run(
        ["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, timeout=60
    ).stdout
    return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)


def _run(argv: list[str], **kw: object) -> str:
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120, **kw)  # type: ignore[call-overload]
    if p.returncode:
        raise RunFailed(f"{' '.join(argv[:3])}: exit {p.returncode}: {one_line(p.stderr)}")
    return str(p.stdout)


class Driver:
    """Watches one contender's job: cuts Slurm's hold of a requeue, notes when it was requeued."""

    def __init__(self, job_id: str, events: Path) -> None:
        self.job_id, self.events = job_id, events
        self.held_since: float | None = None
        self.last: dict[str, str] = {}
        self.trace: list[tuple[float, str, str]] = []  # (time, JobState, Reason) on each change

    def poll(self, pending: Preemption | None) -> dict[str, str]:
        j = self.last = _job(self.job_id)
        now = time.time()
        seen = (j.get("JobState", "?"), j.get("Reason", "?"))
        if not self.trace or self.trace[-1][1:] != seen:
            self.trace.append((now, *seen))
        if j.get("JobState") == "PENDING" and pending and pending.requeued is None:
            pending.requeued = now
        if j.get("Reason") == "BeginTime":
            self.held_since = self.held_since or now
            if now - self.held_since > HOLD_CUT_S:
                subprocess.run(["scontrol", "update", f"JobId={self.job_id}", "StartTime=now"],
                               capture_output=True, timeout=60)  # fmt: skip
        else:
            self.held_since = None
        return j

    def read(self) -> list[dict]:
        try:
            text = self.events.read_text()
        except FileNotFoundError:
            return []
        return [json.loads(ln) for ln in text.splitlines() if ln.strip()]


def _drive(job_id: str, work: Path, k: int, timeout: float) -> Outcome:
    """K preemptions by real jobs on `high`, each once the attempt trained STEPS_BEFORE steps."""
    out = Outcome(job_ids={job_id})
    d = Driver(job_id, work / "events.jsonl")
    deadline = time.monotonic() + timeout
    pending: Preemption | None = None
    after = 0.0
    while True:
        j = d.poll(pending)
        evs = d.read()
        state = j.get("JobState", "")
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
            break
        if pending and pending.released is None:
            f = work / f"preemptor-{len(out.preemptions)}"
            if f.exists() and f.read_text().strip():
                pending.released = float(f.read_text())
        starts = [e for e in evs if e["kind"] == "start" and e["rank"] == 0 and e["t"] > after]
        if len(out.preemptions) < k and starts and state == "RUNNING":
            begun = starts[-1]["t"]
            trained = [e for e in evs if e["kind"] == "step" and e["rank"] == 0 and e["t"] > begun]
            if len(trained) >= STEPS_BEFORE:
                nodes = _run(["squeue", "-h", "-j", job_id, "-o", "%N"]).strip()
                mark = work / f"preemptor-{len(out.preemptions) + 1}"
                pending = Preemption(time.time())
                out.preemptions.append(pending)
                _run(["sbatch", "--parsable", "-p", "high", "-N2", f"--nodelist={nodes}",
                      "-J", f"{NAME}-preemptor", "-o", "/dev/null",
                      "--wrap", f"date +%s.%N > {mark}; sleep 2"])  # fmt: skip
                after = time.time()
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job_id], capture_output=True, timeout=60)
            raise RunFailed(f"job {job_id} not done after {timeout:.0f} s ({state})")
        time.sleep(0.3)
    for i, p in enumerate(out.preemptions, 1):  # a preemptor that starts as the job ends
        f = work / f"preemptor-{i}"
        until = time.monotonic() + 30
        while p.released is None and time.monotonic() < until:
            if f.exists() and f.read_text().strip():
                p.released = float(f.read_text())
            time.sleep(0.3)
    out.events, out.state, out.trace = d.read(), j.get("JobState", ""), d.trace
    out.restarts = int(j.get("Restarts", "0") or 0)
    out.job_ids |= {str(e["job"]) for e in out.events if e.get("job")}
    result = work / "result.json"
    out.sha = json.loads(result.read_text())["params_sha256"] if result.exists() else None
    return out


# --- contenders ------------------------------------------------------------------------------------


def _worker_args(work: Path, steps: int, save_s: float) -> list[str]:
    return ["--steps", str(steps), "--step-sleep", str(STEP_SLEEP), "--save-seconds", str(save_s),
            "--checkpoint-dir", str(work / "ckpt"), "--events", str(work / "events.jsonl"),
            "--out", str(work / "result.json")]  # fmt: skip


def _xrun(work: Path, args: list[str], k: int) -> str:
    cfg = f"partition=low,exclusive=True,job_name={NAME}-xrun"
    argv = [c.tool("xrun"), "run", "-s", "slurm", "-cfg", cfg, "dist.ddp", "-j", "2x2",
            "--cpu", "2", "--memMB", "1024", "--max_retries", str(k),
            "--rdzv_port", str(c.free_port()), "--script", WORKER.name, "--", "--stop", "xrun",
            *args]  # fmt: skip
    text = _run(argv, cwd=work)
    m = re.search(r"slurm://[^\s]*?(\d+)\s*$", text.strip(), re.M)
    if not m:
        raise RunFailed(f"no job id in xrun run's output: {one_line(text)}")
    return m.group(1)


def _torchrun(work: Path, args: list[str], k: int) -> str:
    env = dict(os.environ, BENCH_DIR=str(work), BENCH_PORT=str(c.free_port()), BENCH_NPROC="2",
               BENCH_ARGS=" ".join(args), OMP_NUM_THREADS="1")  # fmt: skip
    env["PATH"] = f"{Path(c.tool('torchrun')).parent}:{env['PATH']}"
    return _run(["sbatch", "--parsable", "-p", "low", "-N2", "-J", f"{NAME}-torchrun",
                 "-o", str(work / "slurm.out"), "--chdir", str(work), str(SBATCH)],
                env=env).strip().split(";")[0]  # fmt: skip


def submitit_python() -> str:
    """A venv of the benchmark's own with submitit 1.5.4 (``harness.peer_venv``). Made once
    (~20 s); raises Unavailable when pip cannot get it."""
    probe = "import submitit; assert submitit.__version__ == '1.5.4'"
    return peer_venv(SUBMITIT_VENV, SUBMITIT, [SUBMITIT], probe)


SUBMIT_WITH_SUBMITIT = """\
import sys, submitit, preempt_train
ex = submitit.AutoExecutor(folder=sys.argv[1], cluster="slurm")
ex.update_parameters(slurm_partition="low", nodes=2, tasks_per_node=2, cpus_per_task=1,
                     timeout_min=120, name=sys.argv[2], slurm_additional_parameters={"exclusive": True})
print(ex.submit(preempt_train.SubmititTrainer(sys.argv[3:])).job_id)
"""


def _submitit(work: Path, args: list[str], k: int) -> str:
    py = submitit_python()
    (work / "submit.py").write_text(SUBMIT_WITH_SUBMITIT)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(work), env.get("PYTHONPATH")) if p)
    argv = [py, "submit.py", str(work / "submitit"), f"{NAME}-submitit", "--stop", "none", *args]
    return _run(argv, cwd=work, env=env).strip().splitlines()[-1]


def lightning_python() -> str:
    """A venv of the benchmark's own with Lightning 2.5.6 over the project's torch 2.13.0 CPU
    (``harness.peer_venv``; the constraint keeps pip from fetching another torch)."""
    probe = "import lightning; assert lightning.__version__ == '2.5.6'"
    return peer_venv(LIGHTNING_VENV, LIGHTNING, [LIGHTNING], probe, constraints="torch==2.13.0\n")


def _lightning(work: Path, args: list[str], k: int) -> str:
    env = dict(os.environ, BENCH_DIR=str(work), BENCH_PY=lightning_python(),
               BENCH_ARGS=" ".join(args), MASTER_PORT=str(c.free_port()), OMP_NUM_THREADS="1")  # fmt: skip
    return _run(["sbatch", "--parsable", "-p", "low", "-N2", "-J", f"{NAME}-lightning",
                 "-o", str(work / "slurm.out"), "--chdir", str(work), str(LIGHTNING_SBATCH)],
                env=env).strip().split(";")[0]  # fmt: skip


SUBMIT: dict[str, Callable[[Path, list[str], int], str]] = {
    "xrun": _xrun,
    "torchrun-sbatch": _torchrun,
    "submitit": _submitit,
    "lightning": _lightning,
}


def _workdir() -> Path:
    # The cluster's nodes run on this host: a tmp dir is the shared file system.
    work = Path(tempfile.mkdtemp(prefix="xrun-bench-preempt-"))
    for f in (WORKER, RECIPE, LIGHTNING_WORKER):
        shutil.copy(f, work / f.name)
    return work


def reference(steps: int) -> str:
    """The final parameters of an undisturbed 4-worker run (one local agent: the result depends
    on the world size only)."""
    work = _workdir()
    try:
        args = _worker_args(work, steps, 0.0)
        args[args.index("--step-sleep") + 1] = "0"
        _run([c.PYTHON, "-m", "xrun.runtime", "--nproc-per-node", "4", WORKER.name, *args],
             cwd=work, env=dict(os.environ, OMP_NUM_THREADS="1"))  # fmt: skip
        return str(json.loads((work / "result.json").read_text())["params_sha256"])
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_contender(name: str, k: int, save_s: float, steps: int) -> Outcome:
    work = _workdir()
    try:
        job_id = SUBMIT[name](work, _worker_args(work, steps, save_s), k)
    except BaseException:  # e.g. Unavailable: its venv could not be made
        shutil.rmtree(work, ignore_errors=True)
        raise
    try:
        # Each preemption: a grace up to 60 s + the kill, the hold cut at 3 s, torch's start.
        out = _drive(job_id, work, k, timeout=300 + k * (save_s + 150) + steps * STEP_SLEEP * 3)
    except BaseException:
        subprocess.run(["scancel", job_id], capture_output=True, timeout=60)
        raise
    if os.environ.get("XRUN_BENCH_KEEP"):  # the raw material, for a second look
        keep = {"preemptions": [vars(p) for p in out.preemptions], "restarts": out.restarts,
                "state": out.state, "job_ids": sorted(out.job_ids), "sha": out.sha,
                "trace": out.trace}  # fmt: skip
        (work / "outcome.json").write_text(json.dumps(keep))
        print(f"preemption: {name}'s job {job_id}: {work}", flush=True)
    else:
        shutil.rmtree(work, ignore_errors=True)
    return out


# --- figures ---------------------------------------------------------------------------------------

WORLD = 4


@dataclass
class Figures:
    agreed: int  # preemptions that ended with a complete checkpoint of one agreed step
    lost: list[float]  # steps lost per preemption
    identical: bool
    runs: int
    bad_requeues: int
    released: list[float]
    resumed: list[float]
    note: str


def figures(out: Outcome, k: int, ref: str) -> Figures:
    evs = sorted(out.events, key=lambda e: e["t"])
    starts = [e for e in evs if e["kind"] == "start" and e["rank"] == 0]
    agreed, lost, released, resumed, unresumed, finished = 0, [], [], [], 0, 0
    for p in out.preemptions:
        before = [s for s in starts if s["t"] < p.t]
        after = [s for s in starts if s["t"] > p.t]
        if not before:
            continue
        t0, t1 = before[-1]["t"], after[0]["t"] if after else float("inf")
        window = [e for e in evs if t0 <= e["t"] < t1]
        last = {r: max((e["step"] for e in window if e["kind"] == "step" and e["rank"] == r),
                       default=before[-1]["step"]) for r in range(WORLD)}  # fmt: skip
        saved = [e["step"] for e in window if e["kind"] == "saved"]
        if not after and any(e["kind"] == "done" for e in window):
            finished += 1  # the job ignored the stop and ran to its end inside the grace
            lost.append(0.0)
        elif not after:
            unresumed += 1
            lost.append(float(max(last.values())))
        else:
            lost.append(float(max(last.values()) - after[0]["step"]))
            if saved and set(last.values()) == {saved[-1]} == {after[0]["step"]}:
                agreed += 1
            first = [e for e in evs if e["kind"] == "step" and e["rank"] == 0 and e["t"] > t1]
            if first and p.requeued:
                resumed.append(first[0]["t"] - p.requeued)
        if p.released:
            released.append(p.released - p.t)
    double = max(0, out.restarts - k)
    note = (f"job {out.state}, Slurm restarts {out.restarts} for {len(out.preemptions)} "
            f"preemption(s), {unresumed} never resumed, {double} extra"
            + (f", {finished} ignored (the job ran to its end in the grace)" if finished else ""))  # fmt: skip
    return Figures(
        agreed=agreed,
        lost=lost,
        identical=out.sha == ref,
        runs=len(out.job_ids),
        bad_requeues=double + unresumed,
        released=released,
        resumed=resumed,
        note=note,
    )


def hold(natural: bool) -> dict[str, Stats | str]:
    """Slurm's hold of a requeued job: the BeginTime it sets, the wait with
    ``scontrol update StartTime=now`` HOLD_CUT_S after the requeue, and (``natural``) the wait
    with nothing done. ``scontrol release`` is no help: it answers 0 and changes nothing (it
    releases user/admin holds, not BeginTime)."""
    job = _run(["sbatch", "--parsable", "-p", "low", "-N1", "-J", f"{NAME}-hold",
                "-o", "/dev/null", "--wrap", "sleep 600"]).strip()  # fmt: skip
    res: dict[str, Stats | str] = {}
    try:
        for how in ("BeginTime set", "StartTime=now", *(["natural"] if natural else [])):
            _wait_state(job, "RUNNING", 300)
            _run(["scontrol", "requeue", job])
            t0 = time.time()
            j = _job(job)
            if how == "BeginTime set":
                until = time.monotonic() + 60  # COMPLETING first, then PENDING (BeginTime)
                while j.get("Reason") != "BeginTime" and time.monotonic() < until:
                    time.sleep(0.2)
                    j = _job(job)
                begin = time.mktime(time.strptime(j["EligibleTime"], "%Y-%m-%dT%H:%M:%S"))
                res[how] = Stats([begin - int(t0)])
                time.sleep(HOLD_CUT_S)
                _run(["scontrol", "update", f"JobId={job}", "StartTime=now"])
                continue
            if how == "StartTime=now":
                time.sleep(HOLD_CUT_S)
                _run(["scontrol", "update", f"JobId={job}", "StartTime=now"])
            _wait_state(job, "RUNNING", 400)
            res[how] = Stats([time.time() - t0])
    except (RunFailed, KeyError, ValueError) as e:
        res.setdefault("natural" if natural else "StartTime=now", f"failed: {e}")
    finally:
        subprocess.run(["scancel", job], capture_output=True, timeout=60)
    return res


def _wait_state(job: str, state: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while _job(job).get("JobState") != state:
        if time.monotonic() > deadline:
            raise RunFailed(f"job {job} not {state} after {timeout:.0f} s")
        time.sleep(0.2)


def _cluster_up(user_signal: bool) -> None:
    """The suite's cluster with or without SlurmctldParameters=preempt_send_user_signal (the
    job's --signal sent at a preemption too): `scontrol reconfigure`, running jobs are kept."""
    env = dict(os.environ, XRUN_SLURM_PREEMPT_SIGNAL="1" if user_signal else "0")
    subprocess.run(["bash", str(REPO / "scripts" / "slurm-cluster.sh"), "up"], env=env,
                   check=True, capture_output=True, timeout=300)  # fmt: skip


def settings(smoke: bool) -> tuple[int, float, list[str], bool]:
    env = os.environ.get
    k = int(env("XRUN_BENCH_PREEMPT_K", "1" if smoke else "20"))
    save_s = float(env("XRUN_BENCH_PREEMPT_C", "2" if smoke else "45"))
    # Smoke (CI) leaves submitit and Lightning out: their venvs need the package index.
    every = ",".join(CONTENDERS[:2] if smoke else CONTENDERS)
    names = [n for n in env("XRUN_BENCH_PREEMPT_CONTENDERS", every).split(",") if n]
    unknown = [n for n in names if n not in SUBMIT]
    if unknown or k < 1 or not 0 <= save_s < 60:
        raise ValueError(f"XRUN_BENCH_PREEMPT_*: K={k}, C={save_s}, contenders {names}: expected "
                         f"K >= 1, 0 <= C < 60 (the grace), contenders among {CONTENDERS}")  # fmt: skip
    return k, save_s, names, env("XRUN_BENCH_PREEMPT_HOLD", "0" if smoke else "1") == "1"


def measure_19(reps: int, smoke: bool) -> list[Row]:
    """One run per contender (``reps`` does not apply: a run is K preemptions)."""
    k, save_s, names, natural = settings(smoke)
    # Ample: each attempt is preempted ~STEPS_BEFORE steps in. Beyond smoke the job also trains
    # longer than the grace after its last preemption: a contender that ignores the SIGTERM
    # (submitit) must not finish inside the grace and so escape the preemption.
    steps = STEPS_BEFORE * 4 * (k + 1) + (0 if smoke else int(GRACE_S * 1.25 / STEP_SLEEP))
    try:
        c.require_slurm()
    except Unavailable as e:  # no cluster here: every row says so, no figure
        return [Row("real Slurm preemptions", "s", "-", {n: f"unavailable: {e}" for n in names})]
    ref = reference(steps)
    got: dict[str, Figures | str] = {}
    signal = os.environ.get("XRUN_BENCH_PREEMPT_USER_SIGNAL") == "1"
    if signal:  # opt-in, as tests/schedulers/slurm/test_stop_paths.py does for one test
        _cluster_up(user_signal=True)
    try:
        for name in names:
            key = f"{name} +user signal" if signal else name
            try:
                got[key] = figures(run_contender(name, k, save_s, steps), k, ref)
            except Unavailable as e:
                got[key] = f"unavailable: {e}"
            except Exception as e:  # noqa: BLE001 - a contender that cannot do it is a result
                got[key] = f"failed: {type(e).__name__}: {one_line(str(e))}"
    finally:
        if signal:
            _cluster_up(user_signal=False)

    def row(label: str, unit: str, target: str, pick: Callable[[Figures], list[float]],
            ok: Callable[[Stats], bool] | None = None) -> Row:  # fmt: skip
        res: dict[str, Stats | str] = {}
        for n, f in got.items():
            samples = pick(f) if isinstance(f, Figures) else []
            res[n] = f if isinstance(f, str) else Stats(samples) if samples else "n/a: none"
        notes = "; ".join(f"{n}: {f.note}" for n, f in got.items() if isinstance(f, Figures))
        notes = notes if label.startswith("preemptions ending") else ""  # once, under row 1

        def check(r: Mapping[str, Stats | str]) -> bool | None:
            s = r.get("xrun")
            return ok(s) if ok and isinstance(s, Stats) else None

        return Row(label, unit, target, res, reference="torchrun-sbatch", check=check, note=notes)

    size = f"K={k} preemptions, C={save_s:g} s checkpoint, 2x2 workers on `low`"
    rows = [
        row(f"preemptions ending in a complete checkpoint of one agreed step ({size})", "hits",
            f"{k} of {k}", lambda f: [float(f.agreed)], lambda s: s.median == k),
        row("steps lost per preemption", "steps", "0", lambda f: f.lost,
            lambda s: max(s.samples) == 0),
        row("final parameters bit-identical to an undisturbed run (1 yes, 0 no)", "hits", "1",
            lambda f: [float(f.identical)], lambda s: s.median == 1),
        row("logical runs (Slurm job ids)", "jobs", "1", lambda f: [float(f.runs)],
            lambda s: s.median == 1),
        row("double or lost requeues", "jobs", "0", lambda f: [float(f.bad_requeues)],
            lambda s: s.median == 0),
        row("preemption -> nodes released to the preemptor", "s", "<= C + 10 s",
            lambda f: f.released, lambda s: max(s.samples) <= save_s + 10),
        row(f"requeue -> first resumed step (hold cut after {HOLD_CUT_S:g} s)", "s", "-",
            lambda f: f.resumed),
    ]  # fmt: skip
    for r in rows:  # a row with no figure for a contender says why, as the harness expects
        r.results = {n: (v if v != "n/a: none" else "unavailable: no such event") for n, v in
                     r.results.items()}  # fmt: skip
    held = Row("Slurm's hold of a requeued job (a sleep job on `low`)", "s", "-",
               hold(natural), subject="StartTime=now", reference="BeginTime set",
               note="BeginTime = requeue + cred_expire + 1 (AuthInfo=cred_expire=120 default); "
                    "`scontrol update JobId=J StartTime=now` shortens it; `scontrol release` "
                    "does not (it lifts holds, not BeginTime)")  # fmt: skip
    return [*rows, held]
