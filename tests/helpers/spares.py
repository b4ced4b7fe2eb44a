"""What tests/scripts/spare_worker.py records: one JSON line per (re)start of a rank."""

from __future__ import annotations

import json
from pathlib import Path


def events(out: Path) -> list[dict[str, str]]:
    """The ranks' start records in ``out/events.jsonl`` (none yet: [])."""
    path = out / "events.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
