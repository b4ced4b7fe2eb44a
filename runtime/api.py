"""``xrun.runtime.launch``: run xrun's agent from Python (a notebook, a test, another tool).

::

    from xrun.runtime import LaunchConfig, launch

    def train(lr: float) -> float:
        ...                       # runs in every worker, with RANK/WORLD_SIZE/... set
        return loss

    losses = launch(LaunchConfig(nproc_per_node=2), train)(0.1)   # {global_rank: loss}

The call blocks while this node's part of the job runs (rendezvous, workers, restarts) and
returns the return values of this node's workers by global rank. When the job fails it raises
``ChildFailedError`` (workers failed, restarts used up) or ``AgentFailedError`` (a peer closed
the job, the rendezvous timed out, a signal); the message is the summary the command line prints.

Same code path as the command line: ``python -m xrun.runtime`` only turns flags into a
``LaunchConfig`` and calls the same ``Agent``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .agent import Agent
from .config import LaunchConfig
from .errors import AgentFailedError, ChildFailedError

__all__ = ["AgentFailedError", "ChildFailedError", "LaunchConfig", "launch"]


def launch(
    config: LaunchConfig, entrypoint: Callable[..., Any] | str
) -> Callable[..., dict[int, Any]]:
    """``launch(config, fn)(*args)`` -> ``{global_rank: fn(*args)}`` for this node's workers.

    ``entrypoint`` may also be a binary path (its return values are then ``None``). A function
    must be importable by the workers (defined in a module, not in ``__main__`` of a notebook
    cell) unless ``config.start_method == "fork"``. Script-style ``"${local_rank}"`` arguments
    are substituted as on the command line.
    """

    def run(*args: Any) -> dict[int, Any]:
        name = (
            entrypoint
            if isinstance(entrypoint, str)
            else getattr(entrypoint, "__qualname__", repr(entrypoint))
        )
        result = Agent(config, entrypoint, tuple(args), name=name).run()
        error = result.error(name)
        if error is not None:
            raise error
        return result.return_values

    return run
