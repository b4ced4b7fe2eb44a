"""The ``xrun`` command line: the top layer. Nothing below it imports it.

One module per command (``cmd_<name>.py``, each owning its arguments: ``add_arguments`` for
argparse and ``main(ns)``), listed once in ``xrun.cli.common.COMMANDS``; this module only
dispatches and maps errors to exit codes: 0 success; 1 the job failed or the handle is unknown;
2 a usage or validation error, printed as ONE line ``xrun: error: <message>`` without a
traceback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from xrun.cli.common import PROG, command_module, one_line
from xrun.cli.run_args import RunOptions, parse_run_options, split_run_argv
from xrun.errors import AppNotFoundError, SchedulerError, UsageError, printable


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
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _error(msg: str) -> None:
    sys.stdout.flush()
    print(f"{PROG}: error: {printable(msg)}", file=sys.stderr, flush=True)


def _dispatch(args: list[str]) -> int:
    if args and args[0] == "run":
        # `xrun run` parses its own options by hand: argparse (benchmark 5: it costs more than
        # the rest of a dry run) only for --help and mistakes, whose messages stay argparse's.
        own, component, comp_args = split_run_argv(args[1:])
        opts = parse_run_options(own)
        if opts is None:
            from xrun.cli.parser import build_parser

            opts = RunOptions.from_namespace(build_parser().parse_args(["run", *own]))
        code: int = command_module("run").main(opts, component, comp_args)
        return code
    from xrun.cli.parser import build_parser  # see above: benchmark 5

    parser = build_parser()
    ns = parser.parse_args(args)
    if ns.command is None:
        parser.print_help(sys.stderr)
        return 2
    code = command_module(ns.command).main(ns)
    return code


if __name__ == "__main__":
    sys.exit(main())
