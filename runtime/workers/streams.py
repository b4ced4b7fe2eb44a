"""``Std``: which of a worker's streams a redirect or tee applies to, and torchrun's spelling of it.

Its own module because everyone needs it and it needs nothing: the command line (``args.py``)
parses ``-r``/``-t`` with it, ``start_processes`` takes it and the launcher reads it per stream.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from xrun.errors import UsageError

__all__ = ["Std", "to_map"]


class Std(enum.IntFlag):
    """Which of a worker's streams a redirect or tee applies to."""

    NONE = 0
    OUT = 1
    ERR = 2
    ALL = 3

    @classmethod
    def parse(cls, s: str, nprocs: int | None = None) -> Std | dict[int, Std]:
        """``"3"`` -> ``Std.ALL``; ``"0:3,1:1"`` -> ``{0: Std.ALL, 1: Std.OUT}``.

        With ``nprocs``, a map's ranks must be below it and the missing ones get ``Std.NONE``.
        """
        text = s.strip()
        if ":" not in text:
            return cls._value(text, s)
        out: dict[int, Std] = {}
        for item in text.split(","):
            rank_s, sep, value = item.partition(":")
            try:
                rank = int(rank_s)
            except ValueError:
                rank = -1
            if not sep or rank < 0:
                raise UsageError(
                    f"bad local rank {rank_s.strip()!r} in {s!r}: expected "
                    f"'<local_rank>:<0-3>' items separated by commas, like '0:3,1:1'"
                )
            if rank in out:
                raise UsageError(f"local rank {rank} appears twice in {s!r}: give each rank once")
            if nprocs is not None and rank >= nprocs:
                raise UsageError(
                    f"local rank {rank} in {s!r} does not exist: there are {nprocs} local "
                    f"workers (ranks 0..{nprocs - 1})"
                )
            out[rank] = cls._value(value, s)
        if nprocs is not None:
            for rank in range(nprocs):
                out.setdefault(rank, cls.NONE)
        return out

    @classmethod
    def from_str(cls, s: str) -> Std | dict[int, Std]:
        """torch's name for ``parse`` (``Std.from_str("0:1,1:2")``); a bad value raises a
        ``UsageError``, which is a ``ValueError`` as torch's is."""
        return cls.parse(s)

    @classmethod
    def _value(cls, v: str, whole: str) -> Std:
        v = v.strip()
        if v.isdigit() and int(v) <= 3:
            return cls(int(v))
        raise UsageError(
            f"bad redirect/tee value {v!r} in {whole!r}: expected 0 (none), 1 (stdout), "
            f"2 (stderr) or 3 (both), or a per-local-rank map like '0:3,1:1'"
        )


def to_map(val_or_map: Std | Mapping[int, Std], local_world_size: int) -> dict[int, Std]:
    """One ``Std`` per local rank: a single value for all, or a map whose missing ranks get
    ``Std.NONE`` (torch's ``to_map``)."""
    if isinstance(val_or_map, Mapping):
        return {r: Std(val_or_map.get(r, Std.NONE)) for r in range(local_world_size)}
    return dict.fromkeys(range(local_world_size), Std(val_or_map))
