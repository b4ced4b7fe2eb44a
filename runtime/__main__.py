"""``python -m xrun.runtime`` / ``xrun-agent``: torchrun's command line on xrun's agent.

A thin layer: parse the flags into a ``LaunchConfig`` (``args.py``), run the ``Agent``
(``agent.py``), print the failure summary, write the agent's own error file for its scheduler
and exit with the agent's code (0 ok, 1 failed, 2 usage error, 128+N killed by signal N).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from xrun.errors import UsageError

PROG = "xrun-agent"


def main(argv: Sequence[str] | None = None) -> int:
    from xrun.runtime.args import parse

    try:
        config, entrypoint, args = parse(argv)
    except UsageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2

    from xrun.runtime.agent import Agent, write_agent_error_file

    name = entrypoint if isinstance(entrypoint, str) else args[0]
    if isinstance(entrypoint, str) and args[:1] == ("-u",):
        name = args[-1] if args[1:2] != ("-m",) else args[2]
    script = [a for a in args if a not in ("-u", "-m")][:1]
    try:
        result = Agent(config, entrypoint, args, name=script[0] if script else str(name)).run()
    except UsageError as e:  # found late, e.g. an endpoint host that does not resolve
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    if result.exitcode != 0:
        print(result.message if result.failures else f"{PROG}: {result.message}",
              file=sys.stderr, flush=True)
        # The scheduler above us reads this file (torchrun's @record on its main does the same);
        # the workers got their own error files under the log dir, never this one.
        own = os.environ.get("TORCHELASTIC_ERROR_FILE")
        if own:
            try:
                write_agent_error_file(own, result)
            except OSError as e:
                print(f"{PROG}: could not write {own}: {e}", file=sys.stderr)
    return result.exitcode


if __name__ == "__main__":
    sys.exit(main())
