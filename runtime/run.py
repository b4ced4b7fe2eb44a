"""torchrun as a library call: ``torch.distributed.run``'s counterpart.

``main(["--nproc-per-node=2", "train.py"])`` parses torchrun's flags and runs the agent in
this process; a bad flag raises ``ValueError`` (xrun's ``UsageError``), failed workers raise
``ChildFailedError`` (its root cause's error file copied to ``$TORCHELASTIC_ERROR_FILE`` by
``@record``, as torch's ``main``). The command line, ``python -m xrun.runtime``, prints the
same failures as one line or the summary and exits with a code instead (``__main__.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

from .api import launch_agent
from .args import build_parser as get_args_parser
from .args import parse as config_from_args
from .args import parse_nnodes as parse_min_max_nnodes
from .errors import record

__all__ = ["config_from_args", "get_args_parser", "main", "parse_min_max_nnodes", "run"]


def run(args: Sequence[str] | None = None) -> None:
    """Parse torchrun's ``args`` and run this node's agent until the job ends."""
    config, entrypoint, cmd_args = config_from_args(args)
    launch_agent(config, entrypoint, list(cmd_args))


@record
def main(args: Sequence[str] | None = None) -> None:
    run(args)
