"""Named resources: ``-h gpu.small`` instead of ``--cpu 8 --gpu 1 --memMB 32768``.

The builtin set is generic (no cloud instance types)::

    cpu.small    1 cpu,  1 GiB        gpu.small    1 GPU,  8 cpu,  32 GiB
    cpu.medium   4 cpu,  8 GiB        gpu.medium   2 GPUs, 16 cpu, 64 GiB
    cpu.large   16 cpu, 32 GiB        gpu.large    4 GPUs, 32 cpu, 128 GiB
    cpu.xlarge  32 cpu, 64 GiB        gpu.xlarge   8 GPUs, 64 cpu, 256 GiB

More come from the entry point group ``xrun.named_resources``: each entry point's name is the
resource name and its object a zero-argument callable returning a
:class:`~xrun.specs.Resource`::

    [project.entry-points."xrun.named_resources"]
    "a100.8" = "mypkg.resources:a100_8"

Plugins add names; a plugin name equal to a builtin is ignored (the builtin wins), so a package
cannot silently change what ``gpu.small`` means.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from xrun.errors import UsageError
from xrun.specs import Resource

_GiB = 1024

# name -> (cpu, gpu, memMB)
_BUILTINS: dict[str, tuple[int, int, int]] = {
    "cpu.small": (1, 0, 1 * _GiB),
    "cpu.medium": (4, 0, 8 * _GiB),
    "cpu.large": (16, 0, 32 * _GiB),
    "cpu.xlarge": (32, 0, 64 * _GiB),
    "gpu.small": (8, 1, 32 * _GiB),
    "gpu.medium": (16, 2, 64 * _GiB),
    "gpu.large": (32, 4, 128 * _GiB),
    "gpu.xlarge": (64, 8, 256 * _GiB),
}

GROUP = "xrun.named_resources"


def _plugins() -> dict[str, Any]:
    """Entry points by name; scanned only when a name is not a builtin (the scan is slow)."""
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=GROUP) if ep.name not in _BUILTINS}


def names() -> list[str]:
    """Every known name: builtins first, then plugins."""
    return list(_BUILTINS) + sorted(_plugins())


def get_named_resource(name: str) -> Resource:
    """The :class:`Resource` called ``name`` (a fresh copy; callers may change it)."""
    if name in _BUILTINS:
        cpu, gpu, mem = _BUILTINS[name]
        return Resource(cpu=cpu, gpu=gpu, memMB=mem)
    plugins = _plugins()
    if name in plugins:
        try:
            factory: Callable[[], Any] = plugins[name].load()
            res = factory() if callable(factory) else factory
        except Exception as e:  # a broken plugin must say so, not look like an unknown name
            raise UsageError(f"named resource plugin {name!r} failed to load: {e}") from None
        if not isinstance(res, Resource):
            raise UsageError(
                f"named resource plugin {name!r} returned {type(res).__name__}, expected a Resource"
            )
        return res
    known = list(_BUILTINS) + sorted(plugins)
    import difflib  # lazy: only error paths need it

    close = difflib.get_close_matches(name, known, n=3)
    hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
    raise UsageError(f"unknown named resource {name!r}{hint}; available: {', '.join(known)}")
