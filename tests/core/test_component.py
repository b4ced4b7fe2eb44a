"""Components: signature + docstring -> options, discovery (builtin, file, plugin), errors."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

import pytest

from xrun.component import (
    HelpRequested,
    analyze,
    call_component,
    format_help,
    get_component,
    list_components,
    parse_argv,
)
from xrun.errors import UsageError
from xrun.specs import AppDef, Role


def typed(  # noqa: PLR0913 - a component under test: one parameter per option
    *rest: str,
    name: str,
    count: int = 1,
    ratio: float = 0.5,
    flag: bool = False,
    opt: Optional[int] = None,  # noqa: UP045 - the typing spelling must work too
    maybe: str | None = None,
    tags: list[str] | None = None,
    nums: list[int] | None = None,
    floats: list[float] | None = None,
    env: dict[str, str] | None = None,
    x: str = "ex",
    some_name: str = "s",
) -> AppDef:
    """A component with every supported type.

    Args:
        rest: the remaining arguments
        name: the app name
        count: how many
        ratio: a fraction
        flag: a switch
        opt: an optional int
        maybe: an optional str
        tags: string list
        nums: int list
        floats: float list
        env: a mapping
        x: a one-letter option
        some_name: an underscored option
    """
    meta = {
        "rest": repr(rest),
        "count": repr(count),
        "ratio": repr(ratio),
        "flag": repr(flag),
        "opt": repr(opt),
        "maybe": repr(maybe),
        "tags": repr(tags),
        "nums": repr(nums),
        "floats": repr(floats),
        "env": repr(env),
        "x": repr(x),
        "some_name": repr(some_name),
    }
    return AppDef(name=name, roles=[Role(name="r", image="i", entrypoint="e")], metadata=meta)


COMP = analyze("test.typed", typed)


def call(*argv: str, defaults: dict[str, tuple[str, str]] | None = None) -> dict[str, str]:
    return call_component(COMP, list(argv), defaults).metadata


def test_every_type_converts() -> None:
    m = call(
        "--name",
        "n",
        "--count",
        "3",
        "--ratio=0.25",
        "--flag",
        "yes",
        "--opt",
        "7",
        "--maybe",
        "m",
        "--tags",
        "a,b,c",
        "--nums",
        "1,2",
        "--floats",
        "1.5,2",
        "--env",
        "A=1,B=x=y",
        "-x",
        "short",
        "--some-name",
        "dash",
    )
    assert m["count"] == "3" and m["ratio"] == "0.25" and m["flag"] == "True"
    assert m["opt"] == "7" and m["maybe"] == "'m'"
    assert m["tags"] == "['a', 'b', 'c']" and m["nums"] == "[1, 2]" and m["floats"] == "[1.5, 2.0]"
    assert m["env"] == "{'A': '1', 'B': 'x=y'}"
    assert m["x"] == "'short'" and m["some_name"] == "'dash'"


def test_defaults_apply_when_not_given() -> None:
    m = call("--name", "n")
    assert m["count"] == "1" and m["flag"] == "False" and m["opt"] == "None" and m["tags"] == "None"


@pytest.mark.parametrize(
    "word, value",
    [("true", True), ("1", True), ("YES", True), ("false", False), ("0", False), ("no", False)],
)
def test_bool_words(word: str, value: bool) -> None:
    assert call("--name", "n", "--flag", word)["flag"] == repr(value)
    assert call("--name", "n", f"--flag={word}")["flag"] == repr(value)


@pytest.mark.parametrize("word", ["maybe", "2", "t", "on", ""])
def test_bool_rejects_anything_else(word: str) -> None:
    with pytest.raises(UsageError, match=r"--flag=.*is not a bool; expected true/false"):
        call("--name", "n", f"--flag={word}")


def test_bare_bool_flag_is_true_before_another_option_or_at_the_end() -> None:
    assert call("--flag", "--name", "n")["flag"] == "True"
    assert call("--name", "n", "--flag")["flag"] == "True"


def test_bool_flag_before_an_unknown_dash_token_reads_it_as_its_value() -> None:
    # Found by hypothesis: `--flag -:` used to report "unknown option -:" (naming neither the
    # flag nor the fix); the token is the flag's value, and its conversion error names the flag.
    with pytest.raises(UsageError, match=r"--flag='-:'.*is not a bool"):
        call("--name", "n", "--flag", "-:")


def test_dict_value_with_commas_continues_the_previous_value() -> None:
    assert call("--name", "n", "--env", "CUDA_VISIBLE_DEVICES=0,1,X=2")["env"] == (
        "{'CUDA_VISIBLE_DEVICES': '0,1', 'X': '2'}"
    )
    with pytest.raises(UsageError, match="'junk' is not KEY=VALUE"):
        call("--name", "n", "--env", "junk,A=1")


@pytest.mark.parametrize(
    "flag, value, expected",
    [
        ("--count", "3.5", "not a valid int"),
        ("--ratio", "abc", "not a valid float"),
        ("--nums", "1,x", "'x' is not a valid int"),
    ],
)
def test_bad_numbers(flag: str, value: str, expected: str) -> None:
    with pytest.raises(UsageError, match=expected) as info:
        call("--name", "n", flag, value)
    assert flag.lstrip("-") in str(info.value)


def test_varargs_take_everything_after_the_options() -> None:
    assert call("--name", "n", "a", "--count", "b")["rest"] == "('a', '--count', 'b')"
    assert call("--name", "n", "--", "--count", "2")["rest"] == "('--count', '2')"
    assert call("--name", "n", "-5", "x")["rest"] == "('-5', 'x')"  # a number is not an option
    assert call("--name", "n")["rest"] == "()"


def test_unknown_option_suggests_the_closest_and_the_double_dash() -> None:
    with pytest.raises(UsageError, match=r"unknown option --cuont \(did you mean --count\?\)"):
        call("--name", "n", "--cuont", "2")
    with pytest.raises(UsageError, match="after `--`"):
        call("--name", "n", "--lr", "0.1")


def test_missing_value_and_missing_required() -> None:
    with pytest.raises(UsageError, match=r"option --count needs a value \(int\)"):
        call("--name", "n", "--count")
    with pytest.raises(UsageError, match="missing required argument.*--name"):
        call("--count", "2")


def test_positional_for_a_component_without_varargs_is_an_error() -> None:
    def plain(a: int = 1) -> AppDef:
        return AppDef(name="p")

    with pytest.raises(UsageError, match="unexpected argument 'stray'"):
        call_component(analyze("t.plain", plain), ["stray"])


def test_defaults_from_config_sit_between_the_component_and_the_command_line() -> None:
    src = "/cfg [component:test.typed] count"
    assert call("--name", "n", defaults={"count": ("5", src)})["count"] == "5"
    assert call("--name", "n", "--count", "6", defaults={"count": ("5", src)})["count"] == "6"
    with pytest.raises(UsageError, match=r"/cfg \[component:test.typed\] count.*'five'"):
        call("--name", "n", defaults={"count": ("five", src)})
    with pytest.raises(UsageError, match=r"has no parameter 'cuont'; valid: name, count"):
        call("--name", "n", defaults={"cuont": ("5", "/cfg [component:test.typed] cuont")})


def test_help_shows_docs_required_and_defaults() -> None:
    text = format_help(COMP)
    assert "A component with every supported type." in text
    assert "  --name NAME (str)\n        the app name (required)\n" in text
    assert "  --count COUNT (int)\n        how many (default: 1)\n" in text
    assert "  --flag [FLAG] (bool)\n" in text and "(list[int] | None)" in text
    assert "-x, --x X (str)" in text and "--some_name, --some-name" in text
    with pytest.raises(HelpRequested):
        parse_argv(COMP, ["--help"])
    with pytest.raises(HelpRequested):
        parse_argv(COMP, ["-h"])


def test_dash_h_is_an_option_when_the_component_has_a_parameter_h() -> None:
    ddp = get_component("dist.ddp")
    assert parse_argv(ddp, ["-h", "gpu.small"]).options == {"h": "gpu.small"}
    with pytest.raises(HelpRequested):
        parse_argv(ddp, ["--help"])


def test_component_must_return_an_appdef() -> None:
    def bad() -> AppDef:
        return 3  # type: ignore[return-value]

    with pytest.raises(UsageError, match="returned int, expected AppDef"):
        call_component(analyze("t.bad", bad), [])


@pytest.mark.parametrize(
    "source, expected",
    [
        ("def f(a) -> AppDef: ...", "parameter 'a' has no type annotation"),
        ("def f(a: set[int]) -> AppDef: ...", "parameter 'a': unsupported type"),
        ("def f(a: list[list[int]]) -> AppDef: ...", "unsupported type"),
        ("def f(**kw: str) -> AppDef: ...", "**kwargs is not supported"),
        ("def f(a: 'Undefined') -> AppDef: ...", "cannot resolve its type annotations"),
    ],
)
def test_bad_signatures_are_reported_with_their_problem(
    tmp_path: Path, source: str, expected: str
) -> None:
    path = tmp_path / "comp.py"
    path.write_text("from xrun.specs import AppDef\n" + source + "\n")
    with pytest.raises(UsageError, match=expected.replace("*", r"\*")):
        get_component(f"{path}:f")


def test_file_component_syntax_error_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.py"
    path.write_text("x = 1\ndef f(:\n")
    with pytest.raises(UsageError, match=r"broken.py.*syntax error at line 2"):
        get_component(f"{path}:f")


def test_file_component_import_error_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "imp.py"
    path.write_text("import no_such_module_xyz\n")
    with pytest.raises(UsageError, match="failed to import: ModuleNotFoundError"):
        get_component(f"{path}:f")


def test_file_component_missing_function_lists_the_existing_ones(tmp_path: Path) -> None:
    path = tmp_path / "comps.py"
    path.write_text("def alpha(): pass\ndef beta(): pass\ndef _hidden(): pass\n")
    with pytest.raises(UsageError, match=r"no function 'gamma'; functions defined: alpha, beta$"):
        get_component(f"{path}:gamma")


def test_file_component_missing_file_and_missing_function_name(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        get_component(f"{tmp_path}/nope.py:f")
    with pytest.raises(UsageError, match="expected FILE.py:FUNCTION"):
        get_component(f"{tmp_path}/nope.py")


def test_file_component_runs(tmp_path: Path) -> None:
    path = tmp_path / "good.py"
    path.write_text(
        textwrap.dedent('''
        from __future__ import annotations
        from xrun.specs import AppDef, Role

        def hello(who: str = "world", n: int = 1) -> AppDef:
            """Say hello."""
            return AppDef(name="hello", roles=[Role(name="h", image="i", entrypoint="echo",
                                                    args=[who], num_replicas=n)])
    ''')
    )
    app = call_component(get_component(f"{path}:hello"), ["--who", "you", "--n", "2"])
    assert app.roles[0].args == ["you"] and app.roles[0].num_replicas == 2


def test_unknown_builtin_suggests_the_closest() -> None:
    with pytest.raises(UsageError, match=r"unknown component 'dist.dpp'; did you mean dist.ddp"):
        get_component("dist.dpp")
    with pytest.raises(UsageError, match=r"unknown component 'utils.ech'.*utils.echo"):
        get_component("utils.ech")
    with pytest.raises(UsageError, match="not MODULE.FUNCTION"):
        get_component("ddp")
    with pytest.raises(UsageError, match="unknown component 'dist._app'"):
        get_component("dist._app")  # private helpers are not components
    with pytest.raises(UsageError, match="unknown component 'dist.quote_arg'"):
        get_component("dist.quote_arg")  # nor public ones that do not return an AppDef


def test_builtins_are_listed_with_their_first_doc_line() -> None:
    comps = list_components()
    for name in (
        "dist.ddp",
        "dist.spmd",
        "utils.echo",
        "utils.sh",
        "utils.python",
        "utils.binary",
        "utils.touch",
        "utils.copy",
    ):
        assert name in comps
        assert comps[name].summary()
    assert "dist.quote_arg" not in comps  # a helper without -> AppDef is not a component


@pytest.fixture
def plugin_path(tmp_path: Path) -> Iterator[Path]:
    """A fake installed distribution declaring `xrun.components` entry points."""
    (tmp_path / "myteam_comps.py").write_text(
        textwrap.dedent('''
        from xrun.specs import AppDef, Role

        def hello(msg: str = "hi") -> AppDef:
            """Team hello."""
            return AppDef(name="t", roles=[Role(name="t", image="i", entrypoint="echo",
                                                args=[msg])])

        def ddp() -> AppDef:
            """An impostor."""
            return AppDef(name="impostor")
    ''')
    )
    dist = tmp_path / "myteam-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: myteam\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[xrun.components]\nmyteam = myteam_comps\ndist = myteam_comps\n"
        "broken = no_such_module_for_xrun_test\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("myteam_comps", None)


def test_plugins_add_components_and_never_replace_builtins(plugin_path: Path) -> None:
    comps = list_components()
    assert "myteam.hello" in comps and comps["myteam.hello"].summary() == "Team hello."
    app = call_component(get_component("myteam.hello"), ["--msg", "yo"])
    assert app.roles[0].args == ["yo"]
    # `dist = myteam_comps` must not shadow the builtin dist.ddp
    assert get_component("dist.ddp").fn.__module__ == "xrun.components.dist"
    assert comps["dist.ddp"].fn.__module__ == "xrun.components.dist"


def test_a_broken_plugin_is_reported_and_does_not_hide_the_others(plugin_path: Path) -> None:
    problems: list[str] = []
    comps = list_components(problems)
    assert "myteam.hello" in comps and "dist.ddp" in comps
    assert len(problems) == 1 and "'no_such_module_for_xrun_test'" in problems[0]
    with pytest.raises(UsageError, match="failed to import: ModuleNotFoundError"):
        get_component("broken.anything")
