"""Measure 19's Lightning contender: preempt_train.py's model, data, steps and events as a
LightningModule, trained by Lightning 2.5.6's ``Trainer`` under Slurm with what Lightning's docs
give for a preemptible cluster and nothing more: ``SLURMEnvironment(auto_requeue=True)`` (its
requeue signal USR1, which lightning_preempt.sbatch asks Slurm for with ``--signal=USR1@90``).

What Lightning then does (read from its 2.5.6 source, ``_SignalConnector``): on USR1 every rank,
inside its signal handler and wherever it is, calls ``trainer.save_checkpoint(hpc_ckpt_N)``
(rank 0 writes it), and rank 0 runs ``scontrol requeue``; a new attempt resumes from the newest
``hpc_ckpt_*``. On SIGTERM (what a preemption sends the tasks) the ranks agree at the next step
(a broadcast from rank 0) and raise ``SIGTERMException``: the process ends without a checkpoint.

The slow checkpoint of the other contenders: a ``CheckpointIO`` that sleeps ``--save-seconds``
before Lightning's own atomic save, and notes ``save-begin``/``saved``. Runs in the benchmark's
own venv (lightning is never a project dependency); train_ddp.py and preempt_train.py are copied
beside this file.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from datetime import timedelta
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import lightning.pytorch as pl  # noqa: E402
import preempt_train as pt  # noqa: E402
import torch  # noqa: E402
import train_ddp as recipe  # noqa: E402
from lightning.pytorch.plugins.environments import SLURMEnvironment  # noqa: E402
from lightning.pytorch.plugins.io import TorchCheckpointIO  # noqa: E402
from lightning.pytorch.strategies import DDPStrategy  # noqa: E402


class SlowIO(TorchCheckpointIO):
    def __init__(self, module: Module) -> None:
        super().__init__()
        self.module = module

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None
    ) -> None:
        step = int(checkpoint["global_step"])
        self.module.ev("save-begin", step)
        time.sleep(self.module.args.save_seconds)
        super().save_checkpoint(checkpoint, path, storage_options)
        self.module.ev("saved", step)


class Module(pl.LightningModule):
    def __init__(self, args: Any) -> None:
        super().__init__()
        self.args = args
        self.model = recipe.make_model(args.seed)
        self.loss_fn = torch.nn.MSELoss()
        self.ev: Any = lambda *a, **k: None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        # the step counted from the start, as preempt_train.py's: its batch, whatever was resumed
        x, y = recipe.batch(self.args.seed, 0, self.global_rank, self.trainer.global_step + 1)
        return self.loss_fn(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.model.parameters(), lr=0.1)

    def train_dataloader(self) -> Any:
        return torch.utils.data.DataLoader(range(self.args.steps), batch_size=None)


class Events(pl.Callback):
    def setup(self, trainer: pl.Trainer, module: Module, stage: str) -> None:
        module.ev = pt.Events(module.args.events, trainer.global_rank)

    def on_train_start(self, trainer: pl.Trainer, module: Module) -> None:
        start = trainer.global_step
        module.ev("start", start, run_id=None)
        if start and trainer.global_rank == 0:
            print(f"resuming from step {start}", flush=True)
        # preempt_train.py's throwaway pass: DDP's regrouped buckets from the first real step
        x, _ = recipe.batch(module.args.seed, 0, trainer.global_rank, 0)
        with torch.enable_grad():
            _direct(trainer.strategy.model, module, x).sum().backward()
        for p in module.parameters():
            p.grad = None

    def on_train_batch_end(self, trainer: pl.Trainer, module: Module, *_: Any) -> None:
        module.ev("step", trainer.global_step)
        if module.args.step_sleep:
            time.sleep(module.args.step_sleep)

    def on_train_end(self, trainer: pl.Trainer, module: Module) -> None:
        digest = recipe.params_sha256(module.model)
        if trainer.global_rank == 0:
            with open(module.args.out, "w") as f:
                json.dump({"params_sha256": digest, "steps": module.args.steps}, f)
        module.ev("done", trainer.global_step, sha=digest)


def _direct(ddp: Any, module: Module, x: torch.Tensor) -> torch.Tensor:
    """One forward through DDP that runs the model, not Lightning's training_step."""
    wrapper = ddp.module
    saved = wrapper.forward
    wrapper.forward = lambda inp: module.model(inp)
    try:
        out: torch.Tensor = ddp(x)
    finally:
        wrapper.forward = saved
    return out


def main(argv: list[str] | None = None) -> int:
    args = pt.parse(argv)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    module = Module(args)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=int(os.environ["SLURM_NTASKS_PER_NODE"]),
        num_nodes=int(os.environ["SLURM_NNODES"]),
        strategy=DDPStrategy(
            process_group_backend="gloo",
            timeout=timedelta(seconds=120),
            checkpoint_io=SlowIO(module),
        ),
        plugins=[SLURMEnvironment(auto_requeue=True, requeue_signal=signal.SIGUSR1)],
        max_steps=args.steps,
        max_epochs=-1,
        default_root_dir=args.checkpoint_dir,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
        deterministic=True,
        callbacks=[Events()],
    )
    trainer.fit(module)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # as preempt_train.py: no gloo teardown (it can deadlock at exit)
