"""TorchX's imports for any Python program, when TorchX is not installed: a finder that, on
the first ``import torchx``, puts xrun's stand-ins in place for the rest of the process.

Used by ``python -m xrun.torchx SCRIPT`` and by the ``.pth`` file that
``python -m xrun.torchx --install`` writes (so that an unchanged TorchX Runner script runs as
``python script.py``). Importing this module costs nothing else: the stand-ins are built only
when a program imports ``torchx``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Sequence

_active: list[bool] = []  # set once the stand-ins are in place for the process's life


class _TorchxFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "torchx":
            return None
        sys.meta_path.remove(self)  # once: from here on the stand-ins (or TorchX) answer
        if importlib.machinery.PathFinder.find_spec("torchx") is not None:
            return None  # the real TorchX is installed: it wins
        activate()
        return importlib.machinery.ModuleSpec("torchx", self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return sys.modules["torchx"]

    def exec_module(self, module: types.ModuleType) -> None:
        """The stand-in is whole already."""


def activate() -> None:
    """Put the stand-ins in place for good (a no-op when they or TorchX already are)."""
    if _active:
        return
    from xrun.torchx.compat import install_stand_ins

    install_stand_ins()  # never taken away: the program imports torchx at any time
    _active.append(True)


def install() -> None:
    """Answer the process's first ``import torchx`` with the stand-ins (if TorchX is absent)."""
    if not any(isinstance(f, _TorchxFinder) for f in sys.meta_path):
        sys.meta_path.append(_TorchxFinder())
