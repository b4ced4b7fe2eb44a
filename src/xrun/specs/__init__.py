"""The specs layer's package; its face keeps ``from xrun.specs import AppDef`` working while
the one module it was (now ``api.py``) is split by job."""

from xrun.specs.api import *  # noqa: F403
