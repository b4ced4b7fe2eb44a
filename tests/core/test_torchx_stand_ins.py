"""xrun's stand-ins for the rest of TorchX's API (src/xrun/torchx/stand_ins.py) against TorchX
0.7.0, recorded in tests/fixtures/torchx/stand-ins-0.7.0.json by record_stand_ins.py there:
the same signatures, and the SAME script function (``behaviour``) returns the same values
when its ``import torchx...`` get xrun's stand-ins. A difference must be listed in KNOWN."""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers.cli import Env
from tests.helpers.paths import FIXTURES
from tests.helpers.signatures import signature_diffs, signature_facts
from xrun import runner as xrun_runner
from xrun.torchx.compat import torchx_imports

RECORDED = json.loads((FIXTURES / "torchx" / "stand-ins-0.7.0.json").read_text())
_spec = importlib.util.spec_from_file_location(
    "record_stand_ins", FIXTURES / "torchx" / "record_stand_ins.py"
)
assert _spec is not None and _spec.loader is not None
record = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(record)

KNOWN: dict[str, str] = {
    "torchx.components.metrics.tensorboard.image.default": "xrun's components default to "
    "xrun's image (TorchX's to its own, which has TorchX in it)",
    "torchx.tracker.backend.fsspec.FsspecTracker.root_dir.default": "xrun's own code also "
    "builds one from a store alone (TorchX's two arguments work as in TorchX)",
    "behaviour.get_default_scheduler_name": "xrun run's default is local_cwd (TorchX's "
    "local_docker, its default, is accepted as another name for xrun's docker)",
}


@pytest.mark.parametrize("what", sorted(RECORDED["signatures"]))
def test_signature_matches_torchx(what: str) -> None:
    module, _, fn = what.rpartition(".")
    with torchx_imports():
        ours = getattr(importlib.import_module(module), fn)
        assert getattr(sys.modules[module], "__xrun_stand_in__", False)
    diffs = signature_diffs(RECORDED["signatures"][what]["params"], signature_facts(ours))
    unexplained = {k: v for k, v in diffs.items() if f"{what}.{k}" not in KNOWN}
    assert unexplained == {}, f"{what}: differs from TorchX 0.7.0 (torchx, xrun)"


def test_the_same_calls_return_what_torchx_returns() -> None:
    with torchx_imports():
        ours = record.behaviour()
    theirs = RECORDED["behaviour"]
    unexplained = {
        k: (theirs.get(k), ours.get(k))
        for k in sorted(set(theirs) | set(ours))
        if theirs.get(k) != ours.get(k) and f"behaviour.{k}" not in KNOWN
    }
    assert unexplained == {}, "differs from TorchX 0.7.0 (torchx, xrun)"
    stale = [
        k for k in KNOWN if k.startswith("behaviour.") and theirs.get(k[10:]) == ours.get(k[10:])
    ]
    assert stale == [], f"listed as different but equal now: {stale}"


def test_torchx_runner_is_xrun_s_and_only_while_the_stand_ins_apply() -> None:
    with torchx_imports():
        import torchx  # type: ignore[import-not-found]
        from torchx.runner import Runner, get_runner  # type: ignore[import-not-found]
        from torchx.runner.api import get_runner as api_get_runner  # type: ignore[import-not-found]

        assert get_runner is api_get_runner is xrun_runner.get_runner
        assert Runner is xrun_runner.Runner and torchx.runner.get_runner is get_runner
        import torchx.specs  # type: ignore[import-not-found]
        from torchx.specs import finder  # type: ignore[import-not-found]

        # as attributes, before their submodules are imported (TorchX's specs re-exports them)
        assert torchx.specs.materialize_appdef is torchx.specs.builders.materialize_appdef
        with pytest.raises(AttributeError, match="no attribute 'nope'"):
            _ = torchx.specs.nope
        from torchx.specs.builders import materialize_appdef  # type: ignore[import-not-found]

        assert torchx.specs.builders.materialize_appdef is materialize_appdef
        assert finder.get_component("dist.ddp").fn_name == "ddp"
        with pytest.raises(ModuleNotFoundError, match="stands in only for .*torchx.runner"):
            importlib.import_module("torchx.pipelines")
    assert not [n for n in sys.modules if n == "torchx" or n.startswith("torchx.")]
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("torchx.runner")


COMPONENT = '''\
from torchx.components.dist import get_role_name
from torchx.runner import get_runner
from torchx.schedulers import get_scheduler_factories
from torchx.specs import file_linter, finder
from torchx.specs.builders import materialize_appdef
import torchx.specs as specs


def wrapped(script: str, msg: str = "hi") -> specs.AppDef:
    """Builds utils.echo through TorchX's builder, naming the app after the script."""
    assert "local_cwd" in get_scheduler_factories() and callable(get_runner)
    assert file_linter.validate(__file__, "wrapped") == []
    echo = finder.get_component("utils.echo").fn
    app = materialize_appdef(echo, ["--msg", msg])
    app.name = get_role_name(script, None)
    return app
'''


def test_a_component_file_importing_them_runs(tmp_path: Path) -> None:
    cli = Env(tmp_path)
    (cli.cwd / "comp.py").write_text(textwrap.dedent(COMPONENT))
    r = cli.run("run", "--dryrun", "comp.py:wrapped", "--script", "x/train.py", "--msg", "yo")
    assert r.returncode == 0, r.stderr
    assert "name: train\n" in r.stdout and "- yo\n" in r.stdout
