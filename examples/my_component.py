"""A custom component: your team's training job as one typed function.

Run it by file name (no installation needed)::

    xrun run -s local_cwd examples/my_component.py:hello --who world
    xrun run --dryrun examples/my_component.py:trainer --epochs 5 -j 1x2
    xrun run -s local_cwd examples/my_component.py:trainer --epochs 1 -j 1x2
    xrun run examples/my_component.py:trainer --help

A component is a plain function returning an AppDef. xrun turns its signature into command-line
options (every parameter needs a type annotation: str, int, float, bool, Optional[X],
list[str|int|float] or dict[str, str]) and its Google-style docstring into ``--help``.
Start from a builtin's source with ``xrun builtins --print dist.ddp``, or build on one, as
here. To share components, put them in a package and register the module under the entry point
group ``xrun.components`` (``myteam = "myteam.components"`` makes ``myteam.trainer``).
"""

from __future__ import annotations

from xrun.components import DEFAULT_IMAGE, dist
from xrun.errors import UsageError
from xrun.specs import AppDef, Role


def hello(who: str = "world", replicas: int = 1, image: str = DEFAULT_IMAGE) -> AppDef:
    """Greet from every replica: the smallest useful component.

    Args:
        who: whom to greet
        replicas: how many replicas greet (each says its own ${replica_id})
        image: container image (docker only)
    """
    return AppDef(
        name="hello",
        roles=[
            Role(
                name="greeter",
                image=image,
                entrypoint="echo",
                args=[f"hello {who} from replica ${{replica_id}} of ${{app_id}}"],
                num_replicas=replicas,
            )
        ],
    )


def trainer(
    *extra_args: str,
    epochs: int = 3,
    lr: float = 0.1,
    j: str = "1x2",
    h: str | None = None,
    checkpoint_dir: str = "./outputs/trainer-ckpt",
    tags: list[str] | None = None,
    env: dict[str, str] | None = None,
    debug: bool = False,
) -> AppDef:
    """Train the example DDP model (examples/train_ddp.py) with the team's defaults.

    Args:
        extra_args: more arguments for the training script
        epochs: how many passes over the synthetic data
        lr: the learning rate
        j: [[MIN:]NNODES x]NPROC, e.g. 1x2 or 2x2
        h: a named resource such as gpu.small (default: 2 CPUs, 1 GiB per node)
        checkpoint_dir: where each epoch's checkpoint goes (the job resumes from the last one)
        tags: labels recorded in the app's metadata, e.g. baseline,fast
        env: extra environment variables, k=v,k2=v2
        debug: turn on torch's distributed debug output
    """
    if epochs < 1:
        # A UsageError is how a component reports a user's mistake: one line, exit 2.
        raise UsageError(f"trainer: --epochs {epochs} is invalid; expected an integer >= 1")
    app = dist.ddp(
        "--epochs",
        str(epochs),
        "--lr",
        str(lr),
        "--checkpoint-dir",
        checkpoint_dir,
        *extra_args,
        script="examples/train_ddp.py",
        name="trainer",  # the run (app) name; "EXP/RUN" also names an experiment
        j=j,
        h=h,
        env={"OMP_NUM_THREADS": "1", **(env or {})},
        debug=debug,
    )
    app.metadata["tags"] = ",".join(tags or [])
    return app
