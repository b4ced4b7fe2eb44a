"""xrun's ``Runner``/``get_runner`` against TorchX 0.7.0's, without TorchX installed.

``tests/fixtures/torchx/runner-0.7.0.json`` holds TorchX's facts, recorded by
``record_runner.py`` there: every public method's parameters (name, kind, default) and what a
scripted session on local_cwd returned. The signatures are compared parameter by parameter; the
session is replayed here by the SAME script function (``session_facts``) with xrun's
``get_runner``, on xrun's real local_cwd scheduler. A difference must be listed in KNOWN with
its reason; a listed difference that no longer occurs fails too. xrun's own extra parameters
must be keyword-only (so no TorchX call can bind to them by position).
"""

from __future__ import annotations

import importlib.util
import inspect
import json
from pathlib import Path
from typing import Any

import pytest

import xrun.runner
from tests.helpers.paths import FIXTURES
from tests.helpers.signatures import signature_diffs, signature_facts
from xrun.runner import Runner, get_runner

RECORDED = json.loads((FIXTURES / "torchx" / "runner-0.7.0.json").read_text())

_spec = importlib.util.spec_from_file_location(
    "record_runner", FIXTURES / "torchx" / "record_runner.py"
)
assert _spec is not None and _spec.loader is not None
record_runner = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(record_runner)

# (what, fact) -> why xrun differs on purpose.
KNOWN: dict[tuple[str, str], str] = {
    ("Runner.__init__", "name.default"): "Runner() works alone: the CLI's session, 'default'",
    ("Runner.__init__", "scheduler_factories.default"): "None is xrun's registry (builtins "
    "and plugins), so Runner() works alone",
    ("session", "name"): "get_runner() uses the CLI's session ('default', TorchX: 'torchx'), so "
    "`xrun list` shows the apps a script started",
    ("session", "handle_session"): "the same session as the CLI's ('default')",
    ("session", "list_has_the_handle"): "xrun's local_cwd keeps its apps on disk and lists "
    "them; TorchX's raises 'App handles cannot be listed for local scheduler'",
    ("session", "unknown.log_lines_raises"): "xrun's own AppNotFoundError (the CLI's exit 1); "
    "the torchx stand-in's UnknownAppException is another class",
}


def _ours(what: str) -> Any:
    if what == "get_runner":
        return get_runner
    return getattr(Runner, what.split(".", 1)[1])


@pytest.mark.parametrize("what", sorted(RECORDED["signatures"]))
def test_signature_matches_torchx_or_differs_on_purpose(what: str) -> None:
    theirs = RECORDED["signatures"][what]["params"]
    diffs = signature_diffs(theirs, signature_facts(_ours(what)))
    unexplained = {k: v for k, v in diffs.items() if (what, k) not in KNOWN}
    assert unexplained == {}, f"{what}: differs from TorchX 0.7.0 (torchx, xrun)"
    stale = [k for (w, k) in KNOWN if w == what and k not in diffs]
    assert stale == [], f"{what}: listed as different but equal now: {stale}"


def _flat(facts: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in facts.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


@pytest.mark.timeout(90)
def test_a_scripted_session_returns_what_torchx_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))  # no developer's ~/.xrunconfig
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    for var in ("LOGLEVEL", "TORCHX_TRACKERS", "TORCHX_PARENT_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    theirs = _flat(RECORDED["session"])
    ours = _flat(record_runner.session_facts(get_runner))
    unexplained = {
        k: (theirs.get(k), ours.get(k))
        for k in sorted(set(theirs) | set(ours))
        if theirs.get(k) != ours.get(k) and ("session", k) not in KNOWN
    }
    assert unexplained == {}, "the session differs from TorchX 0.7.0's (torchx, xrun)"
    stale = [k for (w, k) in KNOWN if w == "session" and theirs.get(k) == ours.get(k)]
    assert stale == [], f"listed as different but equal now: {stale}"


def test_the_recording_covers_what_the_issue_names() -> None:
    assert RECORDED["torchx"] == "0.7.0"
    sigs = RECORDED["signatures"]
    for name in ("Runner.stop", "Runner.scheduler_run_opts", "Runner.scheduler_backends"):
        assert name in sigs
    assert [p["name"] for p in sigs["Runner.wait"]["params"]] == [
        "self",
        "app_handle",
        "wait_interval",
    ]
    assert RECORDED["session"]["unknown"]["cancel"] is None


def test_extra_parameters_are_keyword_only() -> None:
    # the rule the comparison enforces, shown failing on a positional extra
    theirs = [{"name": "self", "kind": "POSITIONAL_OR_KEYWORD", "default": None}]
    ours = theirs + [{"name": "timeout", "kind": "POSITIONAL_OR_KEYWORD", "default": "None"}]
    assert signature_diffs(theirs, ours) == {"timeout.extra": (None, "POSITIONAL_OR_KEYWORD")}
    assert inspect.signature(Runner.wait).parameters["timeout"].kind.name == "KEYWORD_ONLY"
    assert xrun.runner.DEFAULT_SESSION == "default"
