"""The store wing: xrun's key-value store, a small TCP server and a blocking client.

The rendezvous (``xrun.runtime.rendezvous``) is built on it; the agent uses it through
``RendezvousHandler.kv()``. The same server, on the same port, is the workers' store: it speaks
torch's TCPStore protocol to ``torch.distributed.TCPStore(is_master=False)`` clients, on a key
space of their own. Standard library only: torch is never imported.

* ``protocol.py``: xrun's wire format (frames, ops, statuses, the request parser, encoders);
* ``data.py``: the key space, its parked waits and leases (no wire format in it);
* ``handler.py``: what xrun's requests do and answer, handshake included (no I/O);
* ``torch_protocol.py``: torch's TCPStore wire format (the request parser, the answers);
* ``torch_handler.py``: what torch's requests do and answer (no I/O);
* ``torch_data.py``: the workers' key space (one per workers' generation);
* ``session.py``: ``Session``, one connection server side, whichever protocol: it drives a
  handler (socket options, batching, the handshake deadline, dropping bad clients);
* ``server.py``: ``StoreServer``, the listening socket, its loop thread and where a
  connection's protocol is chosen (by the first bytes the client sends);
* ``loop.py``: the selectors event loop the server runs on (asyncio costs too much start-up);
* ``client.py``: ``Connection`` and ``StoreClient``;
* ``errors.py``: ``StoreError`` and its kinds.

Design for scale: every op touches one key or a short list of keys (per-node keys, atomic
counters), and blocking waits happen on the server (``WAIT`` parks the request until its keys
exist), so N clients cost O(N) messages, never a compare-and-set storm or client polling.
"""

from __future__ import annotations

from .client import Connection, StoreClient
from .errors import ProtocolError, StoreAuthError, StoreError, StoreTimeoutError
from .protocol import Op, Status
from .server import StoreServer

__all__ = [
    "Connection",
    "Op",
    "ProtocolError",
    "Status",
    "StoreAuthError",
    "StoreClient",
    "StoreError",
    "StoreServer",
    "StoreTimeoutError",
]
