"""Concurrent readers of one docker app, against the real Docker Engine.

``test_integration.py::test_concurrent_describes_finalize_once`` hits the window only now and
then (about 1 run in 6 on a fresh machine): a reader lists the app's containers (the SDK lists
ids, then inspects them one by one) while another reader, or the app's watcher, finalises the
app and removes them; the inspect then gets "No such container". Here that interleaving is
forced: the reader is held between the listing and the inspect until the other reader has
finalised, so the engine's own NotFound reaches ``describe`` every time.

The app's detached watcher is a finaliser too, and it raced these tests: it could remove the
containers before ``_wait_exited`` saw them exited (a fresh-clone CI run waited 30 s for
containers that were already gone). Here it is not started (``no_watcher``): the test's own
``describe`` is the one finaliser, so the forced interleaving happens in every run. The watcher
itself is covered by ``test_integration.py``.
"""

# ruff: noqa: F811  (the docker_engine fixture is imported, then named by the tests)
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.helpers.docker import docker_engine  # noqa: F401
from tests.schedulers.docker.test_integration import _leftovers, _plain
from xrun.schedulers.docker import DockerScheduler
from xrun.specs import AppState


def _wait_exited(app_id: str) -> None:
    import docker

    client = docker.from_env()
    label = {"label": f"xrun.app_id={app_id}"}
    deadline = time.monotonic() + 30
    try:
        while {c.status for c in client.containers.list(all=True, filters=label)} != {"exited"}:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        client.close()


def _hold_first_inspect(
    monkeypatch: pytest.MonkeyPatch, reader: threading.Thread
) -> tuple[threading.Event, threading.Event]:
    """In ``reader`` only, the first container inspect of a listing waits for ``go`` (after
    setting ``listed``); every other thread inspects as usual."""
    from docker.models.containers import ContainerCollection

    listed, go = threading.Event(), threading.Event()
    real_get: Callable[..., Any] = ContainerCollection.get

    def get(self: ContainerCollection, container_id: str) -> Any:
        if threading.current_thread() is reader and not listed.is_set():
            listed.set()
            assert go.wait(60), "the finaliser did not finish"
        return real_get(self, container_id)

    monkeypatch.setattr(ContainerCollection, "get", get)
    return listed, go


@pytest.mark.parametrize("op", ["describe", "cancel"])
def test_a_reader_whose_containers_vanish_mid_listing_gets_the_final_state(
    docker_engine: str, no_watcher: None, monkeypatch: pytest.MonkeyPatch, op: str
) -> None:
    first, second = DockerScheduler("default"), DockerScheduler("default")
    app_id = first.submit(_plain("race", docker_engine, "echo a", "echo b"), {}, "")
    _wait_exited(app_id)
    out: list[object] = []

    def read() -> None:
        try:
            if op == "cancel":
                second.cancel(app_id)  # an ended app: cancel is a no-op, not an error
            out.append(second.describe(app_id).state)  # type: ignore[union-attr]
        except BaseException as e:
            out.append(e)

    reader = threading.Thread(target=read)
    listed, go = _hold_first_inspect(monkeypatch, reader)
    reader.start()
    try:
        # The reader has the ids of the app's containers in hand; now someone finalises it.
        assert listed.wait(30), "the reader never listed"
        assert first.describe(app_id).state == AppState.SUCCEEDED  # type: ignore[union-attr]
        assert _leftovers(app_id) == []
    finally:
        go.set()
        reader.join(60)
    assert out == [AppState.SUCCEEDED]
    first.close()
    second.close()


def _being_removed_error() -> Exception:
    """What the engine answers for the logs of a container while `docker rm` runs (a window of
    milliseconds no test can hit on demand: this one error is made, not provoked)."""
    import docker
    import requests

    response = requests.models.Response()
    response.status_code = 409
    return docker.errors.APIError(
        "409 Client Error: Conflict",
        response=response,
        explanation="can not get logs from container which is dead or marked for removal",
    )


@pytest.mark.parametrize("engine_says", ["gone", "being-removed"])
def test_logs_asked_while_the_container_is_removed_come_from_the_state_dir(
    docker_engine: str, no_watcher: None, monkeypatch: pytest.MonkeyPatch, engine_says: str
) -> None:
    """The stress run's failure (scripts/stress-suite.sh): `log` asked for a replica's logs while
    the watcher removed its container ("can not get logs from container which is dead or marked
    for removal", or 404 once it is gone). The reader now waits for the finaliser, which keeps
    the logs in the state dir before it removes anything."""
    from docker.models.containers import Container

    first, second = DockerScheduler("default"), DockerScheduler("default")
    app_id = first.submit(_plain("race", docker_engine, "echo a; echo e >&2", "echo b"), {}, "")
    _wait_exited(app_id)
    out: list[object] = []

    def read() -> None:
        try:
            out.append(list(second.log_iter(app_id, "r", 0)))
        except BaseException as e:
            out.append(e)

    reader = threading.Thread(target=read)
    listed, go = threading.Event(), threading.Event()
    real_logs: Callable[..., Any] = Container.logs

    def logs(self: Container, **kw: Any) -> Any:
        if threading.current_thread() is reader and not listed.is_set():
            listed.set()  # the reader holds the container: now it is finalised and removed
            assert go.wait(60), "the finaliser did not finish"
            if engine_says == "being-removed":
                raise _being_removed_error()
        return real_logs(self, **kw)  # the engine's own 404: the container is gone

    monkeypatch.setattr(Container, "logs", logs)
    reader.start()
    try:
        assert listed.wait(30), "the reader never asked for the logs"
        assert first.describe(app_id).state == AppState.SUCCEEDED  # type: ignore[union-attr]
        assert _leftovers(app_id) == []
    finally:
        go.set()
        reader.join(60)
    assert len(out) == 1 and isinstance(out[0], list), out
    assert sorted(out[0]) == ["a\n", "e\n"]
    first.close()
    second.close()


def test_an_ended_app_is_reported_only_once_its_containers_are_gone(docker_engine: str) -> None:
    """The finaliser records the end, then removes the containers and the network. A reader
    that finds the record before the removal is done (``cleaned: false``) goes through the
    finaliser's lock, and a finaliser that died in between has its clean-up finished by the
    next reader: whoever sees the end never sees what is left of it (the flake of
    ``test_an_elastic_role_loses_a_replica_and_the_survivor_finishes``)."""
    import docker

    sched = DockerScheduler("default")
    app_id = sched.submit(_plain("race", docker_engine, "echo a"), {}, "")
    resp = sched.wait(app_id, timeout=60)
    assert resp is not None and resp.state == AppState.SUCCEEDED
    assert _leftovers(app_id) == []
    # What a finaliser that died between its record and the removal leaves behind.
    label = {"xrun.app_id": app_id}
    client = docker.from_env()
    try:
        client.containers.create(docker_engine, "true", labels=label)
        client.networks.create(f"xrun-left-{app_id[-8:]}", driver="bridge", labels=label)
        final = sched._state_dir.load_final(app_id)
        assert final is not None and final["cleaned"] is True
        sched._state_dir.save_final(app_id, {**final, "cleaned": False})
        assert len(_leftovers(app_id)) == 2
        resp = sched.describe(app_id)
        assert resp is not None and resp.state == AppState.SUCCEEDED
        assert _leftovers(app_id) == []
        assert sched._state_dir.load_final(app_id)["cleaned"] is True  # type: ignore[index]
    finally:
        client.close()
        sched.close()
