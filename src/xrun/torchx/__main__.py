"""``python -m xrun.torchx``: run a program written for TorchX without TorchX installed.

    python -m xrun.torchx SCRIPT [ARGS...]   run SCRIPT as ``python SCRIPT ARGS`` would, its
                                             ``import torchx...`` answered by xrun's stand-ins
    python -m xrun.torchx --install          from now on, plain ``python SCRIPT`` does the same
                                             in this environment (a .pth file in site-packages)
    python -m xrun.torchx --uninstall        remove that file
    python -m xrun.torchx --status           say whether it is installed

With TorchX installed, the real TorchX is imported in every case.
"""

from __future__ import annotations

import os
import sys
import sysconfig

PTH_NAME = "xrun-torchx-stand-ins.pth"
# One line: a .pth line that starts with "import" is executed at every interpreter start.
PTH_LINE = "import xrun.torchx.autoload as _x; _x.install()\n"
USAGE = "usage: python -m xrun.torchx SCRIPT [ARGS...] | --install | --uninstall | --status"


def pth_path() -> str:
    return os.path.join(sysconfig.get_paths()["purelib"], PTH_NAME)


def _fail(message: str) -> int:
    print(f"xrun: error: {message}", file=sys.stderr)
    return 2


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip() if argv else USAGE, file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    first = argv[0]
    if first in ("--install", "--uninstall", "--status"):
        if len(argv) > 1:
            return _fail(f"{first} takes no argument (got {argv[1]!r}); {USAGE}")
        return _manage(first)
    if first.startswith("-"):
        return _fail(f"unknown option {first!r}; {USAGE}")
    if not os.path.isfile(first):
        return _fail(f"no such script: {first!r}; {USAGE}")
    import runpy

    from xrun.torchx import autoload

    autoload.activate()
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(first)))  # as `python SCRIPT` does
    runpy.run_path(first, run_name="__main__")
    return 0


def _manage(action: str) -> int:
    path = pth_path()
    if action == "--status":
        print(f"{'installed' if os.path.isfile(path) else 'not installed'}: {path}")
        return 0
    if action == "--uninstall":
        if os.path.isfile(path):
            os.remove(path)
        print(f"removed {path}")
        return 0
    try:
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(PTH_LINE)
        os.replace(tmp, path)  # whole or not at all: a half-written .pth breaks every start
    except OSError as e:
        return _fail(f"cannot write {path}: {e.strerror}; install into a venv you own")
    print(f"installed {path}: `python SCRIPT` now answers `import torchx` with xrun's stand-ins")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
