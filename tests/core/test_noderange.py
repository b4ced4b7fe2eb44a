"""The one ``[MIN:]N`` grammar (``xrun.noderange``) that ``-j`` and the agent's ``--nnodes``
both read, and that each reads it the same way."""

from __future__ import annotations

import pytest

from xrun.contract import MAX_NODES
from xrun.errors import UsageError
from xrun.noderange import NodeRange, parse_node_range
from xrun.runtime.args import parse_nnodes as agent_nnodes
from xrun.specs.jobspec import parse_j


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4", NodeRange(4, 4)),
        ("1:3", NodeRange(1, 3)),
        ("0:1", NodeRange(0, 1)),  # a zero is the caller's to refuse (-j allows MIN 0)
        ("3:2", NodeRange(3, 2)),  # so is the order
        ("007", NodeRange(7, 7)),
        ("9" * 5000, NodeRange(MAX_NODES + 1, MAX_NODES + 1)),  # capped, never int()-ed
        ("1:" + "9" * 30, NodeRange(1, MAX_NODES + 1)),
    ],
)
def test_the_grammar_reads(text: str, expected: NodeRange) -> None:
    assert parse_node_range(text) == expected


@pytest.mark.parametrize(
    "text",
    ["", ":", "1:", ":2", "1:2:3", "-1", "+2", " 2", "2 ", "1x2", "\uff12", "\u00b2", "0x10"],
)
def test_what_is_not_the_grammar(text: str) -> None:
    assert parse_node_range(text) is None


def test_a_range_is_a_frozen_value_that_prints_as_it_reads() -> None:
    nodes = NodeRange(2, 4)
    assert nodes.elastic and str(nodes) == "2:4" and str(NodeRange(3, 3)) == "3"
    assert parse_node_range(str(nodes)) == nodes
    with pytest.raises(AttributeError):
        nodes.min = 1  # type: ignore[misc]


@pytest.mark.parametrize("text", ["2", "1:4", "3:3"])
def test_j_and_nnodes_agree_where_both_accept(text: str) -> None:
    j = parse_j(f"{text}x1")
    assert (j.min_nnodes, j.max_nnodes) == agent_nnodes(text)


@pytest.mark.parametrize("text", ["1:2:3", "\uff12", "a", "2:1"])
def test_j_and_nnodes_refuse_the_same_forms(text: str) -> None:
    with pytest.raises(UsageError, match="-j"):
        parse_j(f"{text}x1")
    with pytest.raises(UsageError, match="--nnodes"):
        agent_nnodes(text)
