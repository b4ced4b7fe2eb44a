"""Scheduler base: typed run options, dry-run values, registry."""

from __future__ import annotations

import pytest

from xrun.errors import UsageError
from xrun.schedulers.api import (
    AppDryRunInfo,
    CfgVal,
    DescribeAppResponse,
    ListAppResponse,
    Scheduler,
    filter_regex,
    get_scheduler_factory,
    runopts,
    scheduler_names,
)
from xrun.specs import AppDef, AppState, Role


def _opts() -> runopts:
    o = runopts()
    o.add("partition", str, "the partition", default="debug")
    o.add("nodes", int, "how many", default=1)
    o.add("ratio", float, "a ratio", default=0.5)
    o.add("exclusive", bool, "whole nodes", default=False)
    o.add("tags", list, "tags")
    o.add("labels", dict, "labels")
    o.add("account", str, "who pays", required=True)
    return o


def test_resolve_fills_defaults_and_converts_strings() -> None:
    got = _opts().resolve(
        {
            "account": "ml",
            "nodes": "3",
            "ratio": "0.25",
            "exclusive": "yes",
            "tags": "a,b",
            "labels": "k:v;k2:v2",
        },
        "slurm",
    )
    assert got == {
        "partition": "debug",
        "nodes": 3,
        "ratio": 0.25,
        "exclusive": True,
        "tags": ["a", "b"],
        "labels": {"k": "v", "k2": "v2"},
        "account": "ml",
    }


@pytest.mark.parametrize(
    "cfg,fragment",
    [
        ({"account": "a", "partion": "x"}, "did you mean 'partition'"),
        ({"account": "a", "nodes": "two"}, "nodes='two' is not a valid int"),
        ({"account": "a", "exclusive": "maybe"}, "exclusive='maybe' is not a valid bool"),
        ({"account": "a", "labels": "novalue"}, "labels='novalue'"),
        ({}, "run option 'account' is required"),
    ],
)
def test_resolve_errors(cfg: dict[str, object], fragment: str) -> None:
    with pytest.raises(UsageError) as e:
        _opts().resolve(cfg, "slurm")
    assert fragment in str(e.value)


def test_runopts_str_lists_every_option() -> None:
    text = str(_opts())
    for name in ("partition", "nodes", "ratio", "exclusive", "tags", "labels", "account"):
        assert name in text
    assert "required" in text and "default: 'debug'" in text


class _Echo(Scheduler[list[str]]):
    """A minimal scheduler: the request value is an argv list."""

    backend = "echo"

    def __init__(self, session_name: str) -> None:
        super().__init__(session_name)
        self.scheduled: list[list[str]] = []

    def run_opts(self) -> runopts:
        o = runopts()
        o.add("prefix", str, "prefix", default=">")
        return o

    def _submit_dryrun(self, app: AppDef, cfg: dict[str, CfgVal]) -> AppDryRunInfo[list[str]]:
        argv = [str(cfg["prefix"]), app.roles[0].entrypoint, *app.roles[0].args]
        return AppDryRunInfo(argv, " ".join)

    def schedule(self, dryrun_info: AppDryRunInfo[list[str]]) -> str:
        self.scheduled.append(dryrun_info.request)
        return f"app{len(self.scheduled)}"

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        return DescribeAppResponse(app_id, AppState.SUCCEEDED) if app_id == "app1" else None

    def cancel(self, app_id: str) -> None:
        pass

    def list(self) -> list[ListAppResponse]:
        return []


def test_dryrun_is_a_value_and_submit_executes_it() -> None:
    s = _Echo("sess")
    app = AppDef("a", [Role("r", "img", "echo", ["hi"])])
    info = s.submit_dryrun(app, {"prefix": "$"})
    assert str(info) == "$ echo hi"
    assert info.scheduler == "echo" and info.app is app and info.cfg == {"prefix": "$"}
    assert s.scheduled == []  # a dry run submits nothing
    assert s.submit(app, {}) == "app1"
    assert s.scheduled == [[">", "echo", "hi"]]
    waited = s.wait("app1")
    assert waited is not None and waited.state == AppState.SUCCEEDED
    assert s.wait("nope") is None and not s.exists("nope")


def test_submit_dryrun_validates_the_app() -> None:
    with pytest.raises(UsageError, match="has no roles"):
        _Echo("s").submit_dryrun(AppDef("a", []), {})


def test_registry_lists_builtins_and_suggests() -> None:
    assert scheduler_names()[:3] == ["local_cwd", "slurm", "docker"]
    with pytest.raises(UsageError) as e:
        get_scheduler_factory("slurn")
    assert "did you mean 'slurm'" in str(e.value)
    assert "available: local_cwd, slurm, docker" in str(e.value)


def test_filter_regex() -> None:
    assert list(filter_regex("b+", ["a", "bb", "cb"])) == ["bb", "cb"]
    assert list(filter_regex(None, ["a"])) == ["a"]
    with pytest.raises(UsageError, match="not a valid regular expression"):
        list(filter_regex("(", ["a"]))
