"""Issue #31: what a workspace must be, checked at submit and in the dry run, each mistake one
line and exit 2, through the real ``xrun`` command.

- P8: slurm without ``job_dir`` runs the job in the workspace itself: it must be a folder.
- N11: a ``--script`` that is not in the workspace the job will use (the image built from it
  on docker, the folder or its job_dir copy on slurm) is refused as local_cwd refuses one not
  in the cwd. Both refusals come before anything is built or submitted, so a real submit is
  tried too (it would build an image, or reach sbatch, before the fix).
- M11: local_cwd runs in the cwd; another ``--workspace`` is refused, the cwd accepted.
- P14 (slurm): a job_dir copy that fills its disk is one line, and leaves nothing behind.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers.box import ULIMIT_V, boxed_peak_rss, tmpfs
from tests.helpers.cli import Env
from tests.helpers.paths import XRUN
from xrun.schedulers.slurm.workspace import copy_workspace

ONE_LINE = "xrun: error: "


@pytest.fixture
def cli(tmp_path: Path) -> Env:
    env = Env(tmp_path)
    (env.cwd / "train.py").write_text("print('hi')\n")
    return env


def _refused(r: subprocess.CompletedProcess[str], *words: str) -> str:
    assert r.returncode == 2, (r.stdout[-2000:], r.stderr[-2000:])
    assert r.stderr.startswith(ONE_LINE) and r.stderr.count("\n") == 1, r.stderr
    assert "Traceback" not in r.stderr
    for w in words:
        assert w in r.stderr, r.stderr
    return r.stderr


# ----------------------------------------------------------------------------- P8
@pytest.mark.parametrize(
    "ws, why",
    [
        ("/nonexistent", "is not a directory"),
        ("/etc/passwd", "is not a directory"),
        ("/proc/self/fd", "is in the kernel's proc filesystem"),
    ],
)
def test_slurm_without_job_dir_refuses_a_workspace_that_is_no_folder(
    cli: Env, ws: str, why: str
) -> None:
    r = cli.run("run", "--dryrun", "-s", "slurm", "--workspace", ws, "utils.echo")
    _refused(r, f"workspace {ws!r} {why}", "pass a folder")


# ----------------------------------------------------------------------------- N11
def test_slurm_refuses_a_script_missing_from_the_folder_the_job_runs_in(
    cli: Env, tmp_path: Path
) -> None:
    job = ["dist.ddp", "-j", "1x1", "--script", "nosuch.py"]
    for submit in (["--dryrun"], []):  # the real submit is refused before sbatch
        r = cli.run("run", *submit, "-s", "slurm", *job)
        _refused(r, "--script 'nosuch.py' is no file in", str(cli.cwd), "without -cfg job_dir")
    jd = f"job_dir={tmp_path / 'jd'}"
    r = cli.run("run", "-s", "slurm", "-cfg", jd, *job)
    _refused(r, "is no file in workspace", "its copy in job_dir")
    assert not (tmp_path / "jd").exists()  # nothing copied
    # ignored by the workspace's .gitignore: the copy would not hold it
    (cli.cwd / "exp").mkdir()
    (cli.cwd / "exp" / "t.py").write_text("")
    (cli.cwd / ".gitignore").write_text("exp/\n")
    r = cli.run("run", "--dryrun", "-s", "slurm", "-cfg", jd, "dist.ddp", "--script", "exp/t.py")
    _refused(r, "is left out of the workspace by .gitignore ('exp' matches)")
    # what the job will find is accepted: a script in the folder, an absolute path, a macro
    for script in ("train.py", "/opt/elsewhere/t.py", "${img_root}/t.py"):
        r = cli.run("run", "--dryrun", "-s", "slurm", "dist.ddp", "--script", script)
        assert r.returncode == 0, r.stderr
        r = cli.run(
            "run", "--dryrun", "-s", "slurm", "-cfg", jd, "utils.python", "--script", script
        )
        assert r.returncode == 0, r.stderr


def test_docker_refuses_a_script_missing_from_the_workspace_it_builds(
    cli: Env, tmp_path: Path
) -> None:
    job = ["dist.ddp", "-j", "1x1", "--script", "nosuch.py"]
    for submit in (["--dryrun"], []):  # the real submit is refused before any build
        r = cli.run("run", *submit, "-s", "docker", *job)
        _refused(r, "--script 'nosuch.py' is no file in workspace", "in /workspace")
    other = tmp_path / "other"
    other.mkdir()
    r = cli.run("run", "--dryrun", "-s", "docker", "--workspace", str(other), *job[:-1], "train.py")
    _refused(r, f"is no file in workspace {other}")
    r = cli.run("run", "--dryrun", "-s", "docker", "utils.python", "--script", "nosuch.py")
    _refused(r, "role 'python': --script 'nosuch.py'")
    # not checked where xrun does not know what the image holds: an absolute path in the
    # image, no workspace at all, or a workspace whose own Dockerfile.xrun places the files
    for args in (
        ["dist.ddp", "--script", "/opt/app/train.py"],
        ["--workspace", "", *job],
        ["--workspace", str(other), "dist.ddp", "--script", "train.py"],
    ):
        if args[:2] == ["--workspace", str(other)]:
            (other / "Dockerfile.xrun").write_text("ARG IMAGE\nFROM ${IMAGE}\n")
        r = cli.run("run", "--dryrun", "-s", "docker", *args)
        assert r.returncode == 0, (args, r.stderr)


# ----------------------------------------------------------------------------- M11
def test_local_cwd_refuses_a_workspace_other_than_the_cwd(cli: Env) -> None:
    for ws in ("/etc", "/nonexistent", "memory://x"):
        for submit in (["--dryrun"], []):
            r = cli.run("run", *submit, "-s", "local_cwd", "--workspace", ws, "utils.echo")
            _refused(r, f"--workspace {ws!r}: local_cwd runs the job in the current directory")
            assert "--workspace is for docker and slurm" in r.stderr
    for ws in (".", str(cli.cwd), f"file://{cli.cwd}", ""):
        r = cli.run("run", "--dryrun", "-s", "local_cwd", "--workspace", ws, "utils.echo")
        assert r.returncode == 0 and r.stderr == "", (ws, r.stderr)


# ----------------------------------------------------------------------------- P14 (slurm)
def test_a_job_dir_copy_that_fills_the_disk_is_one_line_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    """A 200 MiB (sparse) file into a 16 MiB job_dir filesystem: one line naming job_dir,
    exit 2, job_dir gone, memory bounded; then the same job_dir takes a workspace that fits
    (was: a traceback at 232 MB RSS, a half-copied job_dir refused on the next run)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "train.py").write_text("print('hi')\n")
    with open(ws / "big.bin", "wb") as f:
        f.truncate(200 << 20)  # sparse: costs no disk here
    with tmpfs(tmp_path / "box", size="16m", inodes=400) as box:
        jd = box / "jobs" / "jd"
        argv = ["run", "-s", "slurm", "-cfg", f"job_dir={jd}", "--workspace", str(ws)]
        argv += ["dist.ddp", "-j", "1x1", "--script", "train.py"]
        # ulimit -v: a copy that held whole files (200 MiB here) could not grow without bound
        r, peak_kb = boxed_peak_rss([*ULIMIT_V, XRUN, *argv], box)
        msg = _refused(r, f"job_dir {str(jd)!r}: copying workspace {ws} failed", "disk is full")
        assert "nothing was left there" in msg
        assert peak_kb < 150_000, peak_kb
        assert set(os.listdir(box)) <= {"state"}, os.listdir(box)  # no jobs/, no jd
        (ws / "big.bin").unlink()
        assert copy_workspace(str(ws), str(jd)) == ["train.py"]  # not refused for leftovers


def test_a_workspace_changed_between_hash_and_send_is_one_error(tmp_path: Path) -> None:
    """The streamed build context is read twice (its hash names the image, then it is sent):
    a file changed in between must not give an image that its tag does not describe."""
    from xrun.errors import UsageError
    from xrun.schedulers.docker.workspace import build_context

    (tmp_path / "a.py").write_text("v1\n")
    ctx, _ = build_context(tmp_path)
    (tmp_path / "a.py").write_text("v2\n")  # same size, other bytes
    with pytest.raises(UsageError, match="changed while its image was built; run again"):
        b"".join(ctx.chunks())
    (tmp_path / "a.py").write_text("")  # shorter than the size the walk read
    with pytest.raises(UsageError, match="'a.py' in .* got shorter"):
        b"".join(ctx.chunks())
