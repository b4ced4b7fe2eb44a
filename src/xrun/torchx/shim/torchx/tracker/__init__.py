"""TorchX 0.7.0's ``torchx.tracker``: xrun's tracker (:mod:`xrun.tracker`)."""

from xrun.tracker import AppRun, app_run_from_env

__all__ = ["AppRun", "app_run_from_env"]
