"""TorchX 0.7.0's ``torchx.tracker.api``: xrun's (:mod:`xrun.tracker.api`)."""

from xrun.tracker.api import *  # noqa: F403
from xrun.tracker.api import __all__ as __all__
