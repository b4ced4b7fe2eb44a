"""The ``-j`` grammar ``[[MIN:]NNODES x]NPROC``."""

from __future__ import annotations

import pytest

from xrun.errors import UsageError
from xrun.noderange import NodeRange
from xrun.specs.jobspec import JobSize, parse_j, parse_nnodes


@pytest.mark.parametrize(
    "text, expected",
    [
        ("4", JobSize(1, 1, 4)),
        ("1", JobSize(1, 1, 1)),
        ("2x4", JobSize(2, 2, 4)),
        ("1:3x8", JobSize(1, 3, 8)),
        ("0:1x4", JobSize(0, 1, 4)),
        ("16x8", JobSize(16, 16, 8)),
        ("2:2x1", JobSize(2, 2, 1)),
    ],
)
def test_valid(text: str, expected: JobSize) -> None:
    assert parse_j(text) == expected


@pytest.mark.parametrize(
    "text, why",
    [
        ("x4", "NNODES before 'x' is missing"),
        ("1x", "NPROC after 'x' is missing"),
        (":2", "needs 'xNPROC'"),
        ("1x2:3", "':' belongs in the NNODES part"),
        ("2x2x2", "more than one 'x'"),
        ("0x1", "NNODES must be >= 1"),
        ("3:2x1", "MIN 3 is greater than NNODES 2"),
        ("-1x2", "'-1' is negative"),
        ("2x-1", "'-1' is negative"),
        ("ax2", "'a' is not a whole number"),
        ("2xb", "'b' is not a whole number"),
        ("1x0", "NPROC must be >= 1"),
        ("0", "NPROC must be >= 1"),
        ("", "it is empty"),
        (" 2x2", "contains spaces"),
        ("2 x 2", "contains spaces"),
        ("1.5x2", "'1.5' is not a whole number"),
        ("2X2", "'2X2' is not a whole number"),
    ],
)
def test_invalid_names_the_problem_and_shows_examples(text: str, why: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_j(text)
    msg = str(info.value)
    assert why in msg
    assert repr(text) in msg
    assert "2x4" in msg and "1:3x8" in msg  # the valid examples
    assert "\n" not in msg


def test_nnodes_arg_never_asks_the_agent_for_zero_nodes() -> None:
    assert parse_j("0:1x4").nnodes_arg() == "1:1"
    assert parse_j("1:3x8").nnodes_arg() == "1:3"
    assert parse_j("2x4").nnodes_arg() == "2:2"


def test_str_round_trips() -> None:
    for text in ("1x4", "2x4", "1:3x8", "0:1x4"):
        assert str(parse_j(text)) == text
        assert parse_j(str(parse_j(text))) == parse_j(text)


def test_parse_nnodes() -> None:
    assert parse_nnodes("2") == NodeRange(2, 2)
    assert parse_nnodes("1:4") == NodeRange(1, 4)
    for bad in ("0", "3:2", "2x2", "", "a"):
        with pytest.raises(UsageError, match="-j"):
            parse_nnodes(bad)


@pytest.mark.parametrize(
    "text, why",
    [
        ("99999999999999999999999999x1", "NNODES is over the limit of 65,536"),
        ("65537x1", "NNODES is over the limit of 65,536"),
        ("1:65537x1", "NNODES is over the limit of 65,536"),
        ("1x4097", "NPROC is over the limit of 4,096"),
        ("99999999999999999999", "NPROC is over the limit of 4,096"),
        # past Python's int-string limit (4,300 digits): the same one line, not a ValueError
        ("9" * 6000 + "x1", "NNODES is over the limit of 65,536"),
        ("1x" + "9" * 6000, "NPROC is over the limit of 4,096"),
        # only ASCII digits: \d and int() would read these as 1x2
        ("\uff11x\uff12", "is not a whole number (ASCII digits 0-9)"),
        ("\u0661x2", "is not a whole number (ASCII digits 0-9)"),
    ],
)
def test_sizes_over_the_limits_and_foreign_digits_are_refused(text: str, why: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_j(text)
    msg = str(info.value)
    assert why in msg and "\n" not in msg
    assert len(msg) < 400  # a 6,000-digit value is named, not repeated


def test_the_limits_themselves_are_valid() -> None:
    assert parse_j("65536x4096") == JobSize(65536, 65536, 4096)
    assert parse_j("0:65536x1") == JobSize(0, 65536, 1)
    assert parse_j("0000002x0003") == JobSize(2, 2, 3)
    assert parse_nnodes("1:65536") == NodeRange(1, 65536)
    for bad in ("65537", "1:" + "9" * 5000, "\uff12"):
        with pytest.raises(UsageError, match="-j"):
            parse_nnodes(bad)
