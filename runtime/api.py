"""``xrun.runtime.launch``: run xrun's agent from Python (a notebook, a test, another tool),
with torch's ``torch.distributed.launcher.api`` names (``elastic_launch``, ``launch_agent``,
``LaunchConfig``).

::

    from xrun.runtime import LaunchConfig, launch

    def train(lr: float) -> float:
        ...                       # runs in every worker, with RANK/WORLD_SIZE/... set
        return loss

    losses = launch(LaunchConfig(nproc_per_node=2), train)(0.1)   # {global_rank: loss}

The call blocks while this node's part of the job runs (rendezvous, workers, restarts) and
returns the return values of this node's workers by global rank. When the job fails it raises
``ChildFailedError`` (workers failed, restarts used up), ``SignalException`` (the agent got a
signal it handles) or ``AgentFailedError`` (a peer closed the job, the rendezvous timed out);
the message is the summary the command line prints.

Same code path as the command line: ``python -m xrun.runtime`` only turns flags into a
``LaunchConfig`` and calls the same ``Agent``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .agent import Agent
from .args import entrypoint_name
from .config import LaunchConfig
from .errors import AgentFailedError, ChildFailedError, SignalException

__all__ = [
    "AgentFailedError",
    "ChildFailedError",
    "LaunchConfig",
    "SignalException",
    "elastic_launch",
    "entrypoint_name",
    "launch",
    "launch_agent",
]


def launch_agent(
    config: LaunchConfig, entrypoint: Callable[..., Any] | str, args: Sequence[Any]
) -> dict[int, Any]:
    """Run this node's agent for ``config``; ``{global_rank: return value}`` (None for a
    binary) or the exception the failure calls for (see the module doc)."""
    name = entrypoint_name(entrypoint, args)
    result = Agent(config, entrypoint, tuple(args), name=name).run()
    if result.exitcode == 0:
        return result.return_values
    if result.failures:
        raise ChildFailedError(name, result.failures)
    if result.exitcode > 128:
        raise SignalException(result.message, result.exitcode - 128)
    raise AgentFailedError(result.message, result.exitcode)


class elastic_launch:  # noqa: N801 - torch's name
    """``elastic_launch(config, fn)(*args)`` -> ``{global_rank: fn(*args)}`` (torch's class)."""

    def __init__(self, config: LaunchConfig, entrypoint: Callable[..., Any] | str) -> None:
        self._config = config
        self._entrypoint = entrypoint

    def __call__(self, *args: Any) -> dict[int, Any]:
        return launch_agent(self._config, self._entrypoint, list(args))


def launch(
    config: LaunchConfig, entrypoint: Callable[..., Any] | str
) -> Callable[..., dict[int, Any]]:
    """``launch(config, fn)(*args)`` -> ``{global_rank: fn(*args)}`` for this node's workers.

    ``entrypoint`` may also be a binary path (its return values are then ``None``). A function
    must be importable by the workers (defined in a module, not in ``__main__`` of a notebook
    cell) unless ``config.start_method == "fork"``. Script-style ``"${local_rank}"`` arguments
    are substituted as on the command line.
    """
    return elastic_launch(config, entrypoint)
