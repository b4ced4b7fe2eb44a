"""Small utility components: ``utils.echo``, ``sh``, ``python``, ``binary``, ``touch``, ``copy``,
``booth`` (TorchX's HPO test function; its replica side is ``_apps.py``).

``utils.copy`` runs this module as a program (``python3 -m xrun.components.utils copy SRC DST``)
so that only the replica imports fsspec, never the CLI.
"""

from __future__ import annotations

import os
import sys

from xrun.contract import SCRIPT
from xrun.errors import UsageError
from xrun.specs import AppDef, Resource, Role, parse_mounts
from xrun.specs.named_resources import get_named_resource

from . import DEFAULT_IMAGE


def _resource(h: str | None, cpu: int, gpu: int, memMB: int) -> Resource:
    return get_named_resource(h) if h else Resource(cpu=cpu, gpu=gpu, memMB=memMB)


def _small() -> Resource:
    """What TorchX's fixed-size utilities ask for (echo, touch, copy): 1 CPU, 1 GiB. A request,
    so that Slurm passes --cpus-per-task/--mem and docker sets limits, as with TorchX."""
    return Resource(cpu=1, gpu=0, memMB=1024)


def echo(msg: str = "hello world", image: str = DEFAULT_IMAGE, num_replicas: int = 1) -> AppDef:
    """Print a message from every replica (a smoke test of a scheduler).

    Args:
        msg: the message; ${replica_id} and ${app_id} are substituted
        image: container image (docker)
        num_replicas: how many replicas print it
    """
    return AppDef(
        name="echo",
        roles=[
            Role(
                name="echo",
                image=image,
                entrypoint="echo",
                args=[msg],
                num_replicas=num_replicas,
                resource=_small(),
            )
        ],
    )


def sh(
    *args: str,
    image: str = DEFAULT_IMAGE,
    num_replicas: int = 1,
    cpu: int = 1,
    gpu: int = 0,
    memMB: int = 1024,
    h: str | None = None,
    env: dict[str, str] | None = None,
    max_retries: int = 0,
    mounts: list[str] | None = None,
) -> AppDef:
    """Run a shell command line: the arguments are joined with spaces and given to ``sh -c``.

    The arguments are shell code, not quoted (so pipes and ``&&`` work): quote for the shell
    yourself, e.g. ``xrun run utils.sh "ls -l | wc -l"``.

    Args:
        args: the shell command line
        image: container image (docker)
        num_replicas: how many replicas run it
        cpu: CPUs per replica
        gpu: GPUs per replica
        memMB: memory per replica in MB
        h: a named resource; overrides cpu, gpu and memMB
        env: environment variables, k=v,k2=v2 (LOGLEVEL defaults to $LOGLEVEL or WARNING)
        max_retries: how many times the scheduler runs a failed replica again (total attempts: max_retries + 1; local_cwd runs it once)
        mounts: docker-style mounts, type=bind,src=/a,dst=/b[,readonly]
    """
    if not args:
        raise UsageError("utils.sh: no command given; e.g. xrun run utils.sh 'echo hi && date'")
    env = dict(env or {})
    env.setdefault("LOGLEVEL", os.getenv("LOGLEVEL", "WARNING"))  # as TorchX's utils.sh
    return AppDef(
        name="sh",
        roles=[
            Role(
                name="sh",
                image=image,
                entrypoint="sh",
                args=["-c", " ".join(args)],
                env=env,
                num_replicas=num_replicas,
                max_retries=max_retries,
                resource=_resource(h, cpu, gpu, memMB),
                mounts=list(parse_mounts(mounts or [])),
            )
        ],
    )


def python(
    *args: str,
    m: str | None = None,
    c: str | None = None,
    script: str | None = None,
    image: str = DEFAULT_IMAGE,
    name: str = "python",
    cpu: int = 1,
    gpu: int = 0,
    memMB: int = 1024,
    h: str | None = None,
    num_replicas: int = 1,
    env: dict[str, str] | None = None,
) -> AppDef:
    """Run Python code: a module (-m), a string (-c) or a script, like the python3 command.

    Args:
        args: arguments passed to the program (sys.argv[1:])
        m: a module to run (python3 -m MODULE)
        c: a program passed as a string (python3 -c CODE)
        script: a script file to run
        image: container image (docker)
        name: the app and role name
        cpu: CPUs per replica
        gpu: GPUs per replica
        memMB: memory per replica in MB
        h: a named resource; overrides cpu, gpu and memMB
        num_replicas: how many replicas run it
        env: environment variables, k=v,k2=v2
    """
    given = [(flag, v) for flag, v in (("-m", m), ("-c", c), ("--script", script)) if v is not None]
    if len(given) != 1:
        raise UsageError(
            "utils.python: give exactly one of -m MODULE, -c CODE or --script FILE "
            f"(got {', '.join(f for f, _ in given) or 'none'})"
        )
    flag, value = given[0]
    head = [value] if flag == "--script" else [flag, str(value)]
    return AppDef(
        name=name,
        roles=[
            Role(
                name=name,
                image=image,
                entrypoint="python3",
                args=[*head, *args],
                env=dict(env or {}),
                num_replicas=num_replicas,
                resource=_resource(h, cpu, gpu, memMB),
                # the schedulers check it is where the job runs (xrun.contract.SCRIPT)
                metadata={SCRIPT: value} if flag == "--script" else {},
            )
        ],
    )


