"""Measure 18's torchft contender (benchmarks/torchft_drill.py): examples/train_ddp.py's model,
data and SGD, trained under torchft 0.2.0 by replica groups (one torchrun per group, as
torchft's own torchx component ``torchft.torchx.hsdp`` launches them: REPLICA_GROUP_ID,
NUM_REPLICA_GROUPS, TORCHFT_LIGHTHOUSE in the environment, ``--max-restarts`` relaunching a
group in place).

Each step: the group's ranks average their gradients over the group's own gloo process group
(torchrun's), then torchft's ``Manager.allreduce`` averages them over the replica groups in the
quorum (its reconfigurable ``ProcessGroupGloo``), and torchft's ``OptimizerWrapper`` steps only
when ``should_commit`` says every group in the quorum got there. With every group present that
is the 4-rank average train_ddp's DDP computes (in another order of summation); with one group
down, the other trains alone on its half of the data. torchft's own ``DistributedDataParallel``
is not used: it averages only across replica groups (group rank i with group rank i), and the
two ranks of a group would drift apart.

Lines (global rank 0 = group 0's rank 0, unless said): ``rank R/W: started (restart N)`` (each
group's first rank), ``step S`` once step S is committed with every replica group
participating (a full-world step), ``step S: P of G replica groups`` when fewer took part, and
``rank R/W: resuming after step S from replica group ...`` on a group that healed from a peer
(torchft's live recovery: the state comes from a healthy group over HTTP). Steps count from 1,
as train_ddp's ``--print-steps`` does; step S trains on train_ddp's batch of step S.

Arguments: ``--steps N --steps-per-epoch E --step-sleep S --seed K --lr L --out FILE``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from torchft import Manager, ProcessGroupGloo  # noqa: E402
from torchft.optim import OptimizerWrapper  # noqa: E402
from train_ddp import batch, make_model, params_sha256  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10**9)
    p.add_argument("--steps-per-epoch", type=int, default=1000)
    p.add_argument("--step-sleep", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--out")
    p.add_argument(
        "--full-start",
        action="store_true",
        help="commit the first step only with every replica group in the quorum",
    )
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    group, groups = int(os.environ["REPLICA_GROUP_ID"]), int(os.environ["NUM_REPLICA_GROUPS"])
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    grank, gworld = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    rank, world = group * gworld + grank, groups * gworld
    # A store of this launch's own for the group's gloo group and torchft's manager: torchrun's
    # store keeps the keys of the launch before a relaunch (gloo's peer addresses, the
    # manager's address), and a relaunched rank could read a dead peer's (seen here: gloo's
    # connectFullMesh "Connection refused" on the relaunch). Rank 0 serves it, its port goes
    # through torchrun's store under a key of this launch.
    outer = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False, timeout=timedelta(seconds=120))  # fmt: skip
    if grank == 0:
        store = dist.TCPStore("127.0.0.1", 0, gworld, is_master=True, wait_for_workers=False)
        outer.set(f"xrun-bench/{restart}/port", str(store.port))
    port = int(outer.get(f"xrun-bench/{restart}/port"))
    if grank != 0:
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=120))
    dist.init_process_group("gloo", store=dist.PrefixStore("group", store), rank=grank,
                            world_size=gworld, timeout=timedelta(seconds=120))  # fmt: skip
    if grank == 0:
        print(f"rank {rank}/{world}: started (restart {restart})", flush=True)

    model = make_model(args.seed)
    sgd = torch.optim.SGD(model.parameters(), lr=args.lr)

    def state_dict() -> dict[str, object]:
        return {"model": model.state_dict(), "optim": sgd.state_dict()}

    def load_state_dict(sd: dict[str, dict]) -> None:
        model.load_state_dict(sd["model"])
        sgd.load_state_dict(sd["optim"])

    # the settings of torchft's train_ddp example (gloo's 5 s, the manager's 30 s); every
    # group starts from the same seeded weights, so no step-0 sync is needed
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=5)),
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        min_replica_size=1,
        replica_id=f"xrun_bench_{group}",
        timeout=timedelta(seconds=30),
        rank=grank,
        world_size=gworld,
        store_addr="127.0.0.1",
        store_port=port,
        init_sync=False,
    )
    opt = OptimizerWrapper(manager, sgd)
    full_start = args.full_start and restart == "0"  # a relaunched group heals at once
    if full_start:
        # The lighthouse issues the first quorum to the groups that asked within its join
        # timeout; a group slower to start would join later and heal. For a run to compare
        # with train_ddp's, the first commit waits for every group (a private field of
        # torchft 0.2.0's Manager: should_commit requires min_replica_size participants).
        manager._min_replica_size = groups
    params = list(model.parameters())
    loss_fn = nn.MSELoss()
    while (done := manager.current_step()) < args.steps:
        opt.zero_grad()  # starts torchft's quorum for this step
        epoch, step = done // args.steps_per_epoch + 1, done % args.steps_per_epoch
        x, y = batch(args.seed, epoch, rank, step)
        loss_fn(model(x), y).backward()
        flat = torch.cat([q.grad.reshape(-1) for q in params])
        dist.all_reduce(flat)  # the group's sum
        flat /= gworld
        manager.allreduce(flat).wait()  # the replica groups' average (errors: no commit)
        offset = 0
        for q in params:
            n = q.numel()
            q.grad.copy_(flat[offset : offset + n].view_as(q))
            offset += n
        if args.step_sleep:
            time.sleep(args.step_sleep)
        opt.step()  # should_commit: applies a healed state first, steps only on a commit
        now = manager.current_step()
        if full_start and now:
            manager._min_replica_size = 1  # from now on torchft's fault tolerance as usual
        if grank == 0 and now > done + 1:
            print(f"rank {rank}/{world}: resuming after step {now - 1} from replica group "
                  "(torchft live recovery)", flush=True)  # fmt: skip
        if rank == 0 and now > done:
            n = manager.num_participants()
            print(f"step {now}" if n == groups else f"step {now}: {n} of {groups} replica groups",
                  flush=True)  # fmt: skip
    digest = params_sha256(model)
    print(f"rank {rank}/{world}: final params sha256 {digest}", flush=True)
    if rank == 0 and args.out:
        Path(args.out).write_text(json.dumps({"params_sha256": digest, "steps": args.steps}))
    manager.shutdown(wait=False)
    dist.barrier()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # as train_ddp: no teardown of gloo (it can deadlock at exit on a busy host)
