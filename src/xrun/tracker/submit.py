"""The launching side of tracking: what every replica learns about its job, TorchX's variables
and xrun's stable run id (names: :mod:`xrun.contract`), and the trackers the submitter
configured. The runner and the sweeps call it; a job's side is :mod:`xrun.tracker.api`.

The runner sets, in every role's environment (TorchX 0.7.0's ``Runner.dryrun`` does the same):

- ``TORCHX_JOB_ID``: the app handle, ``scheduler://session/${app_id}`` (the scheduler fills in
  the app id); the tracker's run id (:mod:`xrun.tracker`);
- ``TORCHX_PARENT_RUN_ID``: ``xrun run --parent_run_id ID`` (or this variable in the
  submitter's environment, which wins, as in TorchX);
- ``TORCHX_TRACKERS``: the tracker names, the keys of the ``[torchx:tracker]`` section of
  ``.xrunconfig`` (or this variable in the submitter's environment, comma-separated); set
  empty when that section is empty (tracking turned off); not set with no section at all (a
  job then records into the embedded default, see :mod:`xrun.tracker.resolve`);
- ``TORCHX_TRACKER_<NAME>_CONFIG``: each tracker's ``config`` from ``[tracker:<name>]`` (or
  that variable in the submitter's environment).

xrun adds ``XRUN_RUN_ID``, ``<scheduler>_<session>_${app_id}``: the job's id as a name (no
``/`` or ``:``) for trainers that name their own W&B/MLflow runs. Like the handle, it stays the
same across the agent's in-place restarts, Slurm requeues and docker retries.

The dist components add ``TORCHX_TRACKING_EXPERIMENT_NAME`` (from ``--name EXP/RUN``).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from xrun.config import TRACKER_PREFIX, TRACKERS, Config
from xrun.contract import (
    JOB_ID_ENV,
    PARENT_RUN_ID_ENV,
    RUN_ID_ENV,
    TRACKERS_ENV,
    tracker_config_env,
)

if TYPE_CHECKING:
    from xrun.specs import AppDef
    from xrun.tracker.resolve import Tracker


def configured(config: Config) -> list[Tracker] | None:
    """The trackers the submitter configured; None: none configured (the embedded default
    applies), [] turned off (an empty section, or ``TORCHX_TRACKERS=``)."""
    section = config.section(TRACKERS)
    if TRACKERS_ENV in os.environ:
        names = [n.strip() for n in os.environ[TRACKERS_ENV].split(",") if n.strip()]
        name_sources = dict.fromkeys(names, f"{TRACKERS_ENV}={os.environ[TRACKERS_ENV]}")
    elif TRACKERS in config.sections:
        names = list(section)
        name_sources = {n: section[n][1] for n in names}
    else:
        return None
    # benchmark 5: a dry run with no tracker configured never loads the tracker package
    from xrun.tracker.resolve import Tracker

    out = []
    for name in names:
        env_name = tracker_config_env(name)
        cfg: str | None
        entry = config.section(TRACKER_PREFIX + name).get("config")
        if env_name in os.environ:
            cfg, where = os.environ[env_name], env_name
        elif entry:
            cfg, where = entry[0].strip() or None, entry[1]
        else:
            cfg, where = None, f"[{TRACKER_PREFIX}{name}] config"
        out.append(Tracker(name, cfg, name_sources[name], where))
    return out


def trackers(config: Config) -> dict[str, str | None]:
    """Tracker name -> its config (None: none given), from the environment or the config."""
    return {t.name: t.config for t in configured(config) or []}


def run_id(scheduler: str, session: str, app_id: str) -> str:
    return f"{scheduler}_{session}_{app_id}"


def job_env(
    handle: str, parent_run_id: str | None, config: Config, xrun_run_id: str | None = None
) -> dict[str, str]:
    """The variables above for a job whose handle (with the ``${app_id}`` macro) is
    ``handle``. A tracker config that cannot work is a UsageError here, at submit."""
    env = {JOB_ID_ENV: handle}
    if xrun_run_id:
        env[RUN_ID_ENV] = xrun_run_id
    parent = os.environ.get(PARENT_RUN_ID_ENV, parent_run_id)
    if parent:
        env[PARENT_RUN_ID_ENV] = parent
    found = configured(config)
    if found is None:
        return env
    # benchmark 5: the tracker's checks only at submit with a tracker configured
    from xrun.tracker.check import check_trackers

    check_trackers(found)
    env[TRACKERS_ENV] = ",".join(t.name for t in found)
    for t in found:
        if t.config:
            env[tracker_config_env(t.name)] = t.config
    return env


def set_parent(apps: list[AppDef], parent: str) -> None:
    """Make each app's run a child of ``parent`` (a sweep's trials: of the sweep's handle),
    unless the submitter named a parent of their own."""
    for app in apps:
        for role in app.roles:
            role.env.setdefault(PARENT_RUN_ID_ENV, parent)
