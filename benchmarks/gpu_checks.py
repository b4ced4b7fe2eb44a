"""Checks that need a CUDA GPU: run by hand on a machine that has one (CI has none).

    python -m benchmarks.gpu_checks            # prints one line per check, exit 1 if one failed

1. ``snapshot``: ``xrun.runtime.snapshot`` on CUDA tensors: a model and AdamW on the GPU, with
   dropout (the CUDA RNG), committed, trained 3 more steps; a fresh model restored from the
   snapshot and trained the same 3 steps ends bit-identical (parameters and optimizer state).
2. ``cuda-wait-cpu``: how much CPU a process uses while it waits in ``torch.cuda.synchronize()``
   for a kernel that does not end (a hung NCCL collective looks like this to the host): the
   reason the stall watchdog cannot take CPU use alone as proof of work.
3. ``stall-cuda-wait``: the agent with ``--stall-timeout 5 --stall-silent-timeout 30``: a worker
   that computes on the GPU without printing for 20 s (a module-level loop of matmuls and
   ``synchronize()``: nothing changes between stack samples) is not ended; one that printed a
   line and then waits on the GPU for ever is ended by the silent limit (30 s), not at 5 s (a
   GPU sync is not taken for a collective wait: runtime/diagnose/spin.py).
4. ``warm-nccl``: ``--recover warm`` on NCCL (one GPU, so one rank): a DDP job on CUDA that
   commits a snapshot every step is SIGKILLed at step 8 of 20, 12 s later (the pool has
   warmed the job's modules by then, as it has at a failure minutes into a job; killed at once,
   the replacement waits ~4 s for that warm-up); a warm pool process takes the rank, joins a
   new NCCL group, restores the snapshot from shared memory and finishes. Its final parameters
   equal an undisturbed run's bit for bit; the line gives the seconds from the kill to the
   first step after it.

Standard library plus torch; the agent runs from this checkout (``PYTHONPATH``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

_SNAPSHOT = """
import os, sys, torch
from xrun.runtime.snapshot import Snapshotter, Restored
torch.manual_seed(0)
def build():
    m = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.Dropout(0.3),
                            torch.nn.Linear(512, 64)).cuda()
    return m, torch.optim.AdamW(m.parameters(), lr=1e-3)
def step(m, opt):
    x = torch.randn(32, 256, device="cuda")
    loss = m(x).square().mean()
    opt.zero_grad(); loss.backward(); opt.step()
m, opt = build()
for _ in range(5):
    step(m, opt)
snap = Snapshotter(every=1)
assert snap.restore(m, opt) is None  # a first start: nothing to restore
snap.commit(5, model=m, optimizer=opt)
for _ in range(3):
    step(m, opt)
want = [p.detach().clone() for p in m.parameters()]
want_opt = opt.state_dict()
snap.close()
os.environ["TORCHELASTIC_RESTART_COUNT"] = "1"  # the restarted worker's view
m2, opt2 = build()
snap = Snapshotter(every=1)
r = snap.restore(m2, opt2)
assert isinstance(r, Restored) and r.step == 5, r
for _ in range(3):
    step(m2, opt2)
same = all(torch.equal(a, b) for a, b in zip(want, m2.parameters()))
st2 = opt2.state_dict()["state"]
same_opt = all(torch.equal(want_opt["state"][k][n], st2[k][n])
               for k in want_opt["state"] for n in ("exp_avg", "exp_avg_sq"))
snap.close(remove=True)
print("bit-identical" if same and same_opt else "DIFFERENT", flush=True)
sys.exit(0 if same and same_opt else 1)
"""

_WAITER = """
import sys, time, torch
torch.cuda.init()
torch.cuda._sleep(1_000)           # warm the context up
torch.cuda.synchronize()
print("up", flush=True)
while True:                         # a kernel that never ends, as a hung collective's
    torch.cuda._sleep(2_000_000_000)
    torch.cuda.synchronize()
"""

_BUSY = """
import time, torch
x = torch.randn(4096, 4096, device="cuda")
print("up", flush=True)
end = time.monotonic() + 20
while time.monotonic() < end:       # 20 s of silent GPU work, synchronising often
    x = (x @ x).clamp_(-1, 1)
    torch.cuda.synchronize()
print("done", flush=True)
"""


_WARM = """
import time
T = [("start", time.time())]
import os, signal, sys, hashlib, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from xrun.runtime.snapshot import Snapshotter, Restored
cuda = torch.cuda.is_available()
dev = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
if cuda:
    torch.cuda.set_device(dev)
    torch.empty(1, device=dev)  # the CUDA context
