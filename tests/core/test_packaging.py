"""The wheel installs one package, ``xrun``, with its three sub-packages inside it."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers.paths import REPO


@pytest.mark.timeout(180)
def test_wheel_holds_only_the_xrun_package(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=170,
    )
    (wheel,) = tmp_path.glob("xrun-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if ".dist-info/" not in n}
    assert tops == {"xrun"}, f"nothing but xrun may be installed at the top level: {tops}"
    for module in (
        "xrun/__init__.py",
        "xrun/py.typed",
        "xrun/specs/__init__.py",
        "xrun/specs/api.py",
        "xrun/component/finder.py",
        "xrun/torchx/compat.py",
        "xrun/cli/__init__.py",
        "xrun/cli/cmd_run.py",
        "xrun/sweeps/trials.py",
        "xrun/components/dist.py",
        "xrun/schedulers/local_cwd/scheduler.py",
        "xrun/schedulers/slurm/scheduler.py",
        "xrun/schedulers/docker/scheduler.py",
        "xrun/runtime/agent.py",
        "xrun/runtime/__main__.py",
        "xrun/tracker/api.py",
        "xrun/calls/worker.py",
        # the workers' torchx.tracker stand-in: package data, not a package of its own
        "xrun/torchx/shim/torchx/__init__.py",
        "xrun/torchx/shim/torchx/tracker/__init__.py",
        "xrun/torchx/shim/torchx/tracker/api.py",
    ):
        assert module in names, module
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "xrun = xrun.cli:main" in text and "xrun-agent = xrun.runtime.__main__:main" in text


def test_the_editable_install_adds_no_import_hook_to_every_python_start() -> None:
    # setuptools installs a src layout as a path in a .pth file; a package-dir mapping would
    # get a finder module that every interpreter in the venv imports (14 ms each, workers too).
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "pass"],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    )
    imported = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()]
    assert not [m for m in imported if "editable" in m or "finder" in m], imported
    # ... and xrun still resolves from this checkout, sub-packages included.
    code = (
        "import xrun.runtime.agent as a, xrun.components.dist as d; print(a.__file__, d.__file__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/"
    ).stdout.split()
    assert out == [
        str(REPO / "src/xrun/runtime/agent.py"),
        str(REPO / "src/xrun/components/dist.py"),
    ]
