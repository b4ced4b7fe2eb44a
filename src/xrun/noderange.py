"""The ``[MIN:]N`` grammar of a node count, shared by ``-j`` (``specs/jobspec.py``) and the runtime
agent's ``--nnodes`` (``runtime/args.py``): one fixed count ``N``, or an elastic ``MIN:MAX``.

Parts are plain ASCII digits (no sign, no spaces, none of the other scripts' digits that
``int()`` reads), and a number too large for any limit is capped rather than converted
(``xrun.limits.capped_int``), so a 5,000-digit count is an error message, not a ValueError.
What a count may be (MIN 0 or not, the limits) and how a mistake is worded stay with each
caller: ``-j 0:1x4`` may start with no node running, an agent is always one. Standard library
only: both the dry run and the agent's start-up import it.
"""

from __future__ import annotations

from xrun.contract import MAX_NODES
from xrun.limits import capped_int, is_digits
from xrun.record import Value

__all__ = ["NodeRange", "parse_node_range"]


class NodeRange(Value):
    """Between ``min`` and ``max`` nodes (equal: a fixed count). A value
    (:class:`xrun.record.Value`): benchmarks 1 and 5 both import it, and making a NamedTuple
    class costs about a millisecond (a dataclass a few hundred microseconds)."""

    min: int
    max: int

    @property
    def elastic(self) -> bool:
        return self.min != self.max

    def __str__(self) -> str:
        return str(self.max) if not self.elastic else f"{self.min}:{self.max}"


def parse_node_range(text: str, cap: int = MAX_NODES) -> NodeRange | None:
    """``N`` -> NodeRange(N, N), ``MIN:MAX`` -> NodeRange(MIN, MAX); None when ``text`` is not
    of that form. A number over ``cap`` reads as ``cap + 1``: the caller reports the limit.
    Neither the order of MIN and MAX nor a zero is checked here."""
    parts = text.split(":")
    if len(parts) > 2 or not all(is_digits(p) for p in parts):
        return None
    return NodeRange(capped_int(parts[0], cap), capped_int(parts[-1], cap))
