"""A small, real DDP training job: torch gloo on CPU, synthetic data, checkpoints, resume.

Run it with xrun (or, unmodified, with torchrun)::

    xrun run -s local_cwd dist.ddp -j 2x2 --script examples/train_ddp.py -- --epochs 5
    torchrun --standalone --nproc-per-node 4 examples/train_ddp.py --epochs 5

Deterministic: given the same world size, the final parameters are bit-for-bit those of an
undisturbed run, however often the job is killed and restarted (e.g. by the runtime agent's
``--max-restarts``):

* every source of randomness is seeded: the model's initial weights from ``--seed``, and each
  step's batch from ``(seed, epoch, rank, step)``, so a resumed epoch sees the same data;
* after each epoch rank 0 saves a checkpoint (the parameters + the epoch number) atomically:
  written to a temp file, then renamed, so a kill mid-write never leaves a half checkpoint;
* on start, rank 0 loads the newest checkpoint (the last *completed* epoch) and every rank
  starts from it: the epoch is broadcast and DDP broadcasts rank 0's parameters;
* plain SGD (no optimizer state beyond the parameters) and one intra-op thread, so nothing that
  was not checkpointed influences the result;
* after every step each rank also commits its state (parameters, optimizer, RNG, step) to the
  node's shared memory (``xrun.runtime.snapshot``, see docs/recovery.md). A restarted job
  resumes from the newest step every rank committed, losing no step; without one (first start,
  a rank on a new node, another world size) from the disk checkpoint as above; a node that was
  lost and replaced by a spare gets the step from its peers' memory (``replicated=True``:
  the state is DDP's, the same on every rank; each rank's RNG state is copied to a rank of the
  next node at each commit). The commits are
  skipped when no restart can follow (``--max-restarts 0``, plain ``python``, torchrun's default).

* a stop request (a preemption, a time limit's warning, ``xrun cancel``, ``docker stop``,
  SIGTERM to the local_cwd supervisor: ``xrun.runtime.stop``, docs/runtime.md "Preemption")
  is checked after every step: every rank gets it after the same step S, finishes it, rank 0
  saves ``step-S.pt`` atomically (parameters, optimizer, RNG state and S, the data position),
  prints ``stopping at step S: checkpoint saved``, and every rank exits 0 (on Slurm the batch
  script then requeues the job once). The next start prints ``resuming from step S`` and
  trains on from there, bit for bit as if it had never stopped.

``--print-steps``: rank 0 prints ``step S`` (S counts from the start of training) once every
rank has committed step S, so a restart never prints a step twice unless it trained it twice.

Checkpoints go through fsspec, so ``--checkpoint-dir`` may be a path or a URL
(``file:///tmp/ckpt``, ``memory://ckpt``, ``s3://...`` with s3fs installed).

Sanity checks every rank makes (they fail the job loudly): ``WORLD_SIZE`` equals the process
group's size, and an ``all_reduce`` of ``rank + 1`` sums to ``n (n + 1) / 2``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import time
from datetime import timedelta

import fsspec
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from xrun.runtime import stop
from xrun.runtime.snapshot import Restored, Snapshotter

IN_FEATURES, HIDDEN, BATCH = 16, 32, 32
_CKPT_RE = re.compile(r"epoch-(\d+)\.pt$")
_STOP_RE = re.compile(r"step-(\d+)\.pt$")  # a stop request's checkpoint, mid-epoch


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=5, help="epochs to train in total (default: 5)")
    p.add_argument("--steps-per-epoch", type=int, default=20, help="steps per epoch (default: 20)")
    p.add_argument("--lr", type=float, default=0.1, help="SGD learning rate (default: 0.1)")
    p.add_argument(
        "--seed", type=int, default=0, help="seed of the model and the data (default: 0)"
    )
    p.add_argument(
        "--checkpoint-dir",
        default="./outputs/ckpt",
        help="dir or fsspec URL for checkpoints; resumes from the newest (default: ./outputs/ckpt)",
    )
    p.add_argument(
        "--out", help="write the final parameters' sha256, loss etc. here as JSON (rank 0)"
    )
    p.add_argument(
        "--step-sleep", type=float, default=0.0, help="seconds to sleep per step (to watch it run)"
    )
    p.add_argument(
        "--snapshot-every",
        type=int,
        default=1,
        help="commit the state to shared memory every N steps; 0: never (default: 1)",
    )
    p.add_argument(
        "--print-steps",
        action="store_true",
        help="rank 0 prints 'step S' once every rank has committed step S",
    )
    return p.parse_args(argv)


def init_distributed() -> tuple[int, int]:
    """Join the process group the launcher describes (torchrun/xrun env vars), or run alone."""
    if "WORLD_SIZE" not in os.environ:  # plain `python train_ddp.py`: a group of one
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    else:
        dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    expected = int(os.environ.get("WORLD_SIZE", "1"))
    if world != expected:
        raise RuntimeError(f"rank {rank}: WORLD_SIZE={expected} but the process group has {world}")
    check = torch.tensor([float(rank + 1)])
    dist.all_reduce(check)
    if check.item() != world * (world + 1) / 2:
        raise RuntimeError(
            f"rank {rank}: all_reduce(rank + 1) = {check.item()}, expected {world * (world + 1) / 2}"
        )
    return rank, world


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(IN_FEATURES, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1))


def batch(seed: int, epoch: int, rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same batch for the same (seed, epoch, rank, step), whatever happened before."""
    g = torch.Generator().manual_seed(((seed * 1_000_003 + epoch) * 1_009 + rank) * 100_003 + step)
    x = torch.randn(BATCH, IN_FEATURES, generator=g)
    w = torch.linspace(-1.0, 1.0, IN_FEATURES)  # the function to learn
    y = torch.tanh(x @ w / 2).unsqueeze(1) + 0.01 * torch.randn(BATCH, 1, generator=g)
    return x, y


