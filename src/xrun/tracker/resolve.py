"""Which tracker backends a job uses: names, factories, the embedded default, checks at submit.

A tracker NAME (a key of ``[torchx:tracker]`` in ``.xrunconfig``, or of ``TORCHX_TRACKERS``) is,
as in TorchX 0.7.0, looked up in this order:

1. xrun's own backends: ``fsspec`` (:mod:`xrun.tracker.fsspec_backend`) and ``mlflow``
   (:mod:`xrun.tracker.mlflow_backend`, the ``[mlflow]`` extra);
2. an entry point of the group ``torchx.tracker`` (TorchX's group; a third party adds to it);
3. a module path, ``pkg.mod:factory``.

The factory is called with the tracker's config (``[tracker:NAME] config``, travelling to the
job as ``TORCHX_TRACKER_<NAME>_CONFIG``) and returns a :class:`~xrun.tracker.api.TrackerBase`.

With no tracker configured at all (no ``[torchx:tracker]`` section, no ``TORCHX_TRACKERS``), a
job xrun started records into the embedded default: the fsspec backend rooted at
``$XDG_STATE_HOME/xrun/tracker``. An empty ``[torchx:tracker]`` section or ``TORCHX_TRACKERS=``
(empty) turns tracking off.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from xrun.contract import RUN_ID_ENV, TRACKERS_ENV, tracker_config_env

if TYPE_CHECKING:
    from xrun.tracker.base import TrackerBase

BUILTINS = {
    "fsspec": "xrun.tracker.fsspec_backend:create",
    "mlflow": "xrun.tracker.mlflow_backend:create",
}
ENTRY_POINT_GROUP = "torchx.tracker"


class Tracker(NamedTuple):
    """A tracker configured on the launching side, and where its name and config were given
    (``FILE [SECTION] KEY`` or the variable): errors quote these."""

    name: str
    config: str | None
    name_source: str
    config_source: str


def _load_path(path: str) -> Any:
    # kept out of `import xrun.tracker`, a worker's cost (#25: tests/core/tracker/test_cost.py)
    import importlib

    module, _, attr = path.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split(".") if attr else []:
        obj = getattr(obj, part)
    return obj


def entry_point(name: str) -> Any:
    # kept out of `import xrun.tracker`, a worker's cost (#25: tests/core/tracker/test_cost.py)
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            return ep
    return None


def factory(name: str) -> Callable[[str | None], TrackerBase] | None:
    """The factory ``name`` stands for; None when nothing by that name can be found."""
    if name in BUILTINS:
        return _load_path(BUILTINS[name])
    ep = entry_point(name)
    if ep is not None:
        return ep.load()
    try:
        return _load_path(name)
    except (ImportError, AttributeError, ValueError):
        return None


def build(name: str, config: str | None) -> TrackerBase:
    make = factory(name)
    if make is None:
        raise ValueError(
            f"tracker {name!r}: no such backend; expected fsspec, mlflow, an entry point of the "
            f"group {ENTRY_POINT_GROUP!r} or MODULE:FACTORY"
        )
    return make(config)


def from_environ(env: Mapping[str, str]) -> list[TrackerBase]:
    """The backends of the job whose environment is ``env``. In a worker a tracker that cannot
    be built is reported on stderr and left out, as TorchX does: tracking must not end a job."""
    if TRACKERS_ENV not in env:
        # RUN_ID_ENV: set by the runner in every job xrun starts (xrun.tracker.submit): the
        # embedded default applies only there, never to a script run by hand.
        if RUN_ID_ENV not in env:
            return []
        names: list[str | None] = [None]  # the embedded default
    else:
        names = [n.strip() for n in env[TRACKERS_ENV].split(",") if n.strip()]
    out: list[TrackerBase] = []
    for name in names:
        config = env.get(tracker_config_env(name)) if name else None  # None: default
        try:
            out.append(_build_in_job(name or "fsspec", config))
        except Exception as e:  # any backend's failure: reported, not raised
            # kept out of `import xrun.tracker`, a worker's cost (#25: test_cost.py)
            from xrun.tracker.guard import describe, say

            say(f"tracker {name or 'default'} left out: {describe(e)}")
    return out


def _build_in_job(name: str, config: str | None) -> TrackerBase:
    """``build(name, config)`` as a job does it: xrun's own backends inline (building them
    touches no network: the first call does, within its deadline), any other factory within
    the deadline (it may connect); a factory that returns no backend is an error."""
    # kept out of `import xrun.tracker`, a worker's cost (#25: tests/core/tracker/test_cost.py)
    from xrun.tracker import guard

    if name in BUILTINS:
        backend = build(name, config)
    else:
        make = factory(name)  # its module imported here, not counted against the deadline
        if make is None:
            return build(name, config)  # raises: no such backend
        backend = guard.within(guard.timeout_s(), make, config)
    if not callable(getattr(backend, "add_metadata", None)):
        raise TypeError(f"its factory returned {type(backend).__name__}, not a TrackerBase")
    guard._NAMES[id(backend)] = name
    return backend
