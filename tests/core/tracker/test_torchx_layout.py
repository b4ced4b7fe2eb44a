"""xrun's fsspec tracker against TorchX 0.7.0's, both directions, from recorded facts.

tests/fixtures/torchx/tracker-0.7.0/ holds a tree TorchX's FsspecTracker wrote, TorchX's
reading of it, the normalized layout, and `torchx tracker list ...` output (record_tracker.py;
TorchX is not installed here). At recording time TorchX also read a tree xrun wrote and read
it as its own; here xrun must still write that same layout, read TorchX's tree as TorchX did,
and print what `torchx tracker list` printed.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.cli import Env
from tests.helpers.paths import FIXTURES
from xrun.tracker.fsspec_backend import FsspecTracker, create

RECORDED = FIXTURES / "torchx" / "tracker-0.7.0"
FACTS = json.loads((RECORDED / "facts.json").read_text())
CHILD = "slurm://default/42"


def _apply(tracker: FsspecTracker, root: Path) -> None:
    """record_tracker.py's OPS, done by xrun."""
    from base64 import b32encode

    for method, run_id, args, kwargs in FACTS["ops"]:
        if method == "mkdir_descendants":
            (root / b32encode(run_id.encode()).decode() / "descendants").mkdir(parents=True)
            continue
        getattr(tracker, method)(run_id, *args, **kwargs)


def _layout(root: Path) -> dict[str, str]:
    """As record_tracker.layout: entry files named by time become #0, #1, ..."""
    out = {}
    for d, _, files in os.walk(root):
        rel = os.path.relpath(d, root)
        timed = os.path.basename(d) in ("metadata", "artifacts")
        for i, name in enumerate(sorted(files)):
            out[os.path.join(rel, f"#{i}" if timed else name)] = Path(d, name).read_text()
        if not files:
            out[rel + "/"] = ""
    return out


def _reading(t: FsspecTracker) -> dict[str, Any]:
    runs = sorted(t.run_ids())
    parent = FACTS["ops"][0][1]
    return {
        "run_ids": runs,
        "children_of_parent": sorted(t.run_ids(parent_run_id=parent)),
        "metadata": {r: dict(t.metadata(r)) for r in runs},
        "artifacts": {
            r: {n: [a.name, a.path, a.metadata] for n, a in t.artifacts(r).items()} for r in runs
        },
        "sources": {
            r: sorted([s.source_run_id, s.artifact_name or ""] for s in t.sources(r)) for r in runs
        },
        "sources_dataset": {
            r: sorted([s.source_run_id, s.artifact_name] for s in t.sources(r, "dataset"))
            for r in runs
        },
    }


@pytest.fixture
def torchx_root(tmp_path: Path) -> Path:
    root = tmp_path / "torchx-root"
    shutil.copytree(RECORDED / "root", root)
    return root


def _parsed(layout: dict[str, str]) -> dict[str, Any]:
    """Entries as JSON values (facts.json has its operations' keys sorted, so key order in an
    entry's text is no fact)."""
    return {k: json.loads(v) if "#" in k else v for k, v in layout.items()}


def test_xrun_writes_torchx_layout(tmp_path: Path) -> None:
    root = tmp_path / "xrun-root"
    _apply(create(str(root)), root)
    assert _parsed(_layout(root)) == _parsed(FACTS["layout"])
    # ...which is the tree TorchX read as its own when it was recorded
    assert FACTS["xrun_layout_at_recording"] == FACTS["layout"]


def test_xrun_reads_torchx_tree_as_torchx(torchx_root: Path) -> None:
    ours = _reading(create(str(torchx_root)))
    theirs = FACTS["reading"]
    # lr was written twice: TorchX merges in listing order (either value), xrun in time order
    assert ours["metadata"][CHILD].pop("lr") == 0.2
    theirs["metadata"][CHILD].pop("lr")
    assert ours == theirs


def test_xrun_reads_its_own_tree_as_torchx_did(tmp_path: Path) -> None:
    root = tmp_path / "xrun-root"
    _apply(create(str(root)), root)
    ours = _reading(create(f"file://{root}"))
    recorded = FACTS["torchx_reads_xrun"]
    recorded["metadata"][CHILD]["lr"] = 0.2  # the latest, as above
    assert ours == recorded


def _torchx_config(env: Env, root: Path) -> None:
    """The same config TorchX's CLI ran with: a TorchX tracker config file."""
    conf = env.cwd / "tracker.conf"
    conf.write_text(f"protocol=file\nroot_path={root}\n")
    (env.cwd / ".xrunconfig").write_text(
        f"[torchx:tracker]\nfsspec =\n\n[tracker:fsspec]\nconfig = {conf}\n"
    )


@pytest.mark.parametrize(
    ("key", "args"),
    [
        ("jobs", ["jobs"]),
        ("jobs_parent", ["jobs", "--parent-run-id", "local_cwd://default/sweep-1"]),
        ("metadata_other", ["metadata", "docker://default/app-x"]),
        ("metadata_parent", ["metadata", "local_cwd://default/sweep-1"]),
        ("artifacts_child", ["artifacts", CHILD]),
        ("artifacts_child_model", ["artifacts", "--artifact", "model", CHILD]),
    ],
)
def test_cli_prints_what_torchx_printed(
    key: str, args: list[str], torchx_root: Path, tmp_path: Path
) -> None:
    env = Env(tmp_path)
    _torchx_config(env, torchx_root)
    r = env.run("tracker", "list", *args)
    assert r.returncode == 0, r.stderr
    assert r.stdout == FACTS["cli"][key]


def test_cli_metadata_rows_as_torchx(torchx_root: Path, tmp_path: Path) -> None:
    env = Env(tmp_path)
    _torchx_config(env, torchx_root)
    r = env.run("tracker", "list", "metadata", CHILD)
    assert r.returncode == 0, r.stderr
    # TorchX's row order and lr follow its directory listing; the rows are otherwise the same
    ours, theirs = r.stdout.splitlines(), FACTS["cli"]["metadata_child"].splitlines()
    assert ours[:2] == theirs[:2]
    assert sorted(ln for ln in ours[2:] if not ln.startswith("lr")) == sorted(
        ln for ln in theirs[2:] if not ln.startswith("lr")
    )
    assert "lr      0.2" in ours
