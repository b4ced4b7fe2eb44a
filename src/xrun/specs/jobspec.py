"""The ``-j`` grammar: how many nodes and how many processes per node.

``[[MIN:]NNODES x]NPROC``::

    4       one node, 4 processes
    2x4     2 nodes, 4 processes each
    1:3x8   elastic: between 1 and 3 nodes, 8 processes each
    0:1x4   elastic: 0 or 1 node (the scheduler may start the job with none running)

The ``[MIN:]NNODES`` part is ``xrun.noderange``'s grammar, the one the runtime agent's
``--nnodes`` reads too. Anything else is a :class:`~xrun.errors.UsageError` that names the bad
part and shows these examples, and so is a size over the documented limits
(:data:`~xrun.contract.MAX_NODES` nodes, :data:`~xrun.contract.MAX_NPROC_PER_NODE` processes
per node). Standard library only: this is on the start-up path of every ``xrun run``.
"""

from __future__ import annotations

from typing import NamedTuple

from xrun.contract import MAX_NODES, MAX_NPROC_PER_NODE
from xrun.errors import UsageError
from xrun.limits import capped_int, is_digits, shown
from xrun.noderange import NodeRange, parse_node_range

_EXAMPLES = "e.g. -j 4 (1 node x 4), -j 2x4 (2 nodes x 4), -j 1:3x8 (elastic 1..3 nodes x 8)"
_FORM = "[[MIN:]NNODES x]NPROC"


class JobSize(NamedTuple):
    """A parsed ``-j``: ``min_nnodes <= max_nnodes`` nodes of ``nproc_per_node`` processes."""

    min_nnodes: int
    max_nnodes: int
    nproc_per_node: int

    @property
    def nodes(self) -> NodeRange:
        return NodeRange(self.min_nnodes, self.max_nnodes)

    @property
    def elastic(self) -> bool:
        return self.nodes.elastic

    def nnodes_arg(self) -> str:
        """``MIN:MAX`` for the runtime agent's ``--nnodes``.

        The agent is itself one node, so it needs at least 1 even when the scheduler may run
        zero replicas (``-j 0:1x4``).
        """
        return f"{max(self.min_nnodes, 1)}:{self.max_nnodes}"

    def __str__(self) -> str:
        return f"{self.nodes}x{self.nproc_per_node}"


def _why(text: str) -> str:
    """The specific reason ``text`` is not ``[[MIN:]NNODES x]NPROC`` (for the error message)."""
    if not text.strip():
        return "it is empty"
    if text != text.strip() or " " in text:
        return "it contains spaces"
    if text.count("x") > 1:
        return "it has more than one 'x'"
    nodes, sep, nproc = text.rpartition("x")
    if sep and not nodes:
        return "NNODES before 'x' is missing"
    if sep and not nproc:
        return "NPROC after 'x' is missing"
    if not sep and ":" in text:
        return "an elastic MIN:MAX needs 'xNPROC' after it"
    if ":" in nproc:
        return f"':' belongs in the NNODES part (MIN:MAX before 'x'), not in {nproc!r}"
    for part in [*(nodes.split(":") if sep else []), nproc]:
        if part.startswith("-"):
            return f"{part!r} is negative"
        if not part:
            return "a number is missing around ':'"
        if not is_digits(part):
            return f"{shown(part)} is not a whole number (ASCII digits 0-9)"
    return "it does not match the form"


def parse_j(text: str) -> JobSize:
    """Parse ``-j``; raise UsageError naming the bad part and the expected form."""
    # Plain ASCII digits only (no sign, no spaces, no '0x' surprises from int(), none of the
    # other scripts' digits that int() accepts: '-j １x２').
    nodes_text, sep, nproc_text = text.rpartition("x")
    nodes = parse_node_range(nodes_text) if sep else NodeRange(1, 1)
    if nodes is None or not is_digits(nproc_text):
        raise UsageError(
            f"-j {shown(text)} is invalid: {_why(text)}; expected {_FORM}, {_EXAMPLES}"
        )
    nproc = capped_int(nproc_text, MAX_NPROC_PER_NODE)
    min_nnodes, nnodes = nodes.min, nodes.max
    _check_limits(text, min_nnodes, nnodes, nproc)
    if nproc < 1:
        raise UsageError(f"-j {shown(text)} is invalid: NPROC must be >= 1; {_EXAMPLES}")
    if nnodes < 1:
        raise UsageError(f"-j {shown(text)} is invalid: NNODES must be >= 1; {_EXAMPLES}")
    if min_nnodes > nnodes:
        raise UsageError(
            f"-j {shown(text)} is invalid: MIN {min_nnodes} is greater than NNODES {nnodes} "
            f"(write MIN:MAX, e.g. -j {nnodes}:{min_nnodes}x{nproc}); {_EXAMPLES}"
        )
    return JobSize(min_nnodes, nnodes, nproc)


def _check_limits(text: str, min_nnodes: int, nnodes: int, nproc: int) -> None:
    for value, limit, what in (
        (nnodes, MAX_NODES, "NNODES"),
        (min_nnodes, MAX_NODES, "MIN"),
        (nproc, MAX_NPROC_PER_NODE, "NPROC"),
    ):
        if value > limit:
            raise UsageError(
                f"-j {shown(text)} is invalid: {what} is over the limit of {limit:,} "
                f"(at most {MAX_NODES:,} nodes of {MAX_NPROC_PER_NODE:,} processes); {_EXAMPLES}"
            )


def parse_nnodes(text: str) -> NodeRange:
    """``[MIN:]NNODES`` (no process count; used by ``dist.spmd``)."""
    nodes = parse_node_range(text)
    if nodes is None:
        raise UsageError(
            f"-j {shown(text)} is invalid: expected [MIN:]NNODES, e.g. -j 2 or -j 1:4 "
            "(processes per node come from the named resource's GPUs)"
        )
    _check_limits(text, nodes.min, nodes.max, 1)
    if nodes.max < 1 or nodes.min > nodes.max:
        raise UsageError(
            f"-j {shown(text)} is invalid: need NNODES >= 1 and MIN <= NNODES, e.g. -j 2 or -j 1:4"
        )
    return nodes
