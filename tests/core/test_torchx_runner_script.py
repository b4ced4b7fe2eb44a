"""An unchanged TorchX Runner script runs without TorchX installed (gap §8, issue #36):
``python -m xrun.torchx SCRIPT`` and, after ``python -m xrun.torchx --install``, plain
``python SCRIPT``. The script is TorchX's own recorder (tests/fixtures/torchx/record_runner.py,
which recorded runner-0.7.0.json with the real TorchX 0.7.0): run unchanged here, it must
record the same session, up to the differences test_runner_parity.py lists on purpose."""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

from tests.core.test_runner_parity import KNOWN, RECORDED, _flat
from tests.helpers.paths import FIXTURES, PY, REPO

RECORDER = FIXTURES / "torchx" / "record_runner.py"


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHX", "LOGLEVEL"))}
    env.update(HOME=str(tmp), XDG_STATE_HOME=str(tmp / "state"), PYTHONPATH="")
    return env


def _session_diffs(out_dir: Path) -> dict[str, object]:
    ours = _flat(json.loads((out_dir / "runner-0.7.0.json").read_text())["session"])
    theirs = _flat(RECORDED["session"])
    return {
        k: (theirs.get(k), ours.get(k))
        for k in sorted(set(theirs) | set(ours))
        if theirs.get(k) != ours.get(k) and ("session", k) not in KNOWN
    }


@pytest.mark.timeout(120)
def test_python_m_xrun_torchx_runs_the_recorder_unchanged(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    p = subprocess.run(
        [PY, "-m", "xrun.torchx", str(RECORDER), str(out)],
        cwd=tmp_path,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert "recorded" in p.stdout
    assert _session_diffs(out) == {}, "the session differs from TorchX 0.7.0's (torchx, xrun)"


@pytest.mark.timeout(180)
def test_install_makes_plain_python_run_it_and_uninstall_undoes_it(tmp_path: Path) -> None:
    """The opt-in .pth goes into the running interpreter's site-packages: a throwaway venv
    here (the project's own .venv is never touched), which sees xrun through a site dir."""
    venv = tmp_path / "venv"
    subprocess.run([PY, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    py = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    ours = [p for p in site.getsitepackages() if p.startswith(sys.prefix)]
    (Path(purelib) / "xrun-under-test.pth").write_text(
        "".join(f"import site; site.addsitedir({p!r})\n" for p in ours)
    )
    env = _env(tmp_path)
    script = tmp_path / "tx_script.py"
    script.write_text("import torchx.util.types as t\nprint(t.to_list('a, b'))\n")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(py), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )

    before = run(str(script))
    assert before.returncode == 1 and "No module named 'torchx'" in before.stderr
    assert "not installed" in run("-m", "xrun.torchx", "--status").stdout
    installed = run("-m", "xrun.torchx", "--install")
    assert installed.returncode == 0, installed.stderr
    pth = Path(purelib) / "xrun-torchx-stand-ins.pth"
    assert pth.is_file() and str(REPO) not in pth.read_text()
    after = run(str(script))
    assert after.returncode == 0 and after.stdout == "['a', 'b']\n", after.stderr
    # a program that never imports torchx pays only the hook's import
    assert run("-c", "import sys; print('torchx' in sys.modules)").stdout == "False\n"
    out = tmp_path / "out"
    out.mkdir()
    recorded = run(str(RECORDER), str(out))
    assert recorded.returncode == 0, recorded.stderr[-3000:]
    assert _session_diffs(out) == {}
    assert run("-m", "xrun.torchx", "--uninstall").returncode == 0
    assert not pth.exists()
    assert run(str(script)).returncode == 1


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ([], "usage: python -m xrun.torchx"),
        (["--nope"], "unknown option '--nope'"),
        (["/no/such/script.py"], "no such script: '/no/such/script.py'"),
        (["--install", "extra"], "--install takes no argument (got 'extra')"),
    ],
)
def test_bad_use_is_one_line_and_exit_2(args: list[str], needle: str, tmp_path: Path) -> None:
    p = subprocess.run(
        [PY, "-m", "xrun.torchx", *args],
        cwd=tmp_path,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2 and needle in p.stderr and len(p.stderr.splitlines()) == 1, p.stderr
