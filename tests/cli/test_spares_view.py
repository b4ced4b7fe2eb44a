"""``xrun status`` of a job with spares (xrun/cli/spares_view.py) on the agents' own stderr
lines, as a real run printed them (the node-loss drill on Slurm, tests/schedulers/slurm/
test_spares.py, checks the whole command on a real job)."""

from __future__ import annotations

from xrun.cli.spares_view import spares_lines
from xrun.components.dist import ddp
from xrun.specs import AppState, AppStatus, ReplicaStatus, RoleStatus

LOGS = {
    0: [
        "[xrun-agent 21548] membership changed (node vm (round 0, arrival 2) is gone: its "
        "connection closed or it missed heartbeats for 2s): restarting the workers",
        "[xrun-agent 21548] restart budget: 1 of 3 restarts used, 2 left (job-wide)",
    ],
    1: [
        "[xrun-agent 21558] standing by as a spare: the world of round 0 is full",
        "[xrun-agent 21558] round 0 went stale and its members left it: trying for a seat in "
        "round 1",
        "[xrun-agent 21558] a spare no more: took group rank 1 in round 1",
    ],
    2: [
        "[xrun-agent 21560] node c3 (host vm) quarantined: its workers failed alone 2 times, "
        "last: RuntimeError: x",
    ],
}


def status(states: list[AppState]) -> AppStatus:
    reps = [
        ReplicaStatus(id=k, state=s, role="w", hostname=f"c{k + 1}") for k, s in enumerate(states)
    ]
    return AppStatus(state=AppState.SUCCEEDED, roles=[RoleStatus(role="w", replicas=reps)])


def app(spares: int):  # type: ignore[no-untyped-def]
    a = ddp(script="w.py", j="2x1", spares=spares)
    a.roles[0].name = "w"
    return a


def test_spares_replacements_budget_and_quarantine() -> None:
    st = status([AppState.SUCCEEDED, AppState.SUCCEEDED, AppState.FAILED])
    lines = spares_lines(app(1), st, lambda role, k: LOGS[k])
    assert lines == [
        "Spares (w): 1; 1 used, 0 idle; stood by: w/1",
        "  w/1 took group rank 1 in round 1",
        "  lost: w/2",
        "Budget: 1 of 3 restarts used, 2 left (job-wide)",
        "Quarantined: node c3 (host vm: its workers failed alone 2 times, last: RuntimeError: x)",
    ]


def test_an_idle_spare_and_no_log_read_without_spares() -> None:
    st = status([AppState.SUCCEEDED] * 3)
    lines = spares_lines(app(1), st, lambda role, k: LOGS[1][:1] if k == 1 else [])
    assert lines == ["Spares (w): 1; 0 used, 1 idle; stood by: w/1"]

    def no_read(role: str, k: int) -> list[str]:
        raise AssertionError("read a log of an app without spares")

    assert spares_lines(app(0), st, no_read) == []
    assert spares_lines(None, st, no_read) == []


def test_spares_from_the_agents_command_when_the_role_has_no_metadata() -> None:
    a = app(1)
    a.roles[0].metadata = {}  # docker rebuilds roles from its containers: no metadata
    st = status([AppState.SUCCEEDED] * 3)
    assert spares_lines(a, st, lambda role, k: LOGS[k])[0].startswith("Spares (w): 1; 1 used")
    assert spares_lines(app(0), st, lambda role, k: LOGS[1]) == []
