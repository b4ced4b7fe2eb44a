"""The etcd rendezvous's way out of a round (see ``etcd``): a restart request, the job's verdict,
and the exit barrier that group rank 0 holds. A part of ``EtcdRendezvousHandler``, kept apart
for size; the attributes below are the handler's."""

from __future__ import annotations

import json
import time
from typing import Any

from .api import RendezvousError, RendezvousParams
from .conf import RdzvConfig
from .endpoint import Endpoint
from .etcd_budget import EtcdLedger
from .etcd_kv import EtcdClient, EtcdError
from .etcd_state import Member, fresh, running
from .keys import verdict

# etcd refuses leases shorter than its own minimum (1.5 x its election timeout: 2 s by default).
MIN_TTL = 2


class EtcdLeaving:
    params: RendezvousParams
    cfg: RdzvConfig
    addr: str
    _etcd: EtcdClient
    _etcd_endpoint: Endpoint
    _id: str
    _prefix: str
    _round: int
    _place: tuple[int, list[Member]] | None
    _closed: bool
    _finished: bool

    def _read(self) -> tuple[int, dict[str, Any] | None, int, set[str]]:
        raise NotImplementedError  # the handler's

    def _write(self, state: dict[str, Any], srev: int, lease: int = 0) -> bool:
        raise NotImplementedError  # the handler's

    def _errors(self, e: EtcdError) -> RendezvousError:
        raise NotImplementedError  # the handler's

    def _update(self, change: Any, with_alive: bool = False) -> dict[str, Any] | None:
        """Compare-and-set the state with ``change(state) -> new state | None`` (None: leave it)
        until it sticks; the state written (or None). ``with_alive``: ``change`` also gets the
        ids of the live agents."""
        while True:
            _, s, srev, alive = self._read()
            if s is None:
                return None
            new = change(s, alive) if with_alive else change(s)
            if new is None:
                return None
            lease = 0
            if new.get("closed") is not None:
                # The verdict lives close_timeout seconds, then the run id is free again.
                ttl = max(MIN_TTL, int(-(-self.cfg.close_timeout // 1)))
                lease = self._etcd.grant(ttl)
            if self._write(new, srev, lease):
                return new

    def ledger(self) -> EtcdLedger | None:
        """The job-wide restart budget and lone-failure quarantine (etcd_budget.py) of a
        multi-node job (``node_id`` set); None: the agent counts its own restarts. Stateless:
        it reads and writes the state."""
        p = self.params
        if not p.node_id or p.max_nodes <= 1:
            return None

        def place() -> tuple[int, list[str]]:
            seat = self._place  # set with _round, by the thread that asks (the agent's)
            return self._round, [m[3] for m in seat[1]] if seat else []

        doc = _Doc(self)
        return EtcdLedger(doc, place, self._id, p.node_id, p.min_nodes, self.cfg.join_timeout)

    def request_restart(self, reason: str) -> None:
        rnd = self._round
        if rnd < 0:
            return
        why = f"node {self.addr}: {reason}"

        def bump(s: dict[str, Any], alive: set[str]) -> dict[str, Any] | None:
            if s["round"] != rnd or s["closed"] is not None:
                return None  # moved on already
            return fresh(rnd + 1, why, None, running(s, alive), s, self.params.spares)

        try:
            self._update(bump, with_alive=True)
        except EtcdError as e:
            raise self._errors(e) from None

    def _mark_left(self) -> None:
        """This agent leaves the job on purpose (``--spares``): its id in the state's ``left``,
        so that its lease's end is not taken for a lost node (etcd_spares.py, "Quarantine")."""

        def add(s: dict[str, Any]) -> dict[str, Any] | None:
            left = list(s.get("left") or [])
            return None if self._id in left else {**s, "left": [*left, self._id]}

        try:
            self._update(add)
        except EtcdError:
            pass  # etcd away: the peers will see a lost node, as they would without the mark

    def close(self, failed: bool, reason: str) -> None:
        self._closed = True
        closed = json.loads(verdict(failed, f"node {self.addr}: {reason}"))
        try:
            self._update(lambda s: None if s["closed"] is not None else {**s, "closed": closed})
        except EtcdError as e:
            raise self._errors(e) from None

    def finish(self, timeout: float | None = None) -> list[str]:
        """As c10d's: we finished; group rank 0 (whose store the workers use) waits for the
        others (exit barrier), then closes the job (failed, naming laggards, if any)."""
        self._finished = True
        rnd, seat = self._round, self._place
        if rnd < 0 or seat is None:
            return []
        timeout = self.cfg.exit_barrier_timeout if timeout is None else timeout

        def fin(s: dict[str, Any]) -> dict[str, Any] | None:
            if s["round"] != rnd or self._id in s["fin"]:
                return None
            return {**s, "fin": [*s["fin"], self._id]}

        try:
            self._update(fin)
            if seat[0] != 0:
                return []
            return self._exit_barrier(rnd, seat[1], timeout)
        except EtcdError as e:
            # Not a peer's failure: our workers succeeded, and no peer's verdict can be read
            # now. The agent warns and exits 0 (a peer that failed fails its own node).
            raise RendezvousError(
                f"etcd at {self._etcd_endpoint} became unreachable at the exit barrier ({e}); this "
                f"node's workers succeeded"
            ) from None

    def _exit_barrier(self, rnd: int, members: list[Member], timeout: float) -> list[str]:
        deadline = time.monotonic() + timeout
        while True:
            rev, s, _, alive = self._read()
            if s is None or s["closed"] is not None:
                return []
            done = set(s["fin"]) if s["round"] == rnd else set()
            unfinished = [m[0] for m in members if m[3] not in done]
            # A member whose lease is gone left without finishing: no use waiting for it.
            pending = [m for m in members if m[3] not in done and m[3] in alive]
            left = deadline - time.monotonic()
            if not pending or s["round"] != rnd or left <= 0:
                break
            self._etcd.wait_change(self._prefix, rev, left)
        if unfinished:
            closed = json.loads(
                verdict(
                    True,
                    f"node {self.addr} finished, but {', '.join(unfinished)} did not finish "
                    f"within exit_barrier_timeout={timeout:g}s (or left without finishing); if "
                    f"nodes legitimately finish further apart, raise --rdzv-conf "
                    f"exit_barrier_timeout",
                )
            )
        else:
            closed = json.loads(verdict(False, "the job finished"))
        self._update(lambda s: None if s["closed"] is not None else {**s, "closed": closed})
        return unfinished


class _Doc:
    """The handler's state document as the ledger reads and writes it (etcd_budget.StateDoc)."""

    def __init__(self, h: EtcdLeaving) -> None:
        self._h = h

    def look(self) -> tuple[int, dict[str, Any] | None, set[str]]:
        rev, s, _, alive = self._h._read()
        return rev, s, alive

    def update(self, change: Any) -> dict[str, Any] | None:
        return self._h._update(change)

    def wait(self, rev: int, timeout: float) -> None:
        self._h._etcd.wait_change(self._h._prefix, rev, max(0.0, timeout))
