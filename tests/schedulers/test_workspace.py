"""The one workspace walk (schedulers/workspace.py): local paths, file:// and memory:// URLs,
one ignore rule; docker's build context and Slurm's job_dir copy hold the same files."""

from __future__ import annotations

import io
import os
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest

from xrun.errors import UsageError
from xrun.schedulers.docker.workspace import build_context
from xrun.schedulers.slurm.workspace import copy_workspace
from xrun.schedulers.workspace import ALWAYS_SKIP, open_workspace, walk

TREE = {
    "train.py": "print('train')\n",
    "pkg/m.py": "m = 1\n",
    "pkg/build/out.o": "o",  # unanchored 'build/' in .gitignore: a folder at any depth
    "data/raw/a.bin": "x",
    "keep.bin": "k",
    "notes.txt": "n",
    ".git/HEAD": "ref",
    ".venv/bin/python": "py",
    "pkg/__pycache__/m.cpython-311.pyc": "c",
    ".gitignore": "# data and outputs\nbuild/\n*.bin\n!keep.bin\n/data\n",
}
KEPT = [".gitignore", "keep.bin", "notes.txt", "pkg/m.py", "train.py"]


def _local(root: Path) -> str:
    for rel, text in TREE.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return str(root)


@pytest.fixture
def memory_ws() -> Iterator[str]:
    fs = fsspec.filesystem("memory")
    root = f"/ws-{uuid.uuid4().hex}"
    for rel, text in TREE.items():
        fs.pipe(f"{root}/{rel}", text.encode())
    yield f"memory://{root}"
    fs.rm(root, recursive=True)


@pytest.mark.parametrize("form", ["path", "relative", "file-url"])
def test_local_forms_walk_the_same_files(
    form: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _local(tmp_path / "ws")
    monkeypatch.chdir(tmp_path)
    spec = {"path": root, "relative": "ws", "file-url": f"file://{root}"}[form]
    ws = open_workspace(spec)
    assert [f.rel for f in walk(ws)] == KEPT
    assert ws.ignore_file == ".gitignore"
    assert ws.user_patterns() == ("build/", "*.bin", "!keep.bin", "/data")
    assert ws.local_path() == root
    assert ws.url == (spec if form == "file-url" else root)


def test_memory_workspace_walks_like_a_local_one(memory_ws: str) -> None:
    ws = open_workspace(memory_ws)
    assert [f.rel for f in walk(ws)] == KEPT and ws.local_path() is None
    assert ws.url == memory_ws


def test_xrunignore_wins_over_gitignore_and_can_take_back_an_always_skipped(
    tmp_path: Path,
) -> None:
    root = _local(tmp_path)
    (tmp_path / ".xrunignore").write_text("notes.txt\n!.venv/\n")
    ws = open_workspace(root)
    assert ws.ignore_file == ".xrunignore" and ws.patterns[: len(ALWAYS_SKIP)] == ALWAYS_SKIP
    rels = [f.rel for f in walk(ws)]
    assert "notes.txt" not in rels and ".venv/bin/python" in rels
    assert "data/raw/a.bin" in rels  # .gitignore is not read when .xrunignore exists
    assert ws.describe_ignored().startswith("leaving out .xrunignore: notes.txt !.venv/; always:")


def test_docker_context_and_slurm_copy_hold_the_same_files(memory_ws: str, tmp_path: Path) -> None:
    context, _ = build_context(memory_ws)
    with tarfile.open(fileobj=io.BytesIO(b"".join(context.chunks()))) as tar:
        in_image = sorted(
            n.removeprefix("workspace/") for n in tar.getnames() if n.startswith("workspace/")
        )
        assert tar.extractfile("workspace/pkg/m.py").read() == b"m = 1\n"  # type: ignore[union-attr]
    copied = copy_workspace(memory_ws, str(tmp_path / "job"))
    assert in_image == sorted(copied) == KEPT
    assert (tmp_path / "job" / "train.py").read_text() == TREE["train.py"]


def test_an_executable_stays_executable(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(tmp_path / "ws" / "run.sh", 0o755)
    copy_workspace(str(tmp_path / "ws"), str(tmp_path / "job"))
    assert os.stat(tmp_path / "job" / "run.sh").st_mode & 0o777 == 0o755


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("memory://no-such-folder-42", "is not a directory; pass a folder: a local path"),
        ("nosuchproto://x", "workspace 'nosuchproto://x': Protocol not known: nosuchproto"),
        ("", "an empty workspace"),
    ],
)
def test_a_bad_workspace_is_one_usage_error(spec: str, expected: str) -> None:
    with pytest.raises(UsageError, match=expected.replace("(", r"\(")):
        open_workspace(spec)


def test_a_linked_folder_is_not_followed(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "a.py").write_text("")
    os.symlink(tmp_path / "ws", tmp_path / "ws" / "loop")
    assert [f.rel for f in walk(open_workspace(str(tmp_path / "ws")))] == ["a.py"]
