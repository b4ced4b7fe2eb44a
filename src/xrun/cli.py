"""The ``xrun`` command line: parse, dispatch, and map errors to exit codes.

Exit codes: 0 success; 1 the job failed or the handle is unknown; 2 a usage or validation
error, printed as ONE line ``xrun: error: <message>`` without a traceback. This module only maps
a command to the module that owns it: ``cli_run.py`` (``run``, with its options;
``cli_sweep.py`` for a run with ``--sweep``) or ``cli_cmds.py`` (the others), imported only
when that command runs, so ``xrun run --dryrun`` does not pay for what ``xrun log`` needs.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from xrun.errors import AppNotFoundError, SchedulerError, UsageError, printable

PROG = "xrun"


def one_line(err: BaseException) -> str:
    """An error message on one line (a multi-line message is joined with '; ')."""
    return "; ".join(s.strip() for s in str(err).splitlines() if s.strip()) or type(err).__name__


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
    print(f"{PROG}: error: {printable(msg)}", file=sys.stderr, flush=True)


def _dispatch(args: list[str]) -> int:
    if args and args[0] == "run":
        from xrun import cli_run

        own, component, comp_args = cli_run.split_run_argv(args[1:])
        opts = cli_run.parse_run_options(own)
        if opts is None:  # --help, a typo, a missing value: argparse says it best
            from xrun.cli_parser import build_parser

            opts = cli_run.RunOptions.from_namespace(build_parser().parse_args(["run", *own]))
        if cli_run.is_sweep(opts):
            from xrun import cli_sweep

            return cli_sweep.cmd_run_sweep(opts, component, comp_args)
        return cli_run.cmd_run(opts, component, comp_args)
    from xrun.cli_parser import build_parser

    parser = build_parser()
    ns = parser.parse_args(args)
    if ns.command is None:
        parser.print_help(sys.stderr)
        return 2
    if ns.command == "tracker":
        from xrun import cli_tracker

        return cli_tracker.cmd_tracker(ns)
    from xrun import cli_cmds

    handler = getattr(cli_cmds, f"cmd_{ns.command}")
    code: int = handler(ns)
    return code


if __name__ == "__main__":
    sys.exit(main())