def binary(
    *args: str,
    entrypoint: str,
    name: str = "binary",
    num_replicas: int = 1,
    image: str = DEFAULT_IMAGE,
    env: dict[str, str] | None = None,
) -> AppDef:
    """Run an executable with arguments (no shell: each argument is passed as is).

    Args:
        args: arguments passed to the executable
        entrypoint: the executable (a path or a name on PATH)
        name: the app and role name
        num_replicas: how many replicas run it
        image: container image (docker)
        env: environment variables, k=v,k2=v2
    """
    return AppDef(
        name=name,
        roles=[
            Role(
                name=name,
                image=image,
                entrypoint=entrypoint,
                args=list(args),
                env=dict(env or {}),
                num_replicas=num_replicas,
            )
        ],
    )


def touch(file: str, image: str = DEFAULT_IMAGE) -> AppDef:
    """Create an empty file (or update its time), e.g. to check where a scheduler runs.

    Args:
        file: the path to touch
        image: container image (docker)
    """
    return AppDef(
        name="touch",
        roles=[Role(name="touch", image=image, entrypoint="touch", args=[file], resource=_small())],
    )


def copy(src: str, dst: str, image: str = DEFAULT_IMAGE) -> AppDef:
    """Copy a file between any two fsspec URLs (local paths, file://, memory://, s3:// ...).

    Args:
        src: the source URL or path
        dst: the destination URL or path
        image: container image (docker); it needs fsspec installed
    """
    return AppDef(
        name="copy",
        roles=[
            Role(
                name="copy",
                image=image,
                entrypoint="python3",
                args=["-m", "xrun.components.utils", "copy", src, dst],
                resource=_small(),
            )
        ],
    )


def booth(
    x1: float,
    x2: float,
    trial_idx: int = 0,
    tracker_base: str = "/tmp/torchx-util-booth",
    image: str = DEFAULT_IMAGE,
) -> AppDef:
    """Evaluates the booth function, ``f(x1, x2) = (x1 + 2*x2 - 7)^2 + (2*x1 + x2 - 5)^2``.

    The result, ``{"booth_eval": f}``, is stored under key ``trial_idx`` of ``tracker_base``
    as TorchX's ``FsspecResultTracker(tracker_base)[trial_idx]`` reads it (and printed).

    Args:
        x1: x1
        x2: x2
        trial_idx: ignore if not running hpo
        tracker_base: URI of the tracker's base output directory (e.g. s3://foo/bar)
        image: the image that contains the booth app
    """
    return AppDef(
        name="torchx-utils-booth",
        roles=[
            Role(
                name="torchx-utils-booth",
                image=image,
                entrypoint="python3",
                args=[
                    "-m",
                    "xrun.components._apps",
                    "booth",
                    "--x1",
                    str(x1),
                    "--x2",
                    str(x2),
                    "--trial_idx",
                    str(trial_idx),
                    "--tracker_base",
                    tracker_base,
                ],  # fmt: skip
                resource=Resource(cpu=1, gpu=0, memMB=1024),
            )
        ],
    )


def _copy_main(argv: list[str]) -> int:
    """The replica side of :func:`copy`."""
    if len(argv) != 3 or argv[0] != "copy":
        print("usage: python3 -m xrun.components.utils copy SRC DST", file=sys.stderr)
        return 2
    import fsspec  # only the replica needs it

    src, dst = argv[1], argv[2]
    with fsspec.open(src, "rb") as fin, fsspec.open(dst, "wb") as fout:
        while chunk := fin.read(1 << 20):
            fout.write(chunk)
    print(f"copied {src} -> {dst}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(_copy_main(sys.argv[1:]))
