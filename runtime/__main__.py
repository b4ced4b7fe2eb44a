"""``python -m xrun.runtime`` / ``xrun-agent``: torchrun's command line on xrun's agent.

A thin layer: parse the flags into a ``LaunchConfig`` (``args.py``), run the ``Agent``
(``agent.py``), print the failure summary, write the agent's own error file for its scheduler
and exit with the agent's code (0 ok, 1 failed, 2 usage error, 128+N killed by signal N). When
the scheduler names one (``$XRUN_EXIT_RECORD``), the exit code also goes to that file, so the
scheduler learns how the replica ended even if it was not there to see it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence

from xrun.contract import EXIT_RECORD_ENV
from xrun.errors import UsageError, printable

from .agent import Agent
from .args import entrypoint_name, parse
from .errors import root_cause, write_agent_error_file

PROG = "xrun-agent"


def main(argv: Sequence[str] | None = None) -> int:
    cause: dict[str, object] = {}
    try:
        code = _main(argv, cause)
    except KeyboardInterrupt:  # SIGINT before the agent handles signals (while parsing)
        code = 130
    write_exit_record(code, cause)
    return code


def _main(argv: Sequence[str] | None, cause: dict[str, object]) -> int:
    """Run the agent; ``cause`` gets what the exit record says about a failure."""
    try:
        config, entrypoint, args = parse(argv)
    except UsageError as e:
        print(f"{PROG}: error: {printable(e)}", file=sys.stderr)
        return 2

    name = entrypoint_name(entrypoint, args)
    try:
        result = Agent(config, entrypoint, args, name=name).run()
    except UsageError as e:  # found late, e.g. an endpoint host that does not resolve
        print(f"{PROG}: error: {printable(e)}", file=sys.stderr)
        return 2
    if result.exitcode != 0:
        # For the scheduler that must tell, of several failed replicas, the one whose failure
        # is the job's root cause from the ones that learned of it from a peer (local_cwd).
        cause["by_peer"] = result.by_peer
        if result.failures:
            first = result.failures[root_cause(result.failures)]
            cause["root_cause"], cause["failed_at"] = first.message[:300], first.exit_time
        print(
            result.message if result.failures else f"{PROG}: {result.message}",
            file=sys.stderr,
            flush=True,
        )
        if result.failures:
            # One line last: what a scheduler that keeps only the replica's last stderr line
            # (docker's status, slurm's) shows as the replica's error.
            rank = root_cause(result.failures)
            f = result.failures[rank]
            line = (f.message.splitlines() or [""])[-1 if f.has_error_file() else 0][:300]
            at = f" (rank {rank})" if f.has_error_file() else ""  # ours name it already
            # The job-wide budget or quarantine that ended this node (runtime/restarts.py puts
            # it first in the message): on this line, `xrun status` shows it.
            head = result.message.partition("\n")[0]
            note = f"; {head[len(PROG) + 2 :]}" if head.startswith(f"{PROG}: ") else ""
            print(f"{PROG}: root cause: {line}{at}{note}", file=sys.stderr, flush=True)
        elif "\n" in result.message:
            # No worker failed: the agent ended the attempt, and a report follows its cause (a
            # stall: the ranks' stacks). The cause again, last, where docker's and slurm's
            # status look for it; a one-line message is its own last line.
            line = result.message.splitlines()[0][:300]
            print(f"{PROG}: root cause: {line}", file=sys.stderr, flush=True)
        # The scheduler above us reads this file (torchrun's @record on its main does the same);
        # the workers got their own error files under the log dir, never this one.
        own = os.environ.get("TORCHELASTIC_ERROR_FILE")
        if own:
            try:
                write_agent_error_file(own, result)
            except OSError as e:
                print(f"{PROG}: could not write {own}: {e}", file=sys.stderr)
    return result.exitcode


def write_exit_record(code: int, cause: dict[str, object] | None = None) -> None:
    """``{"exitcode": code, ...}`` to ``$XRUN_EXIT_RECORD`` (atomically), if it is set; a
    failure adds ``by_peer`` (a peer's failure ended this node) and, when this node's workers
    failed, ``root_cause`` (the first failure's headline) and ``failed_at`` (its epoch time)."""
    path = os.environ.get(EXIT_RECORD_ENV)
    if not path:
        return
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as f:
            record = {"exitcode": code, "pid": os.getpid(), "ended_at": time.time()}
            json.dump({**record, **(cause or {})}, f)
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        print(f"{PROG}: could not write the exit record {path}: {e}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
