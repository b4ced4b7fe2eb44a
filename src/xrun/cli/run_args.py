"""``xrun run``'s own options and inputs, shared by a plain run (:mod:`xrun.cli.cmd_run`) and
a sweep (:mod:`xrun.cli.run_sweep`).

The options are parsed by hand (:func:`parse_run_options`): building argparse parsers costs
more than the rest of ``xrun run --dryrun`` together (benchmark 5: every help string goes
through gettext, which looks for translation files). The argparse form of the same options
(:func:`add_run_options`) handles ``--help`` and mistakes, so the messages stay argparse's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from xrun.config import current_dir
from xrun.errors import UsageError
from xrun.runner import Runner
from xrun.schedulers.api import WorkspaceBuilder
from xrun.specs import AppDef, appdef_from_yaml

if TYPE_CHECKING:
    import argparse  # importing it costs start-up time; only --help and mistakes need it

DEFAULT_SCHEDULER = "local_cwd"
_CFG_FORM = "-cfg key=value,key2=value2 (a list value uses ';': -cfg mounts=a;b)"
# Starts the scheduler-request part of --dryrun's output (everything above it is the YAML).
REQUEST_MARKER = "# ----"


# The options of `xrun run` that take a value; the first other non-option token is the
# component, and everything after it belongs to the component verbatim (including `--`).
_VALUE_OPTS = {
    "-s": "scheduler",
    "--scheduler": "scheduler",
    "-cfg": "cfg",
    "--cfg": "cfg",
    "--workspace": "workspace",
    "--parent_run_id": "parent_run_id",
    "--parent-run-id": "parent_run_id",
    "--sweep": "sweep",
    "--sweep-file": "sweep_file",
    "--max-parallel": "max_parallel",
}
_FLAGS = {"--dryrun": "dryrun", "--wait": "wait", "--log": "log"}
_HELP = ("-h", "--help")


@dataclass
class RunOptions:
    """``xrun run``'s own options (everything before the component)."""

    scheduler: str | None = None
    cfg: list[str] = field(default_factory=list)
    dryrun: bool = False
    wait: bool = False
    log: bool = False
    workspace: str | None = None
    parent_run_id: str | None = None
    sweep: list[str] = field(default_factory=list)  # NAME=V1,V2,...: a sweep (run_sweep.py)
    sweep_file: str | None = None
    max_parallel: str | None = None

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> RunOptions:
        """From argparse's result for ``run`` (see :func:`add_run_arguments`)."""
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in vars(ns).items() if k in known})


def _is_own_option(tok: str) -> bool:
    return tok in _FLAGS or tok in _HELP or tok.partition("=")[0] in _VALUE_OPTS


def split_run_argv(argv: Sequence[str]) -> tuple[list[str], str | None, list[str]]:
    """``run``'s argv -> (xrun's own options, the component, the component's arguments).

    The component is None when none is named: the arguments then start at the first token
    that is not one of ``run``'s options (or follow ``--``), for ``[cli:run] component``.
    """
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            rest = list(argv[i + 1 :])
            if rest and rest[0].startswith("-"):  # TorchX's `run -- --msg hi` (default component)
                return list(argv[:i]), None, rest
            return list(argv[:i]), (rest[0] if rest else None), rest[1:]
        if not tok.startswith("-") or tok == "-":
            return list(argv[:i]), tok, list(argv[i + 1 :])
        if not _is_own_option(tok):
            return list(argv[:i]), None, list(argv[i:])
        if tok in _VALUE_OPTS:
            i += 1  # skip its value
        i += 1
    return list(argv), None, []


def parse_run_options(own: Sequence[str]) -> RunOptions | None:
    """``run``'s own options without argparse; None: let argparse handle them (``--help``, a
    typo, a missing value)."""
    opts = RunOptions()
    i = 0
    while i < len(own):
        tok = own[i]
        name, eq, value = tok.partition("=")
        if tok in _FLAGS:
            setattr(opts, _FLAGS[tok], True)
        elif name in _VALUE_OPTS and (eq or i + 1 < len(own)):
            if not eq:
                i += 1
                value = own[i]
            if _VALUE_OPTS[name] in ("cfg", "sweep"):
                getattr(opts, _VALUE_OPTS[name]).append(value)
            else:
                setattr(opts, _VALUE_OPTS[name], value)
        else:
            return None
        i += 1
    return opts


