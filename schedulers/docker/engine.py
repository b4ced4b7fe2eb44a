"""The docker scheduler's calls into the docker SDK: connect, images, container arguments.

Every function imports the SDK lazily, so importing this module costs nothing and a missing
SDK is a one-line :class:`~xrun.errors.UsageError`, not an ImportError.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from xrun.errors import SchedulerError, UsageError
from xrun.specs import BindMount

from .request import LABEL_STOP_TIMEOUT, DockerContainer, DockerJob
from .workspace import IMAGE_REPO, BuildContext, image_tag

_DEFAULT_HOST = "unix:///var/run/docker.sock"
# Workspace images kept on the engine: every change of the workspace (or of xrun) makes a new
# one, and a developer's edit-run loop would pile them up.
KEEP_WORKSPACE_IMAGES = 20
# How long one Engine API call may take before xrun gives up on it (the SDK's own default,
# named so that the message can say it and a test can shorten it). An engine that accepts
# connections and never answers otherwise surfaced as a requests ReadTimeout traceback.
TIMEOUT_S = 60.0
_X = TypeVar("_X")


def engine_host() -> str:
    return os.environ.get("DOCKER_HOST") or _DEFAULT_HOST


def connect() -> Any:
    """A ``docker.DockerClient`` for DOCKER_HOST (default: the local socket) that answered a ping."""
    try:
        import docker
    except ImportError:
        raise UsageError(
            "the docker scheduler needs the docker SDK: pip install 'xrun[docker]'"
        ) from None
    import requests

    try:
        client = docker.from_env(timeout=TIMEOUT_S)
        client.ping()
    except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UsageError(
            f"cannot reach the Docker Engine at {engine_host()} (DOCKER_HOST) ({reason}); start "
            f"one (on a dev machine: scripts/docker-engine.sh up) or set DOCKER_HOST to a running one"
        ) from None
    return client


@contextlib.contextmanager
def engine_errors() -> Iterator[None]:
    """The engine's refusals, and a call it did not answer within ``TIMEOUT_S``, become
    one-line SchedulerErrors (the CLI prints them without a traceback); a lost connection
    becomes the same kind of UsageError as no engine at all."""
    import docker
    import requests

    try:
        yield
    except docker.errors.APIError as e:
        raise SchedulerError(f"the Docker Engine refused: {e.explanation or e}") from None
    except requests.exceptions.Timeout:
        raise SchedulerError(
            f"the Docker Engine at {engine_host()} (DOCKER_HOST) did not answer within "
            f"{TIMEOUT_S:g} s; is it overloaded or stuck? (`docker info` asks it; on a dev "
            f"machine: scripts/docker-engine.sh up)"
        ) from None
    except requests.exceptions.ConnectionError as e:
        raise UsageError(
            f"lost the Docker Engine at {engine_host()} (DOCKER_HOST) ({e}); is it still "
            f"running? (on a dev machine: scripts/docker-engine.sh up)"
        ) from None


def parallel(fn: Callable[[_X], object], items: list[_X]) -> None:
    """Run ``fn`` over ``items`` in threads (starting/stopping 8 containers one by one is slow)."""
    if not items:
        return
    with ThreadPoolExecutor(max_workers=min(8, len(items))) as pool:
        for fut in [pool.submit(fn, it) for it in items]:
            fut.result()


# --------------------------------------------------------------------------- images
def ensure_images(client: Any, images: Iterable[str]) -> None:
    """Pull only what the engine lacks: a local image (e.g. one built here) is never pulled."""
    import docker

    for image in sorted(set(images)):
        try:
            client.images.get(image)
            continue
        except docker.errors.ImageNotFound:
            pass
        try:
            client.images.pull(image)
        except docker.errors.APIError as e:
            raise UsageError(
                f"image {image!r} is not on the Docker Engine and pulling it failed "
                f"({e.explanation or e}); build or load it first (xrun's python3 base image: "
                f"scripts/docker-engine.sh image) or fix the image name"
            ) from None


def build_image(  # noqa: PLR0913 - the build's parts and its two run options
    client: Any,
    context: BuildContext,
    dockerfile: str,
    base: str,
    workspace: str,
    repo: str | None = None,
    quiet: bool = True,
) -> str:
    """Build ``context`` on ``base`` (see .workspace); return the tag, ``REPO:<hash>`` (the
    run option image_repo, default xrun-workspace). Cached by content. Unless ``quiet``, each
    line the build prints goes to stderr as it comes."""
    import docker

    repo = repo or IMAGE_REPO
    ensure_images(client, [base])
    # The base image's id, not its name: a base rebuilt under the same tag (the python3 image
    # that gained py-spy) must not reuse a workspace image built on the old one.
    tag = image_tag(context.digest, f"{base}@{client.images.get(base).id}", repo)
    try:
        client.images.get(tag)
        return tag  # same workspace, same base: the image is already there
    except docker.errors.ImageNotFound:
        pass
    steps: list[str] = []
    # The low-level build: its events arrive as the build runs (images.build returns them at
    # the end), so a long build shows its progress.
    events = client.api.build(
        # A generator: sent in chunks as it is read (chunked transfer), never whole in memory.
        fileobj=context.chunks(),
        custom_context=True,
        dockerfile=dockerfile,
        tag=tag,
        buildargs={"IMAGE": base},
        pull=False,
        rm=True,
        forcerm=True,
        decode=True,
    )
    for event in events:
        line = str(event.get("stream", "")).rstrip()
        if line.startswith("Step "):
            steps.append(line)
        if line and not quiet:
            print(f"xrun: docker build: {line}", file=sys.stderr, flush=True)
        if "error" in event:
            at = f" at {steps[-1]!r}" if steps else ""
            name = dockerfile.removeprefix("workspace/")
            raise UsageError(
                f"building the workspace image from {workspace!r} on {base!r} failed{at}: "
                f"{str(event['error']).strip()}; fix {name} (its build context holds "
                f"workspace/ and xrun/; build arg IMAGE is the role's image) or the image"
            )
    prune_workspace_images(client, repo=repo)
    return tag


def prune_workspace_images(
    client: Any, keep: int = KEEP_WORKSPACE_IMAGES, repo: str = IMAGE_REPO
) -> None:
    """Untag all but the newest ``keep`` workspace images of ``repo``. The engine refuses to
    delete one a container still uses (that one stays), and only the tag goes when another tag
    shares it."""
    import docker

    images = client.images.list(name=repo)
    images.sort(key=lambda im: str(im.attrs.get("Created", "")), reverse=True)
    for im in images[keep:]:
        for tag in im.tags:
            if tag.startswith(repo + ":"):
                try:
                    client.images.remove(tag)
                except docker.errors.APIError:
                    pass  # in use by a container, or removed by another process meanwhile


def image_pythonpath(client: Any, image: str) -> str:
    """The ``PYTHONPATH`` an image's own ENV sets ('' for none)."""
    env = (client.images.get(image).attrs.get("Config") or {}).get("Env") or []
    return next((e.split("=", 1)[1] for e in env if e.startswith("PYTHONPATH=")), "")