# --------------------------------------------------------------------------- checkpoints
def latest_checkpoint(fs: fsspec.AbstractFileSystem, root: str) -> tuple[int, str] | None:
    """(epoch, path) of the newest complete checkpoint; temp files never match."""
    try:
        names = fs.ls(root, detail=False)
    except FileNotFoundError:
        return None
    found = [(int(m.group(1)), n) for n in names if (m := _CKPT_RE.search(str(n)))]
    return max(found) if found else None


def save_checkpoint(fs: fsspec.AbstractFileSystem, root: str, epoch: int, model: nn.Module) -> None:
    """Write, then rename: readers see the whole checkpoint or none (rename is atomic)."""
    fs.makedirs(root, exist_ok=True)
    final = f"{root.rstrip('/')}/epoch-{epoch:05d}.pt"
    tmp = f"{final}.tmp-{os.getpid()}"
    with fs.open(tmp, "wb") as f:
        torch.save({"epoch": epoch, "model": model.state_dict()}, f)
    fs.mv(tmp, final)


def latest_stop_checkpoint(fs: fsspec.AbstractFileSystem, root: str) -> tuple[int, str] | None:
    """(step, path) of the newest complete stop checkpoint (see save_stop_checkpoint)."""
    try:
        names = fs.ls(root, detail=False)
    except FileNotFoundError:
        return None
    found = [(int(m.group(1)), n) for n in names if (m := _STOP_RE.search(str(n)))]
    return max(found) if found else None


def save_stop_checkpoint(
    fs: fsspec.AbstractFileSystem,
    root: str,
    step: int,
    model: nn.Module,
    opt: torch.optim.Optimizer,
) -> None:
    """At a stop request: everything a resume needs to go on bit for bit, after ``step``
    (counted from the start: it is also the data position), written then renamed."""
    fs.makedirs(root, exist_ok=True)
    final = f"{root.rstrip('/')}/step-{step:08d}.pt"
    tmp = f"{final}.tmp-{os.getpid()}"
    state = {
        "step": step,
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "rng": torch.get_rng_state(),
    }
    with fs.open(tmp, "wb") as f:
        torch.save(state, f)
    fs.mv(tmp, final)