def add_run_options(run: argparse.ArgumentParser) -> None:
    """``run``'s options for argparse."""
    run.add_argument(
        "-s",
        "--scheduler",
        help="local_cwd (default; or [cli:run] in .xrunconfig), slurm, docker, ...",
    )
    run.add_argument(
        "-cfg",
        "--cfg",
        action="append",
        default=[],
        metavar="K=V,...",
        help="run options (see `xrun runopts S`); list values use ';'",
    )
    run.add_argument(
        "--dryrun",
        action="store_true",
        help="print the AppDef (YAML) and the scheduler's request; submit nothing",
    )
    run.add_argument("--wait", action="store_true", help="wait until the app ends")
    run.add_argument("--log", action="store_true", help="stream every replica's log (waits)")
    run.add_argument(
        "--workspace",
        metavar="DIR",
        help="a local directory the scheduler makes available (docker: image)",
    )
    run.add_argument(
        "--parent_run_id",
        "--parent-run-id",
        metavar="ID",
        help="a parent run id for experiment tracking: TORCHX_PARENT_RUN_ID in every replica",
    )
    run.add_argument(
        "--sweep",
        action="append",
        default=[],
        metavar="NAME=V1,V2,...",
        help="run one trial per value (repeat: the cartesian grid); {{NAME}} in the component's "
        "arguments is the trial's value, XRUN_SWEEP_NAME in its env",
    )
    run.add_argument(
        "--sweep-file",
        metavar="FILE",
        help="the trials as a YAML list of mappings, e.g. [{lr: 0.1}, {lr: 0.01}]",
    )
    run.add_argument(
        "--max-parallel",
        metavar="K",
        help="a sweep runs at most K trials at once (default: local_cwd/docker what fits this "
        "machine; slurm no limit)",
    )


def parse_cfg(texts: list[str]) -> dict[str, str]:
    """``-cfg`` strings -> raw run options. An item without ``=`` continues the previous value."""
    out: dict[str, str] = {}
    for text in texts:
        last: str | None = None
        for item in text.split(","):
            key, sep, value = item.partition("=")
            if not item.strip():
                continue
            if sep and key.strip():
                last = key.strip()
                out[last] = value.strip()
            elif last is not None:
                out[last] += "," + item
            else:
                raise UsageError(f"-cfg {text!r}: {item!r} is not KEY=VALUE; expected {_CFG_FORM}")
    return out


def is_spec_file(component: str) -> bool:
    return component.endswith((".yaml", ".yml"))


def load_app(runner: Runner, component: str, comp_args: list[str]) -> AppDef:
    """The AppDef from a saved YAML spec or from calling the component with its arguments."""
    if is_spec_file(component):
        if comp_args:
            raise UsageError(
                f"{component} is a saved AppDef and takes no arguments (got {comp_args[0]!r}); "
                "edit the file instead"
            )
        from xrun.specs.fields import read_text  # benchmark 5: a component's dry run reads no file

        return appdef_from_yaml(read_text(component, "spec"), source=component)
    return runner.component_app(component, comp_args)


def workspace_arg(runner: Runner, scheduler: str, given: str | None) -> str | None:
    """``--workspace`` as the Runner takes it, None meaning none. Where the defaults are made:
    on a scheduler that builds the workspace into its images (docker) no ``--workspace`` is
    the cwd, so the job runs the code as it is now, and ``--workspace ''`` builds none (the
    role images run unchanged); elsewhere both are none (the job runs in the cwd)."""
    if given is None and isinstance(runner.scheduler(scheduler), WorkspaceBuilder):
        return current_dir()
    return given or None


def is_sweep(ns: RunOptions) -> bool:
    """A run with --sweep/--sweep-file/--max-parallel: :func:`xrun.cli.run_sweep.cmd_run_sweep`."""
    return bool(ns.sweep or ns.sweep_file or ns.max_parallel is not None)


def resolve_component(runner: Runner, component: str | None, comp_args: list[str]) -> str:
    """The component named on the command line, else ``[cli:run] component`` of .xrunconfig."""
    component = component or runner.config.default_component()
    if component is None:
        raise _missing_component(comp_args)
    return component


def _missing_component(comp_args: list[str]) -> UsageError:
    fix = "name one, e.g. xrun run dist.ddp -j 1x2 --script train.py (`xrun builtins` lists them)"
    fix += ", or set a default: [cli:run] component = NAME in .xrunconfig"
    if comp_args:
        return UsageError(
            f"xrun run: {comp_args[0]!r} is not an option of xrun run and no COMPONENT is "
            f"named before it; {fix}"
        )
    return UsageError(f"xrun run: missing COMPONENT; {fix}")
