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


_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _log_level(args: list[str]) -> list[str]:
    """TorchX's top-level ``--log_level LEVEL`` (before the command): the level of Python's
    logging for what xrun and its plugins log (trackers, schedulers' client libraries); off
    unless given (logging is imported only then: benchmark 5). Returns the rest of ``args``."""
    if not args or not args[0].startswith(("--log_level", "--log-level")):
        return args
    flag, eq, value = args[0].partition("=")
    if flag not in ("--log_level", "--log-level"):
        return args  # e.g. --log_levelx: argparse says it is unknown
    rest = args[1:]
    if not eq:
        if not rest:
            raise UsageError(f"{flag} needs a level: one of {', '.join(_LOG_LEVELS)}")
        value, rest = rest[0], rest[1:]
    if value.upper() not in _LOG_LEVELS:
        raise UsageError(
            f"{flag} {value!r} is not a log level; expected one of {', '.join(_LOG_LEVELS)}"
        )
    import logging

    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")  # a handler, if none
    logging.getLogger().setLevel(value.upper())
    return _log_level(rest)


def _dispatch(args: list[str]) -> int:
    args = _log_level(args)
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
