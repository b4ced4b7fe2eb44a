"""A lost node's state, handed over by its peers (``Snapshotter(replicated=True)``).

A worker-side helper of ``snapshot.py`` (torch is imported inside the functions only; the agent
never imports this module).

When a whole node is lost and a spare takes its slot (docs/runtime.md, "Warm spares"), the
replacement's workers find no snapshot in their node's memory, while every surviving rank holds
the step it last committed. Two things make the replacement resume from that step, bit for bit:

* **the replicated part** (the model's and the optimizer's state): under DDP it is the same on
  every rank, so a rank that lacks it receives the raw bytes of a holder's slot (the holders
  take turns: lacker ``i`` gets them from holder ``i mod holders``), point to point;
* **the per-rank part** (the RNG states and ``extra``, e.g. a data position): it is different
  on every rank and died with the node, so each rank keeps a copy of it on a *buddy*, the rank
  ``LOCAL_WORLD_SIZE`` further on (``(rank + L) mod world``: on the next node when nodes have
  equal sizes). At every commit each rank sends its pickled per-rank part to its buddy (one
  64 KiB point-to-point message each way; a bigger part adds a second), which writes it to a *ward* file
  in its own rank dir (two files in turn, each written whole then renamed, with a CRC: never
  half of one).

``restore`` gathers, besides each rank's valid steps, the steps of the ward copies every rank
holds; when no step is common to every rank it picks the newest step ``S`` that some ranks
hold and for which every other rank's per-rank part is on some peer (``plan``). Not covered:
states that are not replicated (FSDP, ZeRO: a shard is only on its own rank; those fall back
to the disk checkpoint as before), two nodes lost at once when one was the other's buddy, and
nodes of unequal size where ``rank + L`` stays on the same node.
"""

from __future__ import annotations

import os
import pickle
import sys
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WARD_MAGIC = b"XRWARD01"
CAPACITY = 1 << 16  # bytes of the one message a commit sends to the buddy (RNG states: ~12 KB)
_TAG_STATE, _TAG_PART = 7301, 7302  # point-to-point tags: a sender may send both to one rank

# (lineage, step) -> bytes of the pickled per-rank part, per ward rank
Wards = dict[int, dict[tuple[bytes, int], int]]


@dataclass(frozen=True)
class Plan:
    """Step ``step`` for every rank: ``state_from[r]`` sends rank r the replicated part (a
    holder), ``part_from[r]`` its own per-rank part (a buddy); both only for the lacking ranks."""

    step: int
    state_from: dict[int, int]
    part_from: dict[int, int]


def buddy_of(rank: int, world: int, local: int) -> int:
    return (rank + local) % world


def ward_of(rank: int, world: int, local: int) -> int:
    return (rank - local) % world


def group() -> Any:
    """``torch.distributed`` when a group of more than one node is initialised, else None."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist if dist.get_world_size() > 1 else None


def _device(dist: Any) -> Any:
    """Where point-to-point buffers live: the current GPU under NCCL, else the CPU."""
    import torch

    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _u8(data: bytes | bytearray | memoryview, device: Any) -> Any:
    import torch

    t = torch.frombuffer(bytearray(data), dtype=torch.uint8) if len(data) else torch.empty(0)
    return t.to(torch.uint8).to(device)


def exchange(part: bytes, rank: int, world: int, local: int) -> bytes:
    """Send ``part`` to this rank's buddy, receive the ward's (every rank calls it at the same
    commit: a collective of the whole group). One point-to-point round of ``CAPACITY`` bytes
    (an 8-byte length, then the part); a part that does not fit sends the rest in a second."""
    import torch

    dist = group()
    assert dist is not None
    dev = _device(dist)
    buddy, ward = buddy_of(rank, world, local), ward_of(rank, world, local)
    head = len(part).to_bytes(8, "little") + part[: CAPACITY - 8]
    out = _u8(head + bytes(CAPACITY - len(head)), dev)
    got = torch.empty(CAPACITY, dtype=torch.uint8, device=dev)
    _run(dist, [("send", out, buddy, _TAG_PART), ("recv", got, ward, _TAG_PART)])
    raw = bytes(got.cpu().numpy().tobytes())
    n = int.from_bytes(raw[:8], "little")
    ops: list[tuple[str, Any, int, int]] = []
    if len(part) > CAPACITY - 8:
        ops.append(("send", _u8(part[CAPACITY - 8 :], dev), buddy, _TAG_PART))
    rest = torch.empty(max(0, n - (CAPACITY - 8)), dtype=torch.uint8, device=dev)
    if n > CAPACITY - 8:
        ops.append(("recv", rest, ward, _TAG_PART))
    _run(dist, ops)
    return raw[8 : 8 + min(n, CAPACITY - 8)] + bytes(rest.cpu().numpy().tobytes())


def _run(dist: Any, ops: list[tuple[str, Any, int, int]]) -> None:
    """The point-to-point ``ops`` at once (no order between them to deadlock on)."""
    if not ops:
        return
    p2p = [
        dist.P2POp(dist.isend if kind == "send" else dist.irecv, t, peer, tag=tag)
        for kind, t, peer, tag in ops
    ]
    for work in dist.batch_isend_irecv(p2p):
        work.wait()


# ---------------------------------------------------------------------------- ward files
def write_ward(
    rank_dir: Path, turn: int, ward: int, lineage: bytes, birth: int, step: int, world: int,
    part: bytes,
) -> None:  # fmt: skip
    """The ward's per-rank part after ``step``, whole or not at all (write, then rename)."""
    body = pickle.dumps((lineage, birth, step, world, ward, part), protocol=5)
    final = rank_dir / f"ward-{turn}"
    tmp = rank_dir / f".ward-{turn}.tmp"
    with open(tmp, "wb") as f:
        f.write(WARD_MAGIC + zlib.crc32(body).to_bytes(4, "little") + body)
    os.replace(tmp, final)


