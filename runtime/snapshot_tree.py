"""The snapshot's state tree: tensors pulled out of it (their bytes go to the slot, raw), and
the RNG states a step depends on. A worker-side part of ``snapshot.py`` (torch is imported
inside the functions only)."""

from __future__ import annotations

import random
import sys
from collections import OrderedDict
from typing import Any


class _T:
    """Placeholder for the i-th tensor in the pickled skeleton."""

    __slots__ = ("i",)

    def __init__(self, i: int) -> None:
        self.i = i

    def __reduce__(self) -> tuple[Any, ...]:
        return (_T, (self.i,))


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _flatten(obj: Any, tensors: list[Any]) -> Any:
    """The tree with each strided tensor replaced by ``_T(i)`` (its bytes go to the slot)."""
    torch = sys.modules["torch"]
    if isinstance(obj, torch.Tensor) and obj.layout == torch.strided and not obj.is_quantized:
        tensors.append(obj.detach())
        return _T(len(tensors) - 1)
    if type(obj) in (list, tuple):
        return type(obj)(_flatten(v, tensors) for v in obj)
    if type(obj) in (dict, OrderedDict):
        out = type(obj)((k, _flatten(v, tensors)) for k, v in obj.items())
        meta = getattr(obj, "_metadata", None)  # a module state_dict's versions
        if meta is not None:
            out._metadata = meta
        return out
    return obj  # anything else is pickled whole


def _unflatten(obj: Any, tensors: list[Any]) -> Any:
    if isinstance(obj, _T):
        return tensors[obj.i]
    if type(obj) in (list, tuple):
        return type(obj)(_unflatten(v, tensors) for v in obj)
    if type(obj) in (dict, OrderedDict):
        out = type(obj)((k, _unflatten(v, tensors)) for k, v in obj.items())
        meta = getattr(obj, "_metadata", None)
        if meta is not None:
            out._metadata = meta
        return out
    return obj


def _rng_state() -> dict[str, Any]:
    import torch

    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    np = sys.modules.get("numpy")
    if np is not None:
        state["numpy"] = np.random.get_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    import torch

    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])
