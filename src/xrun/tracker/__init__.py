"""Experiment tracking with TorchX 0.7.0's API: ``from xrun.tracker import app_run_from_env``.

In a job xrun started::

    from xrun.tracker import app_run_from_env   # or: from torchx.tracker import ...

    run = app_run_from_env()                    # one run per job, across restarts
    run.add_metadata(lr=0.1, loss=0.25)
    run.add_artifact("model", "/ckpt/model.pt", {"epoch": 3})

Under xrun's TorchX stand-in, ``torchx.tracker`` and ``torchx.tracker.api`` are this package.
Backends: :mod:`xrun.tracker.resolve` (names, the embedded default), the ``fsspec`` backend
(:mod:`xrun.tracker.fsspec_backend`), ``mlflow`` (:mod:`xrun.tracker.mlflow_backend`). Importing
this package imports neither fsspec nor mlflow: a backend is built on the first
``app_run_from_env()``, and only the configured ones. See docs/tracking.md.
"""

from __future__ import annotations

# the API's names, listed once (in api.py's __all__)
from xrun.tracker.api import *  # noqa: F403
from xrun.tracker.api import __all__ as __all__
