"""Measure 19's training job: examples/train_ddp.py's model, data, checkpoint and resume, one
flat loop of ``--steps`` steps, whose stop checkpoint takes ``--save-seconds`` on purpose.

Every contender runs this same file (copied beside ``train_ddp.py`` into the job's dir); only
how a preemption reaches the loop differs (``--stop``):

* ``xrun``: ``xrun.runtime.stop.requested(step)`` after every step (examples/train_ddp.py's
  recipe): every rank gets True after the same step, rank 0 saves, every rank exits 0 and the
  batch script that xrun wrote requeues the job once.
* ``sigterm``: the pattern people write for torchrun under sbatch: a SIGTERM handler only sets a
  flag; after every step the ranks ``all_reduce(MAX)`` the flag (so that they agree on the
  step: a rank leaving alone would hang the others), rank 0 saves, every rank exits 0 and the
  hand-written sbatch script (torchrun_preempt.sbatch) requeues the job.
* ``submitit``: submitit's way (``SubmititTrainer`` below): submitit calls ``checkpoint()`` in
  global rank 0's USR2 handler, wherever that rank is; it saves the last completed step, and
  submitit requeues the job. The other ranks are not told.

Whatever the stop, the checkpoint is complete only after ``--save-seconds`` (the sleep sits
between the start of the save and the rename that publishes it). Each rank appends what happens
(start, every step, stop, save, end) as JSON lines to ``--events``, with the wall time: the
benchmark reads its figures from there.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # train_ddp.py is copied beside this file


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--step-sleep", type=float, default=0.2)
    p.add_argument("--save-seconds", type=float, default=0.0)
    p.add_argument("--stop", choices=("xrun", "sigterm", "none"), default="none")
    p.add_argument("--checkpoint-dir", required=True)
    p.add_argument("--events", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


class Events:
    def __init__(self, path: str, rank: int) -> None:
        self.path, self.rank = path, rank
        self.attempt = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
        self.job = os.environ.get("SLURM_JOB_ID")

    def __call__(self, kind: str, step: int | None = None, **more: Any) -> None:
        line = {"t": time.time(), "rank": self.rank, "attempt": self.attempt, "job": self.job}
        line["kind"] = kind
        line.update(step=step, **more)
        # One short write per line with O_APPEND: lines of several ranks never interleave.
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, (json.dumps(line) + "\n").encode())
        finally:
            os.close(fd)


class Training:
    """The model, optimizer and loop; ``should_stop`` is the contender's stop check."""

    def __init__(self, args: argparse.Namespace) -> None:
        import fsspec
        import torch
        import torch.distributed as dist
        import train_ddp as recipe
        from torch.nn.parallel import DistributedDataParallel

        self.args, self.recipe, self.torch, self.dist = args, recipe, torch, dist
        torch.set_num_threads(1)
        torch.use_deterministic_algorithms(True)
        self.rank, self.world = recipe.init_distributed()
        self.ev = Events(args.events, self.rank)
        self.fs, self.root = fsspec.core.url_to_fs(args.checkpoint_dir)
        self.model = recipe.make_model(args.seed)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        start = 0
        if self.rank == 0:
            found = recipe.latest_stop_checkpoint(self.fs, self.root)
            if found:
                start = recipe.load_stop_checkpoint(self.fs, found[1], self.model, self.opt)
        done = torch.tensor([start])
        dist.broadcast(done, src=0)
        self.start = self.step = int(done[0])
        self.ev("start", self.start, run_id=os.environ.get("XRUN_RUN_ID"))
        if self.start and self.rank == 0:
            print(f"resuming from step {self.start}", flush=True)
        self.ddp = DistributedDataParallel(self.model)
        # The throwaway pass of examples/train_ddp.py: DDP's regrouped buckets from step one.
        x, _ = recipe.batch(args.seed, 0, self.rank, 0)
        self.ddp(x).sum().backward()
        self.opt.zero_grad(set_to_none=True)
        self.loss_fn = torch.nn.MSELoss()

    def train(self, should_stop: Any) -> int:
        args = self.args
        for step in range(self.start + 1, args.steps + 1):
            x, y = self.recipe.batch(args.seed, 0, self.rank, step)
            self.opt.zero_grad(set_to_none=True)
            self.loss_fn(self.ddp(x), y).backward()
            self.opt.step()
            self.step = step
            self.ev("step", step)
            if args.step_sleep:
                time.sleep(args.step_sleep)
            if should_stop(step):
                self.ev("stop", step)
                if self.rank == 0:
                    self.save(step)
                    print(f"stopping at step {step}: checkpoint saved", flush=True)
                    open("stopped", "w").close()  # torchrun_preempt.sbatch: requeue the job
                self.dist.barrier()  # the checkpoint is complete before any rank leaves
                self.ev("exit", step)
                return 0
        digest = self.recipe.params_sha256(self.model)
        if self.rank == 0:
            with open(args.out, "w") as f:
                json.dump({"params_sha256": digest, "steps": args.steps}, f)
        self.ev("done", args.steps, sha=digest)
        self.dist.barrier()
        return 0

    def save(self, step: int) -> None:
        """The slow checkpoint: complete (renamed into place) only after --save-seconds."""
        self.ev("save-begin", step)
        time.sleep(self.args.save_seconds)
        self.recipe.save_stop_checkpoint(self.fs, self.root, step, self.model, self.opt)
        self.ev("saved", step)


def _sigterm_check(t: Training) -> Any:
    """torchrun's pattern: the handler only sets a flag; the ranks agree on it every step."""
    flag = {"set": False}

    def handler(signum: int, frame: object) -> None:
        flag["set"] = True
        t.ev("signal", t.step, sig=signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, handler)

    def check(step: int) -> bool:
        x = t.torch.tensor([1 if flag["set"] else 0])
        t.dist.all_reduce(x, op=t.dist.ReduceOp.MAX)
        return bool(x.item())

    return check


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    t = Training(args)
    if args.stop == "xrun":
        from xrun.runtime import stop

        return t.train(stop.requested)
    if args.stop == "sigterm":
        return t.train(_sigterm_check(t))
    return t.train(lambda step: False)


class SubmititTrainer:
    """submitit's checkpointable callable: ``__call__`` trains, ``checkpoint()`` (called by
    submitit in global rank 0's USR2 handler) saves and asks for the same call again."""

    def __init__(self, argv: list[str]) -> None:
        self.argv = argv
        self.training: Training | None = None

    def __call__(self) -> int:
        import submitit

        submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
        self.training = Training(parse(self.argv))
        return self.training.train(lambda step: False)

    def checkpoint(self) -> Any:
        import submitit

        t = self.training
        if t is not None:  # inside a signal handler: the last step this rank completed
            t.ev("stop", t.step)
            t.save(t.step)
        return submitit.helpers.DelayedSubmission(SubmititTrainer(self.argv))


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # as examples/train_ddp.py: no gloo teardown (it can deadlock at exit)
