"""The README and docs/ stay true to the code: the README is short and its quickstart is what
CI runs (and works), every relative link and anchor resolves, and every command, option,
builtin component, run option and runtime flag the code has is documented where the README
says it is."""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.helpers.paths import REPO, XRUN

README = REPO / "README.md"
DOCS = REPO / "docs"
MAX_README_LINES = 200
# The quickstart, character for character: what a newcomer pastes, what CI runs.
SETUP_AND_TRAIN = (
    "bash scripts/setup.sh && .venv/bin/xrun run -s local_cwd dist.ddp -j 2x2 "
    "--script examples/train_ddp.py"
)
TEST_SUITE = "bash scripts/test.sh"

_FENCE = re.compile(r"^(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def _markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks (a link or heading inside one is not one)."""
    out: list[str] = []
    fenced = False
    for line in text.splitlines():
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation (backticks too) dropped, each
    space a hyphen."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file; a repeated heading gets -1, -2, … as on GitHub."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for line in _prose_lines(path.read_text()):
        m = _HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[str]:
    """The link and image targets of a Markdown file, outside code blocks and code spans."""
    found: list[str] = []
    for line in _prose_lines(path.read_text()):
        found += _LINK.findall(_CODE_SPAN.sub("", line))
    return found


def _broken(path: Path, target: str, root: Path = REPO) -> str | None:
    """Why a relative link target does not resolve, or None."""
    if _SCHEME.match(target):
        return None  # http(s), mailto: not ours to check offline
    file_part, _, anchor = target.partition("#")
    dest = (path.parent / file_part).resolve() if file_part else path
    if not dest.exists():
        return f"{target}: no such file {dest}"
    if root.resolve() not in (dest, *dest.parents):
        return f"{target}: outside the repository"
    if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
        return f"{target}: no heading #{anchor} in {dest.name} (has: {sorted(anchors(dest))})"
    return None


def _section(path: Path, heading: str) -> str:
    """The text under a heading, down to the next heading of the same or a higher level."""
    lines = path.read_text().splitlines()
    level = len(heading) - len(heading.lstrip("#"))
    start = lines.index(heading)
    end = len(lines)
    for i in range(start + 1, len(lines)):
        m = _HEADING.match(lines[i])
        if m and len(m.group(1)) <= level:
            end = i
            break
    return "\n".join(lines[start + 1 : end])


def _documented(text: str, token: str) -> bool:
    """``token`` written as code: `--flag`, `--flag VALUE`, `name` or `name (also …)`."""
    return re.search(r"`" + re.escape(token) + r"[`\s=]", text) is not None


# --------------------------------------------------------------------------- the checks' own logic
@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("The `-j` grammar", "the--j-grammar"),
        ("Config: `.xrunconfig`", "config-xrunconfig"),
        ("torch's launcher API", "torchs-launcher-api"),
        ("The agent's store (measures 11-14)", "the-agents-store-measures-11-14"),
        ("`xrun run`", "xrun-run"),
    ],
)
def test_slug_is_githubs(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


def test_broken_link_and_anchor_are_caught(tmp_path: Path) -> None:
    doc = tmp_path / "a.md"
    doc.write_text("# Top\n\n## Two words\n\n## Two words\n")
    (tmp_path / "sub").mkdir()
    ok = ("#two-words", "#two-words-1", "a.md#top", "sub", "https://example.org/x#y")
    assert [_broken(doc, t, tmp_path) for t in ok] == [None] * len(ok)
    for bad in ("#three-words", "#two-words-2", "missing.md", "missing.md#top", "../a.md"):
        assert _broken(doc, bad, tmp_path) is not None, bad


def test_links_skip_code(tmp_path: Path) -> None:
    doc = tmp_path / "a.md"
    doc.write_text("see [a](a.md) and `[b](b.md)`\n```\n[c](c.md)\n```\n![img](i.png)\n")
    assert links(doc) == ["a.md", "i.png"]


# --------------------------------------------------------------------------- README and links
def test_readme_is_at_most_200_lines() -> None:
    n = len(README.read_text().splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines; move reference text to docs/"


def test_every_relative_link_and_anchor_resolves() -> None:
    problems = [
        f"{path.relative_to(REPO)}: {why}"
        for path in _markdown_files()
        for target in links(path)
        if (why := _broken(path, target))
    ]
    assert not problems, "\n".join(problems)


def test_the_readme_links_every_doc() -> None:
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in links(README)}
    missing = [p.name for p in sorted(DOCS.glob("*.md")) if p.resolve() not in linked]
    assert not missing, f"docs not linked from README.md: {missing}"


# --------------------------------------------------------------------------- the quickstart
def _quickstart_commands() -> list[str]:
    body = _section(README, "## Quickstart").splitlines()
    blocks: list[str] = []
    inside: list[str] | None = None
    for line in body:
        if line.startswith("```"):
            if inside is None:
                inside = []
            else:
                blocks.append("\n".join(inside))
                inside = None
        elif inside is not None:
            inside.append(line)
    return blocks


def _script_commands(path: Path) -> list[str]:
    """A shell script's commands: no comments, no `set` options, no `cd` to the repo root."""
    out = []
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or line.startswith("set "):
            continue
        if line == 'cd "$(dirname "$0")/.."':
            continue
        out.append(line)
    return out


def test_the_quickstart_commands_are_the_two_documented_ones() -> None:
    assert _quickstart_commands() == [SETUP_AND_TRAIN, TEST_SUITE]


def test_ci_runs_exactly_the_readmes_test_command() -> None:
    assert _script_commands(REPO / ".ci" / "run") == [f"exec {TEST_SUITE}"]


def test_the_test_command_sets_up_as_the_first_command_does() -> None:
    setup, _, _ = SETUP_AND_TRAIN.partition(" && ")
    assert setup in _script_commands(REPO / "scripts" / "test.sh")
    assert ".venv" in (REPO / "scripts" / "setup.sh").read_text()
    # setup.sh installs the project into .venv: its `xrun` console script is the CLI
    from importlib.metadata import entry_points

    scripts = {ep.name: ep.value for ep in entry_points(group="console_scripts")}
    assert scripts.get("xrun") == "xrun.cli:main"


@pytest.mark.timeout(180)
def test_the_first_quickstart_command_trains(tmp_path: Path) -> None:
    """Its `.venv/bin/xrun …` half, for real, in a directory that looks like a fresh checkout
    (this venv, the examples) so the checkpoints land in tmp_path; setup.sh runs in CI."""
    _, _, train = SETUP_AND_TRAIN.partition(" && ")
    (tmp_path / ".venv").symlink_to(Path(XRUN).parent.parent)
    (tmp_path / "examples").symlink_to(REPO / "examples")
    r = subprocess.run(
        shlex.split(train), cwd=tmp_path, capture_output=True, text=True, timeout=170
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith("local_cwd://default/train_ddp-"), r.stdout
    finals = re.findall(r"rank (\d)/4: final loss \S+ params sha256 (\w+)", r.stderr)
    assert sorted(rank for rank, _ in finals) == ["0", "1", "2", "3"], r.stderr[-3000:]
    assert len({sha for _, sha in finals}) == 1  # DDP kept every rank's parameters equal
    ckpts = sorted(p.name for p in (tmp_path / "outputs" / "ckpt").iterdir())
    assert ckpts == [f"epoch-{e:05d}.pt" for e in range(1, 6)]


# --------------------------------------------------------------------------- reference coverage
def _cli_commands() -> dict[str, argparse.ArgumentParser]:
    from xrun.cli.parser import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _option_strings(parser: argparse.ArgumentParser) -> list[str]:
    return [
        s
        for a in parser._actions
        if not isinstance(a, argparse._HelpAction)
        for s in a.option_strings
    ]


def test_every_command_and_option_is_in_the_cli_reference() -> None:
    cli_md = DOCS / "cli.md"
    table = _section(cli_md, "## Commands").split("\n### ")[0]
    missing = []
    for name, parser in _cli_commands().items():
        if f"### `xrun {name}`" not in cli_md.read_text().splitlines():
            missing.append(f"no section ### `xrun {name}`")
            continue
        if f"`xrun {name}" not in table:
            missing.append(f"no row for xrun {name} in the Commands table")
        text = _section(cli_md, f"### `xrun {name}`")
        missing += [f"xrun {name} {s}" for s in _option_strings(parser) if not _documented(text, s)]
    missing += [s for s in ("--version", "--help") if not _documented(cli_md.read_text(), s)]
    assert not missing, "undocumented in docs/cli.md:\n" + "\n".join(missing)


def test_every_builtin_components_options_are_in_the_cli_reference() -> None:
    from xrun.component import list_components

    text = _section(DOCS / "cli.md", "## Builtin components")
    missing = []
    for name, comp in list_components().items():
        if not comp.fn.__module__.startswith("xrun.components."):
            continue  # a plugin installed in this venv documents itself
        row = next((ln for ln in text.splitlines() if ln.startswith(f"| `{name}` |")), None)
        if row is None:
            missing.append(f"{name}: no row")
            continue
        missing += [
            f"{name} --{p.name}"
            for p in comp.params
            if not p.varargs and not _documented(row, f"--{p.name}")
        ]
    assert not missing, "undocumented in docs/cli.md:\n" + "\n".join(missing)


def test_every_run_option_is_in_the_schedulers_doc() -> None:
    from xrun.schedulers.api import get_scheduler

    missing = []
    for name in ("local_cwd", "docker", "slurm"):
        text = _section(DOCS / "schedulers.md", f"### {name}")
        missing += [
            f"{name}: {opt.name}"
            for opt in get_scheduler(name).run_opts()
            if not _documented(text, opt.name)
        ]
    assert not missing, "undocumented in docs/schedulers.md:\n" + "\n".join(missing)


def test_every_runtime_flag_is_in_the_runtime_doc() -> None:
    from xrun.runtime.args import build_parser

    text = _section(DOCS / "runtime.md", "## Command line")
    flags = [s for s in _option_strings(build_parser()) if "_" not in s]
    missing = [s for s in flags if not _documented(text, s)]
    assert flags and not missing, f"undocumented in docs/runtime.md: {missing}"


def test_the_benchmark_figures_name_their_date_and_machine() -> None:
    """Every results table in docs/benchmarks.md sits in a section that says when and where."""
    text = (DOCS / "benchmarks.md").read_text()
    for part in text.split("\n## ")[1:]:
        if "\n| # |" in part:
            assert re.search(r"20\d\d-\d\d-\d\d", part), part[:80]
            assert re.search(r"VM|machine|host|CPU", part), part[:80]
