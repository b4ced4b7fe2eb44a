"""``.xrunconfig``: defaults for run options and component arguments.

An INI file (Python's configparser; ``#`` or ``;`` start comments)::

    # defaults for `-cfg` of one scheduler: the section is the scheduler's name
    [local_cwd]
    log_dir = /scratch/xrun-logs

    [slurm]
    partition = debug
    time = 00:30:00

    # defaults for a component's arguments, written as on the command line
    [component:dist.ddp]
    j = 2x2
    env = NCCL_DEBUG=INFO,OMP_NUM_THREADS=1

    # defaults for `xrun run` itself: the scheduler, and the component run when none is named
    [cli:run]
    scheduler = local_cwd
    component = dist.ddp

    # experiment tracking (TorchX's sections): the trackers' names, and each one's config
    [torchx:tracker]
    fsspec =
    [tracker:fsspec]
    config = /tmp/tracker.conf

Two files are read: ``~/.xrunconfig`` and ``./.xrunconfig`` (the current directory), and below
them a TorchX project's ``.torchxconfig`` (the same format), read as TorchX reads it: the file
``$TORCHXCONFIG`` names, alone, else ``~/.torchxconfig`` over ``./.torchxconfig`` (TorchX's own
order: the user's file wins). Precedence, highest first: the command line > ``./.xrunconfig`` >
``~/.xrunconfig`` > the ``.torchxconfig`` files > the component's own defaults (or the
scheduler's run-option defaults). A key in a file overrides the same key of a
lower-precedence file only; other keys of that section still come from below.

Errors name the file, section and key: an unknown section, an unknown run option or component
parameter, a value that does not convert to the option's type. A ``.torchxconfig`` may name what
xrun does not have (a ``[kubernetes]`` section, a TorchX-only run option): as TorchX does with
what it does not know, that entry is skipped, with one warning line on stderr naming it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from xrun.contract import SCHEDULER_ALIASES
from xrun.errors import UsageError

FILENAME = ".xrunconfig"
# A TorchX project's config file, and TorchX's variable naming the one file to read instead.
TORCHX_FILENAME = ".torchxconfig"
TORCHX_ENV = "TORCHXCONFIG"
COMPONENT_PREFIX = "component:"
CLI_RUN = "cli:run"
_CLI_RUN_KEYS = ("scheduler", "component")
# Experiment tracking, TorchX's sections (see xrun.tracker.submit): [torchx:tracker] lists the
# trackers, [tracker:NAME] holds one's config.
TRACKERS = "torchx:tracker"
TRACKER_PREFIX = "tracker:"
# Schedulers known without scanning entry points (the scan costs ~30 ms on every start).
_BUILTIN_SCHEDULERS = ("local_cwd", "slurm", "docker")

# (value as written, "FILE [SECTION] KEY") - the second part is what errors quote.
Sourced = tuple[str, str]
# pathlib is avoided on purpose: importing it costs ~10 ms of every CLI start.
PathArg = str | os.PathLike[str]


@dataclass
class Config:
    """The merged view of the config files; ``files`` lowest precedence first."""

    files: list[str] = field(default_factory=list)
    sections: dict[str, dict[str, Sourced]] = field(default_factory=dict)
    # The .torchxconfig files among ``files``: what xrun does not know there is skipped.
    torchx_files: list[str] = field(default_factory=list)

    def usable(
        self, entries: dict[str, Sourced], known: Callable[[str], bool], what: str
    ) -> dict[str, Sourced]:
        """``entries`` less the ones a ``.torchxconfig`` gave that ``known`` refuses (one
        warning line each, as TorchX skips an option it does not know); an unknown key from
        a ``.xrunconfig`` stays, for the caller's one-line error."""
        out = {}
        for key, (value, source) in entries.items():
            if not known(key) and self._from_torchx(source):
                warn(f"{source}: xrun has no {what} {key!r}; skipped (TorchX-only)")
                continue
            out[key] = (value, source)
        return out

    def _from_torchx(self, source: str) -> bool:
        return any(source.startswith(f"{f} [") for f in self.torchx_files)

    def section(self, name: str) -> dict[str, Sourced]:
        return dict(self.sections.get(name, {}))

    def scheduler_defaults(self, scheduler: str) -> dict[str, Sourced]:
        return self.section(SCHEDULER_ALIASES.get(scheduler, scheduler))

    def component_defaults(self, component: str) -> dict[str, Sourced]:
        return self.section(COMPONENT_PREFIX + component)

    def default_scheduler(self) -> str | None:
        entry = self.sections.get(CLI_RUN, {}).get("scheduler")
        return entry[0].strip() if entry else None

    def default_component(self) -> str | None:
        """``[cli:run] component``: what ``xrun run`` runs when no component is named."""
        entry = self.sections.get(CLI_RUN, {}).get("component")
        return entry[0].strip() or None if entry else None


def current_dir() -> str:
    """``os.getcwd()``, or a UsageError when the shell's directory was deleted under it (a
    command that needs the cwd says so in one line; getcwd's FileNotFoundError names no file)."""
    try:
        return os.getcwd()
    except FileNotFoundError:
        raise UsageError(
            "the current directory no longer exists (it was deleted); cd to an existing "
            "directory and run the command again"
        ) from None