# --------------------------------------------------------------------------- containers
def create_args(
    client: Any, job: DockerJob, c: DockerContainer, image_path: str = ""
) -> dict[str, Any]:
    """``client.containers.create`` keyword arguments for one container of the request;
    ``image_path``: its image's PYTHONPATH, which ``c.pythonpath_tail`` is appended to."""
    from docker.types import DeviceRequest, Mount

    env = c.env
    if c.pythonpath_tail:
        env = {**env, "PYTHONPATH": ":".join(p for p in (image_path, *c.pythonpath_tail) if p)}
    args: dict[str, Any] = {
        "image": c.image,
        "entrypoint": [c.command[0]],
        "command": c.command[1:],
        "name": c.name,
        "hostname": c.name,
        "environment": env,
        # The SDK cannot set a container's StopTimeout; a label keeps the app's stop_timeout
        # with the container, so a cancel from any process honours it.
        "labels": {**c.labels, LABEL_STOP_TIMEOUT: str(c.stop_timeout)},
        # tini as PID 1 forwards SIGTERM to the agent: a Python PID 1 ignores it, and every
        # stop would then wait the whole timeout.
        "init": True,
        "network": job.network,
        # Docker 20.10 adds the name as an alias by itself; podman needs it said.
        "networking_config": {job.network: client.api.create_endpoint_config(aliases=[c.name])},
        "ports": {f"{p}/tcp": None for p in c.ports},
        "mounts": [
            Mount(
                target=m.dst_path,
                source=m.src_path if isinstance(m, BindMount) else m.src,
                type="bind" if isinstance(m, BindMount) else "volume",
                read_only=m.read_only,
            )
            for m in c.mounts
        ],
        "devices": c.devices,
        "privileged": c.privileged,
        "cap_add": c.cap_add,
    }
    if c.nano_cpus:
        args["nano_cpus"] = c.nano_cpus
    if c.mem_limit:
        args["mem_limit"] = c.mem_limit
    if c.shm_size:
        args["shm_size"] = c.shm_size
    if c.gpus:
        args["device_requests"] = [DeviceRequest(count=c.gpus, capabilities=[["gpu"]])]
    policy = c.restart_policy()
    if policy:
        args["restart_policy"] = policy
    return args
