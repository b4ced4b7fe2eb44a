"""``create_handler``: the one way in, whatever the backend. ``c10d`` and ``static`` run on an
xrun store (``handler.py``); ``etcd`` and ``etcd-v2`` (torchrun's two names for one thing here)
keep the rounds in an etcd the cluster runs (``etcd.py``)."""

from __future__ import annotations

from xrun.contract import ETCD_BACKENDS

from .api import RendezvousParams
from .handler import RendezvousHandler, check_params
from .handler import create_handler as create_store_handler

__all__ = ["create_handler"]


def create_handler(params: RendezvousParams) -> RendezvousHandler:
    """Validate ``params`` (UsageError on a user mistake) and build the backend's handler."""
    if params.backend in ETCD_BACKENDS:
        check_params(params)
        from .etcd import create_etcd_handler  # benchmark 1: etcd jobs only (http.client)

        return create_etcd_handler(params)
    return create_store_handler(params)