def read_wards(rank_dir: Path, world: int) -> dict[int, dict[tuple[bytes, int], Path]]:
    """ward rank -> (lineage, step) -> the valid ward file holding its part."""
    out: dict[int, dict[tuple[bytes, int], Path]] = {}
    for path in rank_dir.glob("ward-*"):
        got = _read(path)
        if got is not None and got[3] == world:
            lineage, _, step, _, ward, _ = got
            out.setdefault(ward, {})[(lineage, step)] = path
    return out


def next_turn(steps: Mapping[tuple[bytes, int], Path] | None) -> int:
    """The ward file the next copy goes to: never the one holding the newest step."""
    if not steps:
        return 0
    newest = max(steps, key=lambda k: k[1])
    return 1 - int(steps[newest].name.rsplit("-", 1)[1])


def ward_part(path: Path) -> bytes:
    got = _read(path)
    if got is None:
        raise RuntimeError(f"{path} changed while restoring")
    part: bytes = got[5]
    return part


def _read(path: Path) -> tuple[bytes, int, int, int, int, bytes] | None:
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    head = len(WARD_MAGIC) + 4
    if raw[: len(WARD_MAGIC)] != WARD_MAGIC or len(raw) < head:
        return None
    if zlib.crc32(raw[head:]) != int.from_bytes(raw[len(WARD_MAGIC) : head], "little"):
        return None
    try:
        got: tuple[bytes, int, int, int, int, bytes] = pickle.loads(raw[head:])
    except Exception:  # noqa: BLE001 - a file that passed its CRC but is not ours: skip it
        return None
    return got


def report(wards: Mapping[int, Mapping[tuple[bytes, int], Path]]) -> Wards:
    """What ``restore`` gathers of this rank's ward files: their sizes, not their bytes."""
    out: Wards = {}
    for ward, steps in wards.items():
        for key, path in steps.items():
            try:
                out.setdefault(ward, {})[key] = len(ward_part(path))
            except RuntimeError:
                continue
    return out


# ---------------------------------------------------------------------------- restore
def plan(holds: list[set[tuple[bytes, int]]], wards: list[Wards], lineage: bytes) -> Plan | None:
    """The newest step of ``lineage`` that some ranks hold (``holds[r]``: rank r's valid
    steps) and whose per-rank part every other rank can get from a peer's ward copy."""
    world = len(holds)
    steps = sorted({s for h in holds for (lin, s) in h if lin == lineage}, reverse=True)
    for step in steps:
        key = (lineage, step)
        holders = [r for r in range(world) if key in holds[r]]
        lacking = [r for r in range(world) if key not in holds[r]]
        part_from = {}
        for r in lacking:
            peer = next((b for b in range(world) if key in wards[b].get(r, {})), None)
            if peer is None:
                break
            part_from[r] = peer
        else:
            state_from = {r: holders[i % len(holders)] for i, r in enumerate(lacking)}
            return Plan(step, state_from, part_from)
    return None


def hand_over(
    p: Plan, rank: int, lineage: bytes, slot_bytes: Any, my_wards: Mapping[int, Mapping[Any, Path]],
    sizes: Mapping[int, tuple[int, int]],
) -> tuple[Any, bytes] | None:  # fmt: skip
    """Move the bytes ``p`` says: every rank calls it. ``slot_bytes()`` reads this rank's slot
    of the step (holders); ``sizes[r]``: (slot bytes, part bytes) rank r is to receive. Returns
    (the slot's bytes as a uint8 tensor, this rank's per-rank part) for a lacking rank, None
    for a holder."""
    import torch

    dist = group()
    assert dist is not None
    dev = _device(dist)
    key = (lineage, p.step)
    ops: list[tuple[str, Any, int, int]] = []
    mine = None
    for r, src in p.state_from.items():
        if src == rank:
            ops.append(("send", _u8(slot_bytes(), dev), r, _TAG_STATE))
    for r, src in p.part_from.items():
        if src == rank:
            ops.append(("send", _u8(ward_part(my_wards[r][key]), dev), r, _TAG_PART))
    if rank in p.state_from:
        n_state, n_part = sizes[rank]
        state = torch.empty(n_state, dtype=torch.uint8, device=dev)
        part = torch.empty(n_part, dtype=torch.uint8, device=dev)
        ops.append(("recv", state, p.state_from[rank], _TAG_STATE))
        ops.append(("recv", part, p.part_from[rank], _TAG_PART))
        mine = (state, part)
    _run(dist, ops)
    if mine is None:
        return None
    return mine[0].cpu(), bytes(mine[1].cpu().numpy().tobytes())


__all__ = ["Plan", "buddy_of", "exchange", "hand_over", "plan", "read_wards", "write_ward"]
