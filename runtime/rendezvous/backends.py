"""``create_handler``: the one way in, whatever the backend. ``BACKENDS`` maps each backend's
name to the creator of its ``RendezvousHandler``: ``c10d`` and ``static`` run on an xrun store
(``handler.py``); ``etcd`` and ``etcd-v2`` (torchrun's two names for one thing here) keep the
rounds in an etcd the cluster runs (``etcd.py``). Each creator imports its backend on first use,
as torch's ``rendezvous/registry.py`` does: an agent loads only the backend it runs (benchmark 1:
the etcd client's ``http.client``/``ssl`` only for etcd jobs)."""

from __future__ import annotations

from collections.abc import Callable

from xrun.contract import RDZV_BACKENDS
from xrun.errors import UsageError

from .api import RendezvousHandler, RendezvousParams

__all__ = ["BACKENDS", "check_params", "create_handler"]


def _store(params: RendezvousParams) -> RendezvousHandler:
    from .handler import create_store_handler

    return create_store_handler(params)


def _etcd(params: RendezvousParams) -> RendezvousHandler:
    from .etcd import create_etcd_handler

    return create_etcd_handler(params)


BACKENDS: dict[str, Callable[[RendezvousParams], RendezvousHandler]] = {
    "c10d": _store,
    "static": _store,
    "etcd": _etcd,
    "etcd-v2": _etcd,
}


def create_handler(params: RendezvousParams) -> RendezvousHandler:
    """Validate ``params`` (UsageError on a user mistake) and build the backend's handler."""
    check_params(params)
    return BACKENDS[params.backend](params)


def check_params(p: RendezvousParams) -> None:
    """What every backend needs of ``p`` (UsageError naming the fault)."""
    if p.backend not in RDZV_BACKENDS:
        raise UsageError(
            f"rendezvous backend {p.backend!r} is not supported; use one of {', '.join(RDZV_BACKENDS)}"
        )
    if not p.run_id or "/" in p.run_id:
        raise UsageError(f"rendezvous run id {p.run_id!r} must be non-empty and without '/'")
    if not 1 <= p.min_nodes <= p.max_nodes:
        raise UsageError(
            f"--nnodes {p.min_nodes}:{p.max_nodes} is invalid; expected 1 <= MIN <= MAX, e.g. 2:4"
        )
    if p.local_world_size < 1:
        raise UsageError(f"nproc per node {p.local_world_size} must be >= 1")
    if p.backend == "static":
        if p.min_nodes != p.max_nodes:
            raise UsageError(
                f"the static rendezvous needs a fixed --nnodes, got {p.min_nodes}:{p.max_nodes}; "
                f"use --rdzv-backend c10d for an elastic range"
            )
        if not 0 <= p.node_rank < p.max_nodes:
            raise UsageError(
                f"--node-rank {p.node_rank} is out of range for --nnodes {p.max_nodes}; "
                f"expected 0..{p.max_nodes - 1}"
            )
