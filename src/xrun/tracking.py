"""What every replica learns about its job for experiment tracking: TorchX's variables.

The runner sets, in every role's environment (TorchX 0.7.0's ``Runner.dryrun`` does the same):

- ``TORCHX_JOB_ID``: the app handle, ``scheduler://session/${app_id}`` (the scheduler fills in
  the app id);
- ``TORCHX_PARENT_RUN_ID``: ``xrun run --parent_run_id ID`` (or this variable in the
  submitter's environment, which wins, as in TorchX);
- ``TORCHX_TRACKERS``: the tracker names, the keys of the ``[torchx:tracker]`` section of
  ``.xrunconfig`` (or this variable in the submitter's environment, comma-separated);
- ``TORCHX_TRACKER_<NAME>_CONFIG``: each tracker's ``config`` from ``[tracker:<name>]`` (or
  that variable in the submitter's environment).

The dist components add ``TORCHX_TRACKING_EXPERIMENT_NAME`` (from ``--name EXP/RUN``).
"""

from __future__ import annotations

import os

from xrun.config import TRACKER_PREFIX, TRACKERS, Config

JOB_ID_ENV = "TORCHX_JOB_ID"
PARENT_RUN_ID_ENV = "TORCHX_PARENT_RUN_ID"
TRACKERS_ENV = "TORCHX_TRACKERS"


def tracker_config_env(name: str) -> str:
    return f"TORCHX_TRACKER_{name.upper()}_CONFIG"


def trackers(config: Config) -> dict[str, str | None]:
    """Tracker name -> its config (None: none given), from the environment or the config."""
    names = list(config.section(TRACKERS))
    if TRACKERS_ENV in os.environ:
        names = [n for n in os.environ[TRACKERS_ENV].split(",") if n]
    out: dict[str, str | None] = {}
    for name in names:
        entry = config.section(TRACKER_PREFIX + name).get("config")
        out[name] = os.environ.get(tracker_config_env(name), entry[0] if entry else None)
    return out


def job_env(handle: str, parent_run_id: str | None, config: Config) -> dict[str, str]:
    """The variables above for a job whose handle (with the ``${app_id}`` macro) is ``handle``."""
    env = {JOB_ID_ENV: handle}
    parent = os.environ.get(PARENT_RUN_ID_ENV, parent_run_id)
    if parent:
        env[PARENT_RUN_ID_ENV] = parent
    found = trackers(config)
    if found:
        env[TRACKERS_ENV] = ",".join(found)
    for name, cfg in found.items():
        if cfg:
            env[tracker_config_env(name)] = cfg
    return env