T.append(("cuda", time.time()))
dist.init_process_group("nccl" if cuda else "gloo")
T.append(("group", time.time()))
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 64)).to(dev)
opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
ddp = DDP(m)
T.append(("ddp", time.time()))
snap = Snapshotter()
got = snap.restore(m, opt)
T.append(("restore", time.time()))
print("phases " + " ".join(f"{n}={t:.3f}" for n, t in T), flush=True)
start = got.step if isinstance(got, Restored) else 0
for step in range(start, 20):
    torch.manual_seed(1000 + step)  # the batch depends on the step alone
    x = torch.randn(32, 256, device=dev)
    opt.zero_grad()
    ddp(x).square().mean().backward()
    opt.step()
    snap.commit(step + 1, model=m, optimizer=opt)
    print(f"step {step + 1} at {time.time():.3f}", flush=True)
    if step + 1 == 8 and sys.argv[2] == "kill" and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
        time.sleep(12)  # a failure minutes into a job finds the pool warm: let it refill
        print(f"killed at {time.time():.3f}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
h = hashlib.sha256(b"".join(p.detach().cpu().numpy().tobytes() for p in m.parameters()))
open(sys.argv[1], "w").write(h.hexdigest())
snap.close(remove=True)
dist.destroy_process_group()
"""


def check_warm(tmp: str) -> tuple[bool, str]:
    script = _script(tmp, "warm.py", _WARM)
    out: dict[str, str] = {}
    took, phases = float("nan"), ""
    for mode in ("clean", "kill"):
        env = _env(tmp)
        env["XRUN_RUN_ID"] = f"gpu-warm-{mode}"
        env["XRUN_SNAPSHOT_DIR"] = f"{tmp}/snap-{mode}"
        p = subprocess.run(
            [sys.executable, "-m", "xrun.runtime", "--nproc-per-node", "1",
             "--max-restarts", "1", "--recover", "warm", "--warm-pool-size", "1",
             script, f"{tmp}/warm-{mode}.sha", mode],
            env=env, capture_output=True, text=True, timeout=240,
        )  # fmt: skip
        if p.returncode != 0:
            return False, f"{mode}: rc={p.returncode} {p.stderr.strip().splitlines()[-3:]}"
        out[mode] = Path(f"{tmp}/warm-{mode}.sha").read_text()
        if mode == "kill":
            lines = p.stdout.splitlines()
            killed = next(float(ln.split()[-1]) for ln in lines if "killed at" in ln)
            after = [ln for ln in lines[lines.index(next(ln for ln in lines if "killed at" in ln)):]
                     if ln.split(":", 1)[-1].startswith("step ")]  # fmt: skip
            took = float(after[0].split()[-1]) - killed if after else float("nan")
            ph = [ln.split("phases ", 1)[1] for ln in lines if "phases " in ln][-1:]
            if ph:  # the restarted rank's phases, as seconds after the kill
                marks = [(kv.split("=")[0], float(kv.split("=")[1])) for kv in ph[0].split()]
                phases = " ".join(f"{n}+{t - killed:.2f}" for n, t in marks)
    same = out["clean"] == out["kill"]
    verdict = "bit-identical" if same else "DIFFERENT"
    return same, f"{verdict}; kill -> next step {took:.2f} s ({phases})"


def _env(tmp: str) -> dict[str, str]:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    env.update(XRUN_RUN_ID="gpu-check", XRUN_SNAPSHOT_DIR=tmp + "/snap", PYTHONUNBUFFERED="1")
    return env


def _script(tmp: str, name: str, text: str) -> str:
    path = os.path.join(tmp, name)
    Path(path).write_text(textwrap.dedent(text))
    return path


def check_snapshot(tmp: str) -> tuple[bool, str]:
    p = subprocess.run(
        [sys.executable, _script(tmp, "snap.py", _SNAPSHOT)],
        env=_env(tmp), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    return p.returncode == 0, (p.stdout + p.stderr).strip().splitlines()[-1:][0][:300]


def check_cuda_wait_cpu(tmp: str) -> tuple[bool, str]:
    proc = subprocess.Popen(
        [sys.executable, _script(tmp, "wait.py", _WAITER)],
        env=_env(tmp), stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        proc.stdout.readline()
        time.sleep(1)

        def ticks() -> int:
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rpartition(")")[2].split()
            return int(fields[11]) + int(fields[12])

        t0, c0 = time.monotonic(), ticks()
        time.sleep(3)
        share = (ticks() - c0) / os.sysconf("SC_CLK_TCK") / (time.monotonic() - t0)
    finally:
        proc.kill()
        proc.wait()
    return True, f"a process waiting in cuda.synchronize uses {share:.0%} of a CPU"


def check_stall(tmp: str) -> tuple[bool, str]:
    out = []
    ok = True
    for name, text, want_stall in (("busy.py", _BUSY, False), ("wait.py", _WAITER, True)):
        t0 = time.monotonic()
        p = subprocess.run(
            [sys.executable, "-m", "xrun.runtime", "--standalone", "--nproc-per-node", "1",
             "--stall-timeout", "5", "--stall-silent-timeout", "30", _script(tmp, name, text)],
            env=_env(tmp), capture_output=True, text=True, timeout=400,
        )  # fmt: skip
        dt = time.monotonic() - t0
        text_out = p.stdout + p.stderr
        stalled = "stalled" in text_out
        cause = [ln for ln in text_out.splitlines() if "root cause" in ln][-1:]
        out.append(f"{name}: rc={p.returncode} {dt:.1f}s stalled={stalled} {cause[:1]}")
        ok = ok and (stalled == want_stall) and (p.returncode != 0) == want_stall
        if want_stall and not 30 <= dt <= 30 + 10 + 15:  # L + 10 s, + the CUDA start-up
            ok = False
    return ok, " | ".join(out)


def main() -> int:
    only = sys.argv[1:]  # check names to run (default: all)
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, check in (
            ("snapshot", check_snapshot),
            ("cuda-wait-cpu", check_cuda_wait_cpu),
            ("stall-cuda-wait", check_stall),
            ("warm-nccl", check_warm),
        ):
            if only and name not in only:
                continue
            try:
                ok, what = check(tmp)
            except Exception as e:  # a check that breaks is a failed check, with its reason
                ok, what = False, f"{type(e).__name__}: {e}"
            failed += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {name}: {what}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
