"""Scheduler base: typed run options, dry-run values, registry."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import pytest

from tests.helpers import paths
from xrun.errors import UsageError
from xrun.schedulers.api import (
    AppDryRunInfo,
    CfgVal,
    DescribeAppResponse,
    ListAppResponse,
    Scheduler,
    filter_regex,
    get_scheduler,
    get_scheduler_factory,
    option,
    runopts,
    scheduler_names,
)
from xrun.schedulers.docker.options import DockerOptions
from xrun.schedulers.local_cwd.options import LocalOptions
from xrun.schedulers.slurm.options import SlurmOptions
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


# --------------------------------------------------------------------------- typed run options
@dataclass(frozen=True, kw_only=True)
class _Opts:
    account: str = option("who pays", required=True)
    partition: str | None = option("the partition", default="debug")
    nodes: int = option("how many", default=1)
    grace: float = option("seconds", default=0.5, seconds=True)
    exclusive: bool = option("whole nodes", default=False)
    tags: list[str] = option("tags", default=[])
    labels: dict[str, str] | None = option("labels")
    mail_user: str | None = option("mail", aliases=("mail-user",))

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise UsageError(f"run option nodes={self.nodes} must be >= 1")


def test_typed_runopts_describe_the_dataclass_fields() -> None:
    opts = runopts(_Opts)
    got = {o.name: (o.type_, o.default, o.required, o.aliases, o.seconds) for o in opts}
    assert got == {
        "account": (str, None, True, (), False),
        "partition": (str, "debug", False, (), False),
        "nodes": (int, 1, False, (), False),
        "grace": (float, 0.5, False, (), True),
        "exclusive": (bool, False, False, (), False),
        "tags": (list, [], False, (), False),
        "labels": (dict, None, False, (), False),
        "mail_user": (str, None, False, ("mail-user",), False),
    }
    assert [o.help for o in opts][:2] == ["who pays", "the partition"]
    assert "mail-user" in opts and opts.get("mail-user") is opts.get("mail_user")
    with pytest.raises(TypeError, match="add a field there instead"):
        opts.add("other", str, "not in _Opts")


def test_typed_resolve_makes_the_dataclass_once_converted_and_checked() -> None:
    opts = runopts(_Opts)
    got = opts.resolve({"account": "ml", "nodes": "3", "tags": "a;b", "mail-user": "me"}, "s")
    assert got == _Opts(account="ml", nodes=3, tags=["a", "b"], mail_user="me")
    assert got.partition == "debug" and got.grace == 0.5 and got.labels is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.nodes = 4  # type: ignore[misc]
    # a list default is the instance's own: one resolve cannot change another's
    first, second = opts.resolve({"account": "a"}), opts.resolve({"account": "b"})
    first.tags.append("x")
    assert second.tags == [] and runopts(_Opts).get("tags").default == []  # type: ignore[union-attr]
    # the same errors as a dict runopts', and the dataclass's own check, all in resolve
    for cfg, fragment in [
        ({}, "run option 'account' is required for scheduler s"),
        ({"account": "a", "nodes": "two"}, "nodes='two' is not a valid int"),
        ({"account": "a", "grace": "-1"}, "grace=-1.0 is invalid: expected a number of seconds"),
        ({"account": "a", "partion": "x"}, "did you mean 'partition'"),
        ({"account": "a", "nodes": "0"}, "run option nodes=0 must be >= 1"),
    ]:
        with pytest.raises(UsageError, match=re.escape(fragment)):
            opts.resolve(cfg, "s")


def test_a_field_type_without_a_converter_is_refused() -> None:
    @dataclass(frozen=True, kw_only=True)
    class Bad:
        when: tuple[str, ...] = option("no converter for tuples", default=None)

    with pytest.raises(TypeError, match=r"Bad.when: .* is not a run option type"):
        runopts(Bad)


@pytest.mark.parametrize(
    "name,options",
    [("local_cwd", LocalOptions), ("slurm", SlurmOptions), ("docker", DockerOptions)],
)
def test_builtin_schedulers_resolve_to_their_options_dataclass(name: str, options: type) -> None:
    opts = get_scheduler(name).run_opts()
    # one source of truth: `xrun runopts` and `xrun configure` list exactly these fields
    assert [o.name for o in opts] == [f.name for f in dataclasses.fields(options)]
    assert opts.resolve({}, name) == options()
    assert dataclasses.is_dataclass(options) and options.__dataclass_params__.frozen  # type: ignore[attr-defined]


def test_request_modules_read_typed_options_only() -> None:
    """After resolve nothing looks an option up by name again (no ``cfg.get("…")``)."""
    pattern = re.compile(r"\bcfg(\.get\(|\[)")
    found = []
    for sched in ("local_cwd", "slurm", "docker"):
        for module in ("request", "scheduler", "workspace"):
            path = paths.REPO / "schedulers" / sched / f"{module}.py"
            if path.exists():
                found += [
                    f"{path.name}: {ln.strip()}"
                    for ln in path.read_text().splitlines()
                    if pattern.search(ln)
                ]
    assert found == []


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
