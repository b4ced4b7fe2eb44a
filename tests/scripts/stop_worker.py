"""Worker of the graceful-stop tests: a gloo all_reduce per step, ``xrun.runtime.stop`` checked
after each step. Usage: stop_worker.py OUT_DIR [SLOW_RANK SAVE_SECONDS].

Writes OUT_DIR/ready.<rank> once it trains, OUT_DIR/seen.<rank> (the wall time at which it
first saw the stop flag) and, when it stops, OUT_DIR/stopped.<rank>.json with its step; rank
SLOW_RANK sleeps SAVE_SECONDS before it writes that ("saving")."""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

from xrun.runtime import stop

out = sys.argv[1]
slow_rank = int(sys.argv[2]) if len(sys.argv) > 2 else -1
save_s = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(1)
step = 0
seen = False
while True:
    dist.all_reduce(t)
    time.sleep(0.02)
    step += 1
    if step == 3:
        open(os.path.join(out, f"ready.{rank}"), "w").close()
    done = stop.requested(step)
    if not seen and os.path.exists(os.path.join(os.environ["XRUN_STOP_DIR"], "stop")):
        seen = True
        with open(os.path.join(out, f"seen.{rank}"), "w") as f:
            f.write(repr(time.time()))
    if done:
        if rank == slow_rank:
            time.sleep(save_s)
        with open(os.path.join(out, f"stopped.{rank}.json"), "w") as f:
            json.dump({"rank": rank, "step": step, "agreed": stop.stop_step()}, f)
        os._exit(0)  # skip torch 2.13's gloo teardown, which can deadlock