def _dirs(cwd: PathArg | None, home: PathArg | None) -> tuple[PathArg, PathArg | None]:
    """(home, cwd): the cwd None when it was deleted (it then holds no file)."""
    if cwd is None:
        try:
            cwd = os.getcwd()
        except FileNotFoundError:
            cwd = None
    return home or os.path.expanduser("~"), cwd


def _existing(dirs: Sequence[PathArg | None], filename: str) -> list[str]:
    """``filename`` in each of ``dirs`` where it is a file, in order, each file once."""
    out: list[str] = []
    for d in dirs:
        if d is None:
            continue
        p = os.path.join(d, filename)
        if os.path.isfile(p) and all(not os.path.samefile(p, q) for q in out):
            out.append(p)
    return out


def config_paths(cwd: PathArg | None = None, home: PathArg | None = None) -> list[str]:
    """The files that exist, lowest precedence first (home, then cwd; once if the same). A
    deleted cwd holds no file: only the home one is read (the commands that need the cwd
    itself say so, see :func:`current_dir`)."""
    home, cwd = _dirs(cwd, home)
    return _existing([home, cwd], FILENAME)


def torchx_config_paths(cwd: PathArg | None = None, home: PathArg | None = None) -> list[str]:
    """The ``.torchxconfig`` files TorchX would read, lowest precedence first: the one
    ``$TORCHXCONFIG`` names alone (a missing one is an error, as in TorchX), else the cwd's
    then the home one (TorchX applies ``[$HOME, $CWD]`` in order, keeping the first value)."""
    named = os.environ.get(TORCHX_ENV)
    if named is not None:
        if not os.path.isfile(named):
            raise UsageError(
                f"{TORCHX_ENV}={named}: no such file; point it at a .torchxconfig file or unset it"
            )
        return [named]
    home, cwd = _dirs(cwd, home)
    return _existing([cwd, home], TORCHX_FILENAME)


def warn(message: str) -> None:
    """One warning line on stderr (a config entry skipped)."""
    import sys

    print(f"xrun: warning: {message}", file=sys.stderr)


def load(
    cwd: PathArg | None = None,
    home: PathArg | None = None,
    schedulers: Callable[[], Sequence[str]] | None = None,
) -> Config:
    """Read and merge the config files (configparser is imported only when one exists).

    ``schedulers``: the names a scheduler section may have, asked only for a section that is
    no builtin scheduler's (the runner passes the registry's, plugins included; asking it
    reads the installed packages' entry points). Default: the builtins."""
    torchx = torchx_config_paths(cwd, home)
    paths = [*torchx, *config_paths(cwd, home)]
    cfg = Config(files=paths, torchx_files=torchx)
    for path in paths:
        for section, items in _read(path).items():
            # a TorchX .xrunconfig's [local_docker] is the [docker] section
            section = SCHEDULER_ALIASES.get(section, section)
            try:
                _check_section(path, section, items, schedulers or (lambda: _BUILTIN_SCHEDULERS))
            except UsageError:
                if path not in torchx:
                    raise
                # TorchX's other schedulers (kubernetes, aws_batch, ...) or keys xrun lacks
                warn(f"{path} [{section}]: xrun has no such section or key; skipped (TorchX-only)")
                continue
            merged = cfg.sections.setdefault(section, {})
            for key, value in items.items():
                merged[key] = (value, f"{path} [{section}] {key}")
    return cfg


def _read(path: str) -> dict[str, dict[str, str]]:
    import configparser  # benchmark 5: only when a config file exists

    # No interpolation: '%' in a value (e.g. a Slurm time format) must stay as written.
    parser = configparser.ConfigParser(interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keep memMB's case
    from xrun.specs.fields import read_text  # benchmark 5: only when a config file exists

    # read_text: a size cap (a ~/.xrunconfig that is /dev/zero or a huge file is one line)
    text = read_text(path, "config file")
    try:
        parser.read_string(text, source=str(path))
    except configparser.Error as e:
        first = " ".join(str(e).split())
        raise UsageError(f"config file {path} is not a valid INI file: {first}") from None
    return {s: dict(parser.items(s)) for s in parser.sections()}


def _check_section(
    path: str, section: str, items: dict[str, str], schedulers: Callable[[], Sequence[str]]
) -> None:
    if section.startswith(COMPONENT_PREFIX):
        if not section[len(COMPONENT_PREFIX) :].strip():
            raise UsageError(f"{path} [{section}]: name the component, e.g. [component:dist.ddp]")
        return
    if section == TRACKERS or (
        section.startswith(TRACKER_PREFIX) and section[len(TRACKER_PREFIX) :].strip()
    ):
        return
    if section == CLI_RUN:
        for key in items:
            if key not in _CLI_RUN_KEYS:
                raise UsageError(
                    f"{path} [{section}] {key}: unknown key; valid: {', '.join(_CLI_RUN_KEYS)}"
                )
        return
    if section in _BUILTIN_SCHEDULERS:
        return
    known = list(schedulers())
    if section in known:
        return
    valid = [*known, CLI_RUN, COMPONENT_PREFIX + "NAME", TRACKERS, TRACKER_PREFIX + "NAME"]
    import difflib  # benchmark 5: only a misspelt section needs it

    close = difflib.get_close_matches(section, valid, n=1)
    hint = f" (did you mean [{close[0]}]?)" if close else ""
    raise UsageError(
        f"{path}: unknown section [{section}]{hint}; valid: " + ", ".join(f"[{v}]" for v in valid)
    )