def load_stop_checkpoint(
    fs: fsspec.AbstractFileSystem, path: str, model: nn.Module, opt: torch.optim.Optimizer
) -> int:
    with fs.open(path, "rb") as f:
        state = torch.load(f, weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"])
    return int(state["step"])


def resume(
    snap: Snapshotter,
    fs: fsspec.AbstractFileSystem,
    root: str,
    spe: int,
    model: nn.Module,
    opt: torch.optim.Optimizer,
    rank: int,
) -> int:
    """The steps already completed: every rank, the newest step all ranks hold in shared
    memory; else rank 0 from the disk (the others' answer is not used: rank 0 broadcasts)."""
    restored = snap.restore(model, opt)
    if isinstance(restored, Restored):
        if rank == 0:
            print(f"rank 0: resuming after step {restored.step} from shared memory", flush=True)
        return restored.step
    return resume_from_disk(fs, root, spe, model, opt) if rank == 0 else 0


def resume_from_disk(
    fs: fsspec.AbstractFileSystem, root: str, spe: int, model: nn.Module, opt: torch.optim.Optimizer
) -> int:
    """Rank 0: load the newest checkpoint (a stop's or an epoch's); the steps it completed. A
    stop at an epoch's last step leaves both at the same step: the stop's is the one a resume
    says it came from, and it holds the optimizer's state too."""
    found = latest_checkpoint(fs, root)
    stopped = latest_stop_checkpoint(fs, root)
    if stopped and (not found or stopped[0] >= found[0] * spe):
        step = load_stop_checkpoint(fs, stopped[1], model, opt)
        print(f"resuming from step {step}", flush=True)
        return step
    if found:
        epoch = load_checkpoint(fs, found[1], model)
        print(f"rank 0: resuming after epoch {epoch} from {found[1]}", flush=True)
        return epoch * spe
    return 0


def load_checkpoint(fs: fsspec.AbstractFileSystem, path: str, model: nn.Module) -> int:
    with fs.open(path, "rb") as f:
        state = torch.load(f, weights_only=True)
    model.load_state_dict(state["model"])
    return int(state["epoch"])


# --------------------------------------------------------------------------- training
def params_sha256(model: nn.Module) -> str:
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)  # one thread: the same float summation order every run
    torch.use_deterministic_algorithms(True)
    rank, world = init_distributed()
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    print(f"rank {rank}/{world}: started (restart {restart})", flush=True)

    fs, root = fsspec.core.url_to_fs(args.checkpoint_dir)
    spe = args.steps_per_epoch
    model = make_model(args.seed)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)  # the parameters DDP will wrap
    # replicated: DDP keeps the model and optimizer state equal on every rank, so a node that
    # is lost and replaced (--spares) gets the step back from its peers (docs/recovery.md)
    snap = Snapshotter(every=args.snapshot_every, replicated=True)
    done = torch.tensor([resume(snap, fs, root, spe, model, opt, rank)])  # steps completed
    dist.broadcast(done, src=0)
    start = int(done[0])
    ddp = DistributedDataParallel(model)  # broadcasts rank 0's parameters to every rank
    loss_fn = nn.MSELoss()
    # DDP regroups its gradient buckets after its first backward pass, and gloo's all_reduce
    # sums an element in an order that depends on where it sits in its bucket. A resumed run's
    # first real step would then sum differently from an undisturbed run's step at the same
    # point, and the results would drift apart in the last bits. One throwaway pass (its
    # gradients are dropped, the optimizer does not step) makes every run train on the
    # regrouped buckets from its first real step, so resuming is bit-for-bit exact.
    x, _ = batch(args.seed, 0, rank, 0)
    ddp(x).sum().backward()
    opt.zero_grad(set_to_none=True)

    def completed(step: int) -> bool:
        """Step ``step`` (counted from the start) is done: commit it, then say so; True when
        every rank is to stop after it (then the state is saved)."""
        snap.commit(step, model=model, optimizer=opt)
        if args.print_steps:
            dist.barrier()  # every rank has committed: a restart resumes after this step
            if rank == 0:
                print(f"step {step}", flush=True)
        # Cheap (one stat()) until a stop is requested; then every rank gets True after the
        # same step, so nobody waits in a collective for a rank that has left.
        if not stop.requested(step):
            return False
        if rank == 0:
            save_stop_checkpoint(fs, root, step, model, opt)
            print(f"stopping at step {step}: checkpoint saved", flush=True)
        dist.barrier()  # the checkpoint is complete before any rank leaves
        snap.close(remove=True)  # the disk holds it all; the node's memory goes back
        return True

    for epoch in range(start // spe + 1, args.epochs + 1):
        first = start % spe if epoch == start // spe + 1 else 0
        for step in range(first, spe):
            x, y = batch(args.seed, epoch, rank, step)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(ddp(x), y)
            loss.backward()
            opt.step()
            if args.step_sleep:
                time.sleep(args.step_sleep)
            # an epoch's last step is committed after its checkpoint
            if step < spe - 1 and completed((epoch - 1) * spe + step + 1):
                return 0
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        mean /= world
        if rank == 0:
            save_checkpoint(fs, root, epoch, model)
            print(f"epoch {epoch}: loss {mean.item():.6f}", flush=True)
        # Nobody races ahead of a checkpoint that is still being written.
        dist.barrier()
        # Committed once the checkpoint exists: a resume after this step starts the next epoch
        # and never skips an epoch's checkpoint.
        if completed(epoch * spe):
            return 0

    # The final loss on a fixed evaluation batch: defined even when a resumed run had nothing
    # left to train.
    with torch.no_grad():
        x, y = batch(args.seed, 0, rank, 0)
        final = loss_fn(model(x), y)
    dist.all_reduce(final)
    final /= world
    digest = params_sha256(model)
    print(f"rank {rank}/{world}: final loss {final.item():.6f} params sha256 {digest}", flush=True)
    if rank == 0 and args.out:
        result = {
            "world_size": world,
            "epochs": args.epochs,
            "final_loss": final.item(),
            "params_sha256": digest,
            "restart_count": int(restart),
        }
        with fsspec.open(args.out, "w") as f:
            json.dump(result, f)
    dist.barrier()  # every rank is past its last collective: leaving now strands nobody
    snap.close(remove=True)  # training is over: no restart will need the snapshots
    return 0


if __name__ == "__main__":
    code = main()
    # Leave without tearing torch down. With torch 2.13 on a busy host, ProcessGroupGloo's
    # destructor (destroy_process_group, or interpreter exit) sometimes deadlocks: it joins its
    # worker threads while holding the GIL that one of them waits for. The interpreter's final
    # sweep over torch's objects also costs a second or more per process. Results are written
    # and the barrier above has passed, so there is nothing left to clean up.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
