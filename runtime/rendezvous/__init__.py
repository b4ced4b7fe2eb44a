"""Rendezvous: how the agents of one job find each other and agree on a world, round after round.

``create_handler(params)`` returns a ``RendezvousHandler`` (the interface, ``api.py``; each
backend's class implements it); the agent calls ``next_rendezvous()``
to join a round, ``select()``s on ``fileno()`` while its workers run, and asks ``poll_event()``
what happened when that fd becomes readable. Standard library only.

The wing, module by module:

* ``api.py``: the errors, ``RendezvousParams``, ``RendezvousInfo``, ``RendezvousEvent``, and
  ``RendezvousHandler``, the interface the agent uses, whatever the backend;
* ``conf.py``: ``--rdzv-conf`` (``RdzvConfig``, its one parser) and the job's secret;
* ``endpoint.py``: the one endpoint parser/formatter, the addresses bound and advertised;
* ``handler.py``: ``StoreRendezvousHandler``, c10d's and static's (watching a round, leaving it);
* ``rounds.py``: joining a round (arrive, wait, seal);
* ``leases.py``: a member's lease and the heartbeat thread;
* ``spares.py``: ``--spares``: parking a spare, and the slot rule that keeps node ranks;
* ``hosting.py``: serving the store or reaching it, and the connections to it;
* ``keys.py``: the keys and what they hold (a node's seat, the member list, the verdict);
* ``kv.py``: ``KeyValue``, the agent's own keys;
* ``backends.py``: ``create_handler`` and ``BACKENDS``, each backend's lazy creator;
* ``etcd.py``, ``etcd_kv.py``: the etcd rendezvous (``etcd``, ``etcd-v2``) and its etcd calls.

Backends
--------
``c10d`` (the name torchrun users know; the protocol is xrun's own, on ``xrun.runtime.store``):
the agent whose endpoint host is a local address binds the endpoint and serves the store (if the
port is taken, another agent on this host won, and this one connects as a client); the rest
connect with retry and backoff. ``static``: node rank 0 serves the store at the endpoint
(``master_addr:master_port``), ranks come from ``node_rank`` and the world is exactly
``max_nodes`` nodes. ``etcd`` / ``etcd-v2``: the same rounds kept in an etcd the cluster runs
(``--rdzv-endpoint`` is etcd's; see ``etcd.py``); each agent serves its workers' store.

The same store, on the same port, is the workers' store (torch's TCPStore protocol, a key space
of its own: see ``store/server.py``): ``StoreRendezvousHandler.workers_address`` is the
``MASTER_ADDR``/``MASTER_PORT`` the agent gives its workers.

Protocol (keys under ``<run_id>/rdzv/``; round ``r`` counts up from 0)
-------------------------------------------------------------------
* join: ``i = ADD r/join 1`` gives the node its arrival index (1-based); then, without waiting
  for answers, ``SET r/node/i = "<nproc>\\t<sortkey>\\t<slot>\\t<addr>"`` (``slot``: the group
  rank the node held in its previous round with ``--spares``, else -1) and leases owned by the
  node's connection: ``r/lease/i`` (renewed by heartbeats; on expiry or disconnect it sets
  ``r/stale``), ``r/finlease/i`` (on disconnect it sets ``r/fin/i``: "gone") and
  ``r/leftlease/i`` (like the first, it sets ``r/left/i``).
* seal: the round is sealed by whoever first adds ``SEAL`` (2**40) to ``r/join``: the node that
  arrives as number ``max_nodes``, or (once ``min_nodes`` are in) the latest arrival, whose
  last-call timer expired with no newer one (the earlier ones just wait for their seat), or any node that sees ``r/stale`` before the round formed (a
  joiner died: form now, stale, and re-form without it). The winner reads ``r/node/1..n`` and
  writes, in one message: ``workers`` = r (the workers' store starts a new, empty generation),
  ``r/members`` (the member list), one ``r/seat/i`` per counted arrival (its group rank, the
  global rank of its first worker, the sizes: a few bytes; rank -1 for one left out),
  ``r/world`` (the sizes: the round formed) and ``cur = r + 1``. A later ``ADD r/join 1``
  returns >= ``SEAL`` (or > ``max_nodes``), so latecomers move on to round ``r + 1``.
* one world at a time: round ``r + 1`` may seal only once ``r/stale`` is set *and* every member
  of round ``r`` is out of it (``r/left/i``: set by the member right after it arrived in a later
  round, or on finish/close/shutdown, or by a third lease, ``r/leftlease/i``, when its connection
  closes or its heartbeats lapse), as torch's c10d opens a round once the last participant left
  the previous one. So a world forms only after the previous world's workers stopped, and the
  members re-forming are already counted in it. One node keeps this gate: the first arrival in
  ``r + 1`` reads ``r/members``, waits for their ``left`` keys and sets ``r/out``; the others
  wait for ``r/out`` alone (each waiting for N keys cost the store O(N^2) per re-formation;
  if the keeper is lost first, ``r + 1`` goes stale and each node keeps the gate itself). A node arriving while a world with room runs
  sets ``r/stale`` ("waiting to join") so that world re-forms with it; next to a full world it
  stands by (until join_timeout) instead of forming a second world. Not once a member of
  ``r`` finished: the newcomer adds 1 to ``r/fate``, a finishing node ``FINISHED``, and a
  newcomer that reads a count >= ``FINISHED`` waits in ``r + 1`` for the job's verdict.
* everyone waits *on the server* for its own ``r/seat/i`` (or ``closed``, ``r/stale``, or the
  next arrival while the last call runs): O(1) messages and O(1) bytes per node, so N nodes
  cost the store O(N), not N copies of an N-node list. The member list is read only on demand
  (``RendezvousInfo.addrs``, and the store's host at the exit barrier).
* one connection per node: its calls, its leases' heartbeats (sent at once, whatever call is
  waiting) and its round watch, a pending ``WAIT any(r/stale, closed)`` queued with its wait
  for the seat. ``fileno()`` becomes readable exactly when the round is stale or the job
  closed.
* leave together: ``finish``/``shutdown`` set ``r/fin/i``; the store's host waits for every
  member's ``fin`` (set by itself, or by its closed connection) before it stops serving, and
  after a successful finish sets ``closed`` = not failed, "the job finished". That wait is
  torchrun's exit barrier, bounded by conf ``exit_barrier_timeout`` (300 s), not by
  ``close_timeout`` (how long a host that *gave up* keeps serving so peers read why).
* ``closed`` holds ``{"failed": bool, "reason": str}``: ``poll_event`` reports CLOSED and
  ``closed_failed`` says which, so an agent tells "a peer gave up" (exit 1) from "the job
  finished" (exit 0).

The job's secret: when ``$XRUN_RDZV_TOKEN``, a file named by ``$XRUN_RDZV_TOKEN_FILE`` or conf
``token_file`` gives one (multi-node jobs: the scheduler generates it per job and exports it),
the store admits only clients that prove they hold it (HMAC challenge-response, see
``store/protocol.py``); it never appears on a command line, and workers never see it. A standalone agent
(endpoint port 0: nobody else can find its store) makes up a random secret when none is given,
so no store an agent serves is ever open to other local users.

One store, one job
------------------
The store lives inside one agent of one job and stops when that job is over (after the exit
barrier), so it cannot serve a second job that happens to use the same endpoint: that job
would lose its rendezvous mid-run. Keys are namespaced by run id all the same, but an agent
whose run id differs from the hosting job's (``xrun/host_run_id``, set before the store takes
its first connection) is refused at once with a ``UsageError`` telling it to use its own port.
Two jobs on one host therefore need two endpoints - port 0 / ``--standalone`` on a single node
picks a free one. (With per-job secrets the second job would be refused anyway: wrong token.)

Rank rule (deterministic): members are sorted by (advertised address, process id, creation order
of the handler in that process); ``static`` uses ``node_rank``. So the same hosts get the same
ranks in every round they are all part of, whatever the order in which they arrived. With
``--spares`` a node keeps its group rank from round to round and a spare takes a lost node's
(``spares.py``).
"""

from __future__ import annotations

from .api import (
    RendezvousClosedError,
    RendezvousError,
    RendezvousEvent,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParams,
    RendezvousTimeoutError,
)
from .backends import create_handler
from .conf import CONF_KEYS, RdzvConfig, config_from_conf, load_token, parse_rdzv_conf
from .endpoint import Endpoint
from .kv import KeyValue

__all__ = [
    "CONF_KEYS",
    "Endpoint",
    "KeyValue",
    "RdzvConfig",
    "RendezvousClosedError",
    "RendezvousError",
    "RendezvousEvent",
    "RendezvousHandler",
    "RendezvousInfo",
    "RendezvousParams",
    "RendezvousTimeoutError",
    "config_from_conf",
    "create_handler",
    "load_token",
    "parse_rdzv_conf",
]
