"""Worker script for the spares tests: a real gloo world. Each worker all_reduces (rank + 1),
appends one JSON line to OUT_DIR/events.jsonl (its ranks, world size, node id, pid, the sum),
then waits for OUT_DIR/go before a last barrier and exit 0.

Usage: spare_worker.py OUT_DIR
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

out = sys.argv[1]
dist.init_process_group("gloo")  # MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE from the agent
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
keys = ("RANK", "GROUP_RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_WORLD_SIZE", "XRUN_NODE_ID")
event = {k: os.environ.get(k) for k in keys}
event.update(pid=os.getpid(), sum=t.item())
fd = os.open(os.path.join(out, "events.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
os.write(fd, (json.dumps(event) + "\n").encode())  # one write: lines never interleave
os.close(fd)
while not os.path.exists(os.path.join(out, "go")):
    time.sleep(0.05)
dist.barrier()
# torch 2.13's gloo teardown can deadlock on a busy host (see allreduce.py): leave without it.
os._exit(0)
