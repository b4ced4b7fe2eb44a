"""start_processes' checks of its arguments, Std's parser and the context's API."""

from __future__ import annotations

import os
import re

import pytest

from tests.runtime.workers.helpers import PY, prints
from xrun.errors import UsageError
from xrun.runtime.workers.api import PContext, Std, start_processes

# -- Std.parse ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "nprocs", "want"),
    [
        ("0", None, Std.NONE),
        ("3", None, Std.ALL),
        (" 2 ", 4, Std.ERR),
        ("0:3,1:1", None, {0: Std.ALL, 1: Std.OUT}),
        ("1:2", 3, {0: Std.NONE, 1: Std.ERR, 2: Std.NONE}),
    ],
)
def test_std_parse_good(text, nprocs, want):
    assert Std.parse(text, nprocs) == want


@pytest.mark.parametrize(
    ("text", "nprocs", "says"),
    [
        ("4", None, "'4'"),
        ("-1", None, "'-1'"),
        ("all", None, "'all'"),
        ("0:3,0:1", None, "twice"),
        ("x:1", None, "'x'"),
        ("0:", None, "''"),
        ("2:1", 2, "ranks 0..1"),
    ],
)
def test_std_parse_bad(text, nprocs, says):
    with pytest.raises(UsageError, match=re.escape(says)):
        Std.parse(text, nprocs)


# -- argument checks ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "envs", "says"),
    [
        (
            {0: (), 2: ()},
            {0: {}, 2: {}},
            "args must have one entry per local rank 0..1: missing local ranks [1], unexpected local ranks [2]",
        ),
        (
            {0: (), 1: ()},
            {0: {}},
            "envs must have one entry per local rank 0..1: missing local ranks [1]",
        ),
        (
            {0: ()},
            {0: {}, 1: {}},
            "envs must have one entry per local rank 0..0: unexpected local ranks [1]",
        ),
    ],
)
def test_rank_keys_must_be_exactly_0_to_n(args, envs, says):
    with pytest.raises(UsageError, match=re.escape(says)):
        start_processes("t", PY, args, envs)


def test_bad_binary_is_a_usage_error_and_starts_nothing():
    with pytest.raises(UsageError, match="no-such-binary-xyz"):
        start_processes("t", "no-such-binary-xyz", {0: ()}, {0: {}})


def test_unpicklable_function_is_a_usage_error_naming_the_fix():
    with pytest.raises(UsageError, match="start_method='fork'"):
        start_processes("t", lambda: 1, {0: ()}, {0: {}}, start_method="spawn")
    with pytest.raises(UsageError, match="bad start method 'thread'"):
        start_processes("t", prints, {0: (0,)}, {0: {}}, start_method="thread")


def test_redirects_without_log_dir_are_a_usage_error():
    with pytest.raises(UsageError, match="log_dir"):
        start_processes("t", PY, {0: ()}, {0: {}}, redirects=Std.OUT)


def test_context_api_types():
    with start_processes("t", "true", {0: ()}, {0: {}}) as ctx:
        assert isinstance(ctx, PContext)
        assert list(ctx.pids()) == [0]
        result = ctx.wait()
    assert result is not None and result.stdouts == {0: ""} and result.stderrs == {0: ""}
    assert not os.path.exists(f"/proc/{ctx.pids()[0]}")  # reaped
    ctx.close()  # idempotent
