"""Worker script: every rank joins a gloo process group, then rank 1 raises ValueError inside a
function while the others wait in ``dist.barrier()``: a real DDP job's uncaught exception, which
torch prints with every line prefixed ``[rank1]: ``."""

import os

import torch.distributed as dist


def load(batch: int) -> None:
    if int(os.environ["RANK"]) == 1:
        raise ValueError(f"bad shape in batch {batch}")


dist.init_process_group("gloo")  # MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE from the agent
load(3)
dist.barrier()  # the others wait here until rank 1's death closes the group
