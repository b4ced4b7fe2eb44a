"""Worker script for test_torch_pg: a gloo process group whose store is a TCPStore client of
the server under test (wrapped in a PrefixStore, as torchrun's workers wrap the agent's store).

argv: port rank world_size out_dir. Writes out_dir/rank<rank>.json with what it saw.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> None:
    port, rank, world_size, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    timeout = datetime.timedelta(seconds=60)
    client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
    store = dist.PrefixStore("attempt0", client)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timeout)
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    group = dist.new_group(list(range(world_size)))
    in_group = torch.tensor([1.0])
    dist.all_reduce(in_group, group=group)
    dist.barrier()
    dist.monitored_barrier(timeout=timeout)
    objects: list[object] = [None] * world_size
    dist.all_gather_object(objects, {"rank": rank})
    result = {"sum": total.item(), "group_sum": in_group.item(), "objects": objects}
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()  # every rank is past its last collective
    # torch 2.13's gloo teardown can deadlock on a busy host (see examples/train_ddp.py):
    # nothing is left to clean up, so leave without it.
    os._exit(0)


if __name__ == "__main__":
    main()
