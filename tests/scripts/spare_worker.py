"""Worker script for the spares tests: a real gloo world. Each worker all_reduces (rank + 1),
appends one JSON line to OUT_DIR/events.jsonl (its ranks, world size, node id, host, pid, the
sum), then all_reduces every 50 ms (a training loop: a lost peer breaks its collective) until
the ranks agree that OUT_DIR/go exists, then a last barrier and exit 0.

Usage: spare_worker.py OUT_DIR [FAIL_NODE]  (FAIL_NODE: the worker on that XRUN_NODE_ID raises
once, after its report: a worker failure, not a lost node)
"""

import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist

out = sys.argv[1]
if os.environ.get("SPARE_PROBE"):  # the warm-modules test: a library module the job imports
    __import__(os.environ["SPARE_PROBE"])
dist.init_process_group("gloo")  # MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE from the agent
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
keys = ("RANK", "GROUP_RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_WORLD_SIZE", "XRUN_NODE_ID")
event = {k: os.environ.get(k) for k in keys}
event.update(pid=os.getpid(), host=socket.gethostname(), sum=t.item(), t=time.time())
fd = os.open(os.path.join(out, "events.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
os.write(fd, (json.dumps(event) + "\n").encode())  # one write: lines never interleave
os.close(fd)
flag = os.path.join(out, "failed")
if sys.argv[2:] == [os.environ.get("XRUN_NODE_ID")] and not os.path.exists(flag):
    open(flag, "w").close()
    raise RuntimeError("scripted failure")
# Training: a collective every 50 ms, until OUT_DIR/go exists. The ranks agree on the step to
# leave at (MAX of what each saw): one that sees `go` a moment before another must not go to the
# barrier while the other is still in an all_reduce (gloo pairs the two, and both hang).
go = os.path.join(out, "go")
while True:
    seen = torch.tensor([float(os.path.exists(go))])
    dist.all_reduce(seen, op=dist.ReduceOp.MAX)
    if seen.item():
        break
    time.sleep(0.05)
dist.barrier()
# torch 2.13's gloo teardown can deadlock on a busy host (see allreduce.py): leave without it.
os._exit(0)
