"""Comparing a function's signature with one recorded from TorchX (tests/fixtures/torchx/)."""

from __future__ import annotations

import inspect
from typing import Any


def signature_facts(fn: Any) -> list[dict[str, Any]]:
    """Each parameter's name, kind and default's repr, as the recording scripts write them."""
    return [
        {
            "name": p.name,
            "kind": p.kind.name,
            "default": None if p.default is inspect.Parameter.empty else repr(p.default),
        }
        for p in inspect.signature(fn).parameters.values()
    ]


def signature_diffs(theirs: list[dict[str, Any]], ours: list[dict[str, Any]]) -> dict[str, Any]:
    """``{"PARAM.kind"|"PARAM.default"|"PARAM.extra"|"order": (theirs, ours)}``: TorchX's
    parameters in TorchX's order with its kinds and defaults; an extra parameter of xrun's only
    keyword-only with a default (no TorchX call can bind to it by position) or ``**kwargs``."""
    diffs: dict[str, Any] = {}
    their_names = {t["name"] for t in theirs}
    extra = [p for p in ours if p["name"] not in their_names]
    for p in extra:
        if p["kind"] not in ("KEYWORD_ONLY", "VAR_KEYWORD") or (
            p["kind"] == "KEYWORD_ONLY" and p["default"] is None
        ):
            diffs[f"{p['name']}.extra"] = (None, p["kind"])
    shared = [p for p in ours if p not in extra]
    if [p["name"] for p in shared] != [t["name"] for t in theirs]:
        diffs["order"] = ([t["name"] for t in theirs], [p["name"] for p in shared])
        return diffs
    for t, o in zip(theirs, shared, strict=True):
        for key in ("kind", "default"):
            if t[key] != o[key]:
                diffs[f"{t['name']}.{key}"] = (t[key], o[key])
    return diffs
