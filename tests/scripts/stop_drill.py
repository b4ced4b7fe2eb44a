"""Worker of the stop drills on every scheduler (tests/*/test_stop_drills.py, the Slurm
preemption tests): a gloo all_reduce per step, ``xrun.runtime.stop`` checked after each step,
a per-rank checkpoint of the agreed step, a resume from it.

Usage: stop_drill.py OUT_DIR [STEPS_AFTER_RESUME [STOPS]]

OUT_DIR (shared by every rank; a bind mount on docker) gets, per rank R:

* ``ready.R`` once it trains (3 steps in),
* ``seen.R``: the wall time at which it first saw the stop request (the flag, or a SIGTERM of
  its own),
* ``ckpt.R.json``: its checkpoint ``{"step", "agreed", "sum"}``, written to a temp file and
  renamed (complete or absent), and ``stopped.R.json``, the same, written after it.

A first attempt trains until it is asked to stop; one that finds its checkpoint prints
``resuming from step S`` and, once it has been stopped STOPS times (default 1), ends
STEPS_AFTER_RESUME (default 10) steps later (before that it trains until stopped again). Every line on
stdout starts with ``rank R:``.
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

from xrun.runtime import stop

out = sys.argv[1]
after_resume = int(sys.argv[2]) if len(sys.argv) > 2 else 10
stops_wanted = int(sys.argv[3]) if len(sys.argv) > 3 else 1
dist.init_process_group("gloo")
rank = dist.get_rank()
ckpt = os.path.join(out, f"ckpt.{rank}.json")
start, total, stops = 0, 1 << 30, 0
t = torch.ones(1)
if os.path.exists(ckpt):
    with open(ckpt) as f:
        saved = json.load(f)
    start, stops = saved["step"], saved["stops"]
    if stops >= stops_wanted:
        total = start + after_resume
    t = torch.tensor([saved["sum"]], dtype=torch.float64).float()
    print(f"rank {rank}: resuming from step {start}", flush=True)
seen = False
step = start
while step < total:
    dist.all_reduce(t)
    t /= dist.get_world_size()
    time.sleep(0.05)
    step += 1
    if step == start + 3:
        with open(os.path.join(out, f"ready.{rank}"), "w") as f:
            f.write(repr(time.time()))
    done = stop.requested(step)
    if not seen and stop._get().seen:  # noqa: SLF001 - the drill measures when it arrived
        seen = True
        with open(os.path.join(out, f"seen.{rank}"), "w") as f:
            f.write(repr(time.time()))
    if done:
        state = {
            "step": step,
            "agreed": stop.stop_step(),
            "sum": float(t.item()),
            "stops": stops + 1,
        }
        with open(ckpt + ".tmp", "w") as f:
            json.dump(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(ckpt + ".tmp", ckpt)
        with open(os.path.join(out, f"stopped.{rank}.json"), "w") as f:
            json.dump(state, f)
        print(f"rank {rank}: stopping at step {step}: checkpoint saved", flush=True)
        os._exit(0)  # skip torch 2.13's gloo teardown, which can deadlock
print(f"rank {rank}: done at step {step}", flush=True)
dist.barrier()
os._exit(0)
