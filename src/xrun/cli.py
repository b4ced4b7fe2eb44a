"""The ``xrun`` command line: parse, dispatch, and map errors to exit codes.

Exit codes: 0 success; 1 the job failed or the handle is unknown; 2 a usage or validation
error, printed as ONE line ``xrun: error: <message>`` without a traceback. Each command lives in
``cli_run.py`` (``run``) or ``cli_cmds.py`` (the others), imported only when that command runs,
so ``xrun run --dryrun`` does not pay for what ``xrun log`` needs.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from xrun.errors import AppNotFoundError, SchedulerError, UsageError

PROG = "xrun"


def one_line(err: BaseException) -> str:
    """An error message on one line (a multi-line message is joined with '; ')."""
    return "; ".join(s.strip() for s in str(err).splitlines() if s.strip()) or type(err).__name__


# The options of `xrun run` that take a value; the first other non-option token is the
# component, and everything after it belongs to the component verbatim (including `--`).
_RUN_VALUE_OPTS = ("-s", "--scheduler", "-cfg", "--cfg", "--workspace")


def split_run_argv(argv: Sequence[str]) -> tuple[list[str], str | None, list[str]]:
    """``run``'s argv -> (xrun's own options, the component, the component's arguments)."""
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            rest = list(argv[i + 1 :])
            return list(argv[:i]), (rest[0] if rest else None), rest[1:]
        if not tok.startswith("-") or tok == "-":
            return list(argv[:i]), tok, list(argv[i + 1 :])
        if tok in _RUN_VALUE_OPTS:
            i += 1  # skip its value
        i += 1
    return list(argv), None, []


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (the console script passes it to sys.exit)."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        return _dispatch(args)
    except UsageError as e:
        _error(one_line(e))
        return 2
    except (AppNotFoundError, SchedulerError) as e:
        _error(one_line(e))
        return 1
    except KeyboardInterrupt:
        _error("interrupted")
        return 130
    except BrokenPipeError:  # `xrun log ... | head`: the reader left; not an error of ours
        # Point stdout at /dev/null so the interpreter's final flush does not complain.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _error(msg: str) -> None:
    sys.stdout.flush()
    print(f"{PROG}: error: {msg}", file=sys.stderr, flush=True)


@dataclass
class RunOptions:
    """``xrun run``'s own options (everything before the component)."""

    scheduler: str | None = None
    cfg: list[str] = field(default_factory=list)
    dryrun: bool = False
    wait: bool = False
    log: bool = False
    workspace: str | None = None


def parse_run_options(own: Sequence[str]) -> RunOptions | None:
    """``run``'s own options without argparse (None: let argparse handle it).

    Why: constructing argparse parsers costs more than the rest of ``xrun run --dryrun``
    together (every help string goes through gettext, which looks for translation files).
    argparse still handles ``--help`` and anything unusual, so the messages stay the same.
    """
    opts = RunOptions()
    values = {
        "-s": "scheduler",
        "--scheduler": "scheduler",
        "-cfg": "cfg",
        "--cfg": "cfg",
        "--workspace": "workspace",
    }
    flags = {"--dryrun": "dryrun", "--wait": "wait", "--log": "log"}
    i = 0
    while i < len(own):
        tok = own[i]
        name, eq, value = tok.partition("=")
        if tok in flags:
            setattr(opts, flags[tok], True)
        elif name in values and (eq or i + 1 < len(own)):
            if not eq:
                i += 1
                value = own[i]
            if values[name] == "cfg":
                opts.cfg.append(value)
            else:
                setattr(opts, values[name], value)
        else:
            return None  # --help, a typo, a missing value: argparse says it best
        i += 1
    return opts


def _parse_run_with_argparse(own: Sequence[str]) -> RunOptions:
    from xrun.cli_parser import build_parser

    ns = vars(build_parser().parse_args(["run", *own]))
    return RunOptions(**{k: v for k, v in ns.items() if k in RunOptions.__dataclass_fields__})


def _dispatch(args: list[str]) -> int:
    if args and args[0] == "run":
        own, component, comp_args = split_run_argv(args[1:])
        opts = parse_run_options(own) or _parse_run_with_argparse(own)
        if component is None:
            raise UsageError(
                "xrun run: missing COMPONENT; e.g. xrun run dist.ddp -j 1x2 --script train.py "
                "(`xrun builtins` lists the components)"
            )
        from xrun.cli_run import cmd_run

        return cmd_run(opts, component, comp_args)
    from xrun.cli_parser import build_parser

    parser = build_parser()
    ns = parser.parse_args(args)
    if ns.command is None:
        parser.print_help(sys.stderr)
        return 2
    from xrun import cli_cmds

    handler = getattr(cli_cmds, f"cmd_{ns.command}")
    code: int = handler(ns)
    return code


if __name__ == "__main__":
    sys.exit(main())
