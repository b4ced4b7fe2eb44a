"""``.xrunconfig``: files, precedence (cwd > home > component defaults) and errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from xrun.config import config_paths, load
from xrun.errors import UsageError
from xrun.runner import Runner
from xrun.schedulers.options import resolve_run_options, runopts


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    home, cwd = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    cwd.mkdir()
    return home, cwd


def test_no_files_no_config(dirs: tuple[Path, Path]) -> None:
    home, cwd = dirs
    cfg = load(cwd, home)
    assert cfg.files == [] and cfg.sections == {}
    assert cfg.default_scheduler() is None


def test_cwd_overrides_home_key_by_key(dirs: tuple[Path, Path]) -> None:
    home, cwd = dirs
    (home / ".xrunconfig").write_text(
        "[component:dist.ddp]\nj = 2x2\ncpu = 4\n[local_cwd]\nlog_dir = /home-logs\n"
        "[cli:run]\nscheduler = slurm\n"
    )
    (cwd / ".xrunconfig").write_text("# a comment\n[component:dist.ddp]\nj = 1x4\n")
    cfg = load(cwd, home)
    assert cfg.files == [str(home / ".xrunconfig"), str(cwd / ".xrunconfig")]
    d = cfg.component_defaults("dist.ddp")
    assert d["j"][0] == "1x4" and d["j"][1] == f"{cwd / '.xrunconfig'} [component:dist.ddp] j"
    assert d["cpu"][0] == "4" and str(home) in d["cpu"][1]
    assert cfg.scheduler_defaults("local_cwd") == {
        "log_dir": ("/home-logs", f"{home / '.xrunconfig'} [local_cwd] log_dir")
    }
    assert cfg.default_scheduler() == "slurm"


def test_same_directory_is_read_once(dirs: tuple[Path, Path]) -> None:
    home, _ = dirs
    (home / ".xrunconfig").write_text("[local_cwd]\nlog_dir = x\n")
    assert config_paths(home, home) == [str(home / ".xrunconfig")]


def test_keys_keep_their_case_and_percent_is_literal(dirs: tuple[Path, Path]) -> None:
    home, cwd = dirs
    (cwd / ".xrunconfig").write_text("[component:dist.ddp]\nmemMB = 2048\nname = a%b\n")
    d = load(cwd, home).component_defaults("dist.ddp")
    assert d["memMB"][0] == "2048" and d["name"][0] == "a%b"


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            "[local_cwdd]\nx = 1\n",
            r"unknown section \[local_cwdd\] \(did you mean \[local_cwd\]\?\)",
        ),
        ("[component:]\nx = 1\n", r"\[component:\]: name the component"),
        ("[cli:run]\nschedular = slurm\n", r"\[cli:run\] schedular: unknown key"),
        ("no section header\n", "is not a valid INI file"),
        ("[local_cwd]\na = 1\na = 2\n", "is not a valid INI file"),
    ],
)
def test_bad_files_name_the_file_and_section(
    dirs: tuple[Path, Path], text: str, expected: str
) -> None:
    home, cwd = dirs
    (cwd / ".xrunconfig").write_text(text)
    with pytest.raises(UsageError, match=expected) as info:
        load(cwd, home)
    assert str(cwd / ".xrunconfig") in str(info.value)


def test_run_options_are_checked_against_the_scheduler() -> None:
    opts = runopts()
    opts.add("log_dir", str, "where")
    opts.add("grace", float, "seconds", default=1.0)
    src = "/f/.xrunconfig [local_cwd] "
    got = resolve_run_options(opts, {"grace": ("2.5", src + "grace")}, "local_cwd")
    assert got == {"grace": 2.5}
    with pytest.raises(UsageError, match=r"/f/.xrunconfig \[local_cwd\] grace: .*'soon'"):
        resolve_run_options(opts, {"grace": ("soon", src + "grace")}, "local_cwd")
    with pytest.raises(UsageError, match=r"\[local_cwd\] log_dri: unknown run option.*'log_dir'"):
        resolve_run_options(opts, {"log_dri": ("x", src + "log_dri")}, "local_cwd")


def test_runner_applies_the_config_under_explicit_values(dirs: tuple[Path, Path]) -> None:
    home, cwd = dirs
    (home / ".xrunconfig").write_text(
        "[local_cwd]\nlog_dir = /from-home\nstop_grace_s = 3\n[component:utils.echo]\nmsg = home\n"
        "num_replicas = 2\n"
    )
    (cwd / ".xrunconfig").write_text(
        "[local_cwd]\nlog_dir = /from-cwd\n[component:utils.echo]\nmsg = cwd\n"
    )
    with Runner(config=load(cwd, home)) as runner:
        cfg = runner.run_cfg("local_cwd", {})
        assert cfg["log_dir"] == "/from-cwd" and cfg["stop_grace_s"] == 3.0
        assert runner.run_cfg("local_cwd", {"log_dir": "/cli"})["log_dir"] == "/cli"
        app = runner.component_app("utils.echo", [])
        assert app.roles[0].args == ["cwd"] and app.roles[0].num_replicas == 2
        app = runner.component_app("utils.echo", ["--msg", "cli"])
        assert app.roles[0].args == ["cli"]


def test_torchx_name_local_docker_is_the_docker_scheduler(dirs: tuple[Path, Path]) -> None:
    """A TorchX user's ``-s local_docker`` and ``[local_docker]`` section mean xrun's docker
    (TorchX's default scheduler; gap N34): the same scheduler, the section's options applied."""
    from xrun.schedulers.api import get_scheduler_factory
    from xrun.schedulers.docker import create_scheduler

    assert get_scheduler_factory("local_docker") is create_scheduler
    home, cwd = dirs
    (cwd / ".xrunconfig").write_text("[local_docker]\nimage_repo = reg.example:5000/team/ws\n")
    cfg = load(cwd, home)
    assert cfg.scheduler_defaults("docker")["image_repo"][0] == "reg.example:5000/team/ws"
    with Runner(config=cfg) as runner:
        assert runner.scheduler("local_docker").backend == "docker"
        for name in ("local_docker", "docker"):
            assert runner.run_cfg(name, {})["image_repo"] == "reg.example:5000/team/ws"


# --------------------------------------------------------------------------- .torchxconfig
def test_a_torchx_projects_config_is_read_below_xrunconfig(
    dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A TorchX project's ``.torchxconfig`` (gap §8: silently ignored before) gives its
    scheduler, run options and component defaults; ``.xrunconfig`` keys win over it; among
    TorchX's files the home one wins, as TorchX applies ``[$HOME, $CWD]`` keeping the first."""
    monkeypatch.delenv("TORCHXCONFIG", raising=False)
    home, cwd = dirs
    (cwd / ".torchxconfig").write_text(
        "[cli:run]\nscheduler = slurm\ncomponent = utils.echo\n"
        "[local_cwd]\nlog_dir = /tx-cwd\nstop_grace_s = 7\n"
        "[component:utils.echo]\nmsg = from-torchx\nnum_replicas = 3\n"
    )
    (home / ".torchxconfig").write_text("[local_cwd]\nstop_grace_s = 9\n")
    (cwd / ".xrunconfig").write_text("[local_cwd]\nlog_dir = /xrun-cwd\n")
    cfg = load(cwd, home)
    assert cfg.files == [
        str(cwd / ".torchxconfig"),
        str(home / ".torchxconfig"),
        str(cwd / ".xrunconfig"),
    ]
    assert cfg.default_scheduler() == "slurm" and cfg.default_component() == "utils.echo"
    with Runner(config=cfg) as runner:
        run = runner.run_cfg("local_cwd", {})
        assert run["log_dir"] == "/xrun-cwd" and run["stop_grace_s"] == 9.0
        app = runner.component_app("utils.echo", [])
        assert app.roles[0].args == ["from-torchx"] and app.roles[0].num_replicas == 3
    assert capsys.readouterr().err == ""


def test_torchxconfig_env_names_the_one_file(
    dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    home, cwd = dirs
    (cwd / ".torchxconfig").write_text("[local_cwd]\nlog_dir = /not-read\n")
    named = tmp_path / "team.ini"
    named.write_text("[local_cwd]\nlog_dir = /named\n")
    monkeypatch.setenv("TORCHXCONFIG", str(named))
    cfg = load(cwd, home)
    assert cfg.files == [str(named)]
    assert cfg.scheduler_defaults("local_cwd")["log_dir"][0] == "/named"
    monkeypatch.setenv("TORCHXCONFIG", str(tmp_path / "missing.ini"))
    with pytest.raises(UsageError, match=r"TORCHXCONFIG=.*missing\.ini: no such file"):
        load(cwd, home)


def test_what_only_torchx_has_is_skipped_with_one_line_each(
    dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """TorchX skips an option it does not know; so does xrun for a ``.torchxconfig`` (a
    ``[kubernetes]`` section, a TorchX-only run option or component parameter), saying so in
    one line each. The same entries in a ``.xrunconfig`` stay errors."""
    monkeypatch.delenv("TORCHXCONFIG", raising=False)
    home, cwd = dirs
    (cwd / ".torchxconfig").write_text(
        "[kubernetes]\nqueue = default\n[local_cwd]\nlog_dir = /ok\nnewer_torchx_opt = True\n"
        "[component:utils.echo]\nmsg = hi\nno_such = 1\n"
    )
    cfg = load(cwd, home)
    with Runner(config=cfg) as runner:
        assert runner.run_cfg("local_cwd", {})["log_dir"] == "/ok"
        assert runner.component_app("utils.echo", []).roles[0].args == ["hi"]
    err = capsys.readouterr().err.splitlines()
    assert any("[kubernetes]" in ln and "skipped" in ln for ln in err), err
    assert any("'newer_torchx_opt'" in ln and "skipped" in ln for ln in err), err
    assert any("'no_such'" in ln and "skipped" in ln for ln in err), err
    assert all(ln.startswith("xrun: warning: ") for ln in err)
    (cwd / ".xrunconfig").write_text("[local_cwd]\nnewer_torchx_opt = True\n")
    with (
        Runner(config=load(cwd, home)) as runner,
        pytest.raises(UsageError, match="newer_torchx_opt"),
    ):
        runner.run_cfg("local_cwd", {})
