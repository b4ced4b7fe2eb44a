"""Fixtures of the rendezvous tests: no secret from the environment, and a handler factory."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.runtime.rendezvous.helpers import FAST, Factory
from xrun.runtime.rendezvous import Endpoint, RendezvousHandler, RendezvousParams, create_handler


@pytest.fixture(autouse=True)
def _no_token_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XRUN_RDZV_TOKEN", raising=False)
    monkeypatch.delenv("XRUN_RDZV_TOKEN_FILE", raising=False)


@pytest.fixture
def make() -> Iterator[Factory]:
    """Create handlers (shut down at teardown, hosts last so peers can leave first)."""
    made: list[RendezvousHandler] = []

    def factory(
        endpoint: Endpoint | str = Endpoint("localhost", 0),
        *,
        run_id: str = "job",
        nodes: str = "1:1",
        nproc: int = 1,
        addr: str | None = None,
        backend: str = "c10d",
        node_rank: int = -1,
        **conf: str,
    ) -> RendezvousHandler:
        lo, hi = (int(x) for x in nodes.split(":"))
        if isinstance(endpoint, str):  # a test's own text: parsed here, as the agent's edge does
            endpoint = Endpoint.parse(endpoint)
        h = create_handler(
            RendezvousParams(
                backend,
                endpoint,
                run_id,
                lo,
                hi,
                nproc,
                {**FAST, **conf},
                node_rank=node_rank,
                local_addr=addr,
            )
        )
        made.append(h)
        return h

    yield factory
    for h in sorted(made, key=lambda h: h.is_host):
        h.shutdown()
