"""The ``docker`` scheduler: one container per replica on a private network of its own.

``xrun run -s docker dist.ddp -j 2x2 --script train.py`` creates a user-defined bridge network
named after the app id and one container per replica, named ``<app_id>-<role>-<i>`` (also its
hostname and network alias). Every container gets ``XRUN_RANK0_HOST`` = its role's replica-0
name, which the dist.ddp command line uses as the rendezvous host.

Who enforces gang semantics: there is no daemon of ours, so every :meth:`describe` (``xrun run``
polls it while it waits; ``xrun status`` calls it from any shell) reconciles. When it sees the
end -- a replica failed for good (others are then stopped), all succeeded, or a cancel -- it
copies every replica's logs to the state dir (see :mod:`xrun.schedulers.docker_state`), records
the terminal status there, and removes the containers and the network. Logs and status stay
readable after that from the state dir. An app nobody asks about keeps its containers (running
or exited) until someone does.

The docker SDK is imported on first use of the engine: ``--dryrun`` needs neither the SDK nor
an engine.
"""

from __future__ import annotations

import contextlib
import io
import os
import secrets
import string
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from xrun.errors import AppNotFoundError, SchedulerError, UsageError
from xrun.schedulers.api import (
    AppDryRunInfo,
    CfgVal,
    DescribeAppResponse,
    ListAppResponse,
    Scheduler,
    Stream,
    filter_regex,
    runopts,
)
from xrun.schedulers.docker_request import (
    LABEL_APP,
    LABEL_APP_ID,
    LABEL_REPLICA,
    LABEL_ROLE,
    LABEL_SESSION,
    DockerContainer,
    DockerJob,
    app_state,
    format_job,
    make_app_id,
    materialize,
    replica_state,
)
from xrun.schedulers.docker_state import AppStateStore, replicas_from_json, replicas_to_json
from xrun.schedulers.docker_workspace import build_context, image_tag
from xrun.specs import AppDef, AppState, BindMount, ReplicaStatus, Role, RoleStatus, is_terminal

# Seconds a replica gets between SIGTERM (delivered by --init's tini to the agent) and SIGKILL.
STOP_TIMEOUT = 10
_DEFAULT_HOST = "unix:///var/run/docker.sock"
_X = TypeVar("_X")


def _parallel(fn: Callable[[_X], object], items: list[_X]) -> None:
    """Run ``fn`` over ``items`` in threads (starting/stopping 8 containers one by one is slow)."""
    if not items:
        return
    with ThreadPoolExecutor(max_workers=min(8, len(items))) as pool:
        for fut in [pool.submit(fn, it) for it in items]:
            fut.result()


class DockerScheduler(Scheduler[DockerJob]):
    backend = "docker"

    def __init__(self, session_name: str, state_dir: str | None = None) -> None:
        super().__init__(session_name)
        self._store = AppStateStore(Path(state_dir) if state_dir else None)
        self.__client: Any = None

    # ------------------------------------------------------------------ engine
    def _client(self) -> Any:
        if self.__client is not None:
            return self.__client
        try:
            import docker
        except ImportError:
            raise UsageError(
                "the docker scheduler needs the docker SDK: pip install 'xrun[docker]'"
            ) from None
        host = os.environ.get("DOCKER_HOST") or _DEFAULT_HOST
        try:
            client = docker.from_env()
            client.ping()
        except docker.errors.DockerException as e:
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise UsageError(
                f"cannot reach the Docker Engine at {host} (DOCKER_HOST) ({reason}); start one "
                f"(on a dev machine: scripts/docker-engine.sh up) or set DOCKER_HOST to a running one"
            ) from None
        self.__client = client
        return client

    @contextlib.contextmanager
    def _engine_errors(self) -> Iterator[Any]:
        """Yield the client; the engine's refusals become one-line SchedulerErrors (the CLI
        prints them without a traceback), a lost connection the same UsageError as no engine."""
        client = self._client()
        import docker
        import requests

        try:
            yield client
        except docker.errors.APIError as e:
            raise SchedulerError(f"the Docker Engine refused: {e.explanation or e}") from None
        except requests.exceptions.ConnectionError as e:
            host = os.environ.get("DOCKER_HOST") or _DEFAULT_HOST
            raise UsageError(
                f"lost the Docker Engine at {host} (DOCKER_HOST) ({e}); is it still running? "
                f"(on a dev machine: scripts/docker-engine.sh up)"
            ) from None

    def close(self) -> None:
        if self.__client is not None:
            self.__client.close()
            self.__client = None

    # ------------------------------------------------------------------ submit
    def run_opts(self) -> runopts:
        opts = runopts()
        opts.add(
            "copy_env",
            list,
            "glob patterns of the submitting shell's env vars to copy into every container, "
            "e.g. 'WANDB_*;HF_TOKEN'",
            default=[],
        )
        opts.add("env", dict, "extra env vars for every container, 'K1:V1;K2:V2'", default={})
        opts.add(
            "shm_size",
            str,
            "size of /dev/shm in every container (docker's own default, 64m, is too small for "
            "PyTorch data loaders)",
            default="1g",
        )
        opts.add("privileged", bool, "run the containers privileged", default=False)
        return opts

    def _validate(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> None:
        for role in app.roles:
            if not role.image:
                raise UsageError(
                    f"role {role.name!r} has no image; the docker scheduler runs every replica in "
                    f"one (e.g. --image xrun-python:latest, built by scripts/docker-engine.sh image)"
                )

    def _submit_dryrun(self, app: AppDef, cfg: dict[str, CfgVal]) -> AppDryRunInfo[DockerJob]:
        alphabet = string.ascii_lowercase + string.digits
        app_id = make_app_id(app.name, "".join(secrets.choice(alphabet) for _ in range(8)))
        job = materialize(app, app_id, cfg, os.environ, self.session_name)
        return AppDryRunInfo(job, format_job)

    def submit(self, app: AppDef, cfg: Mapping[str, object], workspace: str | None = None) -> str:
        """Like every scheduler's, except that no ``workspace`` means the cwd (as the issue asks:
        the job runs the code as it is now); pass ``""`` to run the role images unchanged."""
        return super().submit(app, cfg, os.getcwd() if workspace is None else workspace)

    def build_workspace(self, app: AppDef, workspace: str, cfg: Mapping[str, object]) -> None:
        """Build ``<role image> + workspace + xrun`` and point the roles at it (see docker_workspace)."""
        context, dockerfile = build_context(Path(workspace))
        built: dict[str, str] = {}
        with self._engine_errors() as client:
            for role in app.roles:
                if role.image not in built:
                    built[role.image] = self._build_image(
                        client, context, dockerfile, role.image, workspace
                    )
                role.image = built[role.image]

    def _build_image(
        self, client: Any, context: bytes, dockerfile: str, base: str, workspace: str
    ) -> str:
        import docker

        tag = image_tag(context, base)
        try:
            client.images.get(tag)
            return tag  # same workspace, same base: the image is already there
        except docker.errors.ImageNotFound:
            pass
        self._ensure_images(client, [base])
        try:
            client.images.build(
                fileobj=io.BytesIO(context),
                custom_context=True,
                dockerfile=dockerfile,
                tag=tag,
                buildargs={"IMAGE": base},
                pull=False,
                rm=True,
                forcerm=True,
            )
        except docker.errors.BuildError as e:
            tail = " | ".join(
                str(chunk.get("stream", chunk.get("error", ""))).strip()
                for chunk in list(e.build_log)[-4:]
                if isinstance(chunk, dict)
            )
            raise UsageError(
                f"building the workspace image from {workspace!r} on {base!r} failed: {e.msg} "
                f"(last output: {tail}); fix {dockerfile.removeprefix('workspace/')} or the image"
            ) from None
        return tag

    def _ensure_images(self, client: Any, images: Iterable[str]) -> None:
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

    def schedule(self, dryrun_info: AppDryRunInfo[DockerJob]) -> str:
        with self._engine_errors() as client:
            return self._schedule(client, dryrun_info.request)

    def _schedule(self, client: Any, job: DockerJob) -> str:
        import docker

        self._ensure_images(client, [c.image for c in job.containers])
        labels = {LABEL_APP: job.app_name, LABEL_APP_ID: job.app_id, LABEL_SESSION: job.session}
        network = client.networks.create(job.network, driver="bridge", labels=labels)
        created: list[Any] = []
        try:
            for spec in job.containers:
                created.append(client.containers.create(**self._create_args(client, job, spec)))
            # Written once every container exists: from here on a missing container means
            # someone removed it, not that schedule() is still busy.
            self._store.save_job(job.app_id, job.to_dict())
            _parallel(lambda c: c.start(), created)
        except docker.errors.APIError as e:
            # Nothing of a half-started app may stay behind (e.g. a bind mount whose source
            # does not exist fails at start, after the first replicas already run).
            _parallel(lambda c: c.remove(force=True), created)
            network.remove()
            self._store.forget(job.app_id)
            raise SchedulerError(
                f"docker refused app {job.app_id}: {e.explanation or e}; nothing was left running"
            ) from None
        return job.app_id

    def _create_args(self, client: Any, job: DockerJob, c: DockerContainer) -> dict[str, Any]:
        from docker.types import DeviceRequest, Mount

        args: dict[str, Any] = {
            "image": c.image,
            "entrypoint": [c.command[0]],
            "command": c.command[1:],
            "name": c.name,
            "hostname": c.name,
            "environment": c.env,
            "labels": c.labels,
            # tini as PID 1 forwards SIGTERM to the agent: a Python PID 1 ignores it, and every
            # stop would then wait the whole timeout.
            "init": True,
            "network": job.network,
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

    # ------------------------------------------------------------------ status
    def _containers(self, app_id: str) -> list[Any]:
        return list(
            self._client().containers.list(all=True, filters={"label": f"{LABEL_APP_ID}={app_id}"})
        )

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        final = self._store.load_final(app_id)
        if final is not None:
            return self._from_final(app_id, final)  # no engine needed for an ended app
        with self._engine_errors():
            return self._describe_live(app_id)

    def _describe_live(self, app_id: str) -> DescribeAppResponse | None:
        containers = self._containers(app_id)
        if not containers:
            if (
                self._store.load_final(app_id) is not None
                or self._store.load_job(app_id) is not None
            ):
                # Finalised meanwhile by another process, or removed behind our back.
                return self._finalize(app_id)
            return None
        states = [replica_state(c.attrs)[0] for c in containers]
        state = app_state(states, self._store.is_cancelled(app_id))
        if is_terminal(state):
            return self._finalize(app_id)
        return self._live(app_id, containers, state)

    def _live(self, app_id: str, containers: list[Any], state: AppState) -> DescribeAppResponse:
        return DescribeAppResponse(
            app_id=app_id,
            state=state,
            num_restarts=max(int(c.attrs.get("RestartCount") or 0) for c in containers),
            roles_statuses=_role_statuses(containers, stopped=set()),
            roles=self._roles(app_id, containers),
        )

    def _finalize(self, app_id: str) -> DescribeAppResponse:
        """Stop what still runs, keep the logs and the status, remove containers and network.

        Serialised by a file lock: the first caller does the work, later ones read its record.
        """
        with self._store.lock(app_id):
            final = self._store.load_final(app_id)
            if final is not None:
                return self._from_final(app_id, final)
            containers = self._containers(app_id)
            before = {c.name: replica_state(c.attrs)[0] for c in containers}
            cancelled = self._store.is_cancelled(app_id)
            state = app_state(list(before.values()), cancelled)
            if not containers:
                state = AppState.FAILED
            elif not is_terminal(state):
                return self._live(app_id, containers, state)  # e.g. a replica is being restarted
            alive = [
                c for c in containers if before[c.name] in (AppState.RUNNING, AppState.PENDING)
            ]
            _parallel(lambda c: c.stop(timeout=STOP_TIMEOUT), alive)
            for c in alive:
                c.reload()
            stopped = {c.name for c in alive}
            for c in containers:
                role, k = c.labels[LABEL_ROLE], int(c.labels[LABEL_REPLICA])
                for stream in ("stdout", "stderr"):
                    data = c.logs(
                        stdout=stream == "stdout", stderr=stream == "stderr", timestamps=True
                    )
                    self._store.save_log(app_id, role, k, stream, data)
            roles = _role_statuses(containers, stopped)
            msg = _end_message(app_id, state, roles, self._store, containers_gone=not containers)
            record = {
                "state": state.name,
                "num_restarts": max(
                    (int(c.attrs.get("RestartCount") or 0) for c in containers), default=0
                ),
                "msg": msg,
                "roles": replicas_to_json(roles),
            }
            if self._store.load_job(app_id) is None and containers:
                # Submitted from elsewhere: keep what `xrun log`/`describe` need after cleanup.
                self._store.save_job(app_id, _job_from_containers(app_id, containers))
            self._store.save_final(app_id, record)
            client = self._client()
            _parallel(lambda c: c.remove(force=True), containers)
            for net in client.networks.list(filters={"label": f"{LABEL_APP_ID}={app_id}"}):
                net.remove()
        return self._from_final(app_id, record)

    def _from_final(self, app_id: str, final: dict[str, Any]) -> DescribeAppResponse:
        return DescribeAppResponse(
            app_id=app_id,
            state=AppState[final["state"]],
            num_restarts=int(final.get("num_restarts", 0)),
            msg=str(final.get("msg", "")),
            roles_statuses=replicas_from_json(final.get("roles", [])),
            roles=self._roles(app_id),
        )

    def _roles(self, app_id: str, containers: list[Any] | None = None) -> list[Role]:
        """The app's roles from ``job.json``, or, for an app submitted from another machine or
        state dir, from its containers' labels and config."""
        job = self._store.load_job(app_id) or _job_from_containers(app_id, containers or [])
        roles: dict[str, Role] = {}
        for c in job.get("containers", []):
            if c["role"] not in roles:
                roles[c["role"]] = Role(
                    name=c["role"],
                    image=c["image"],
                    entrypoint=c["command"][0] if c["command"] else "",
                    args=list(c["command"][1:]),
                    num_replicas=0,
                )
            roles[c["role"]].num_replicas += 1
        return list(roles.values())

    def cancel(self, app_id: str) -> None:
        if self._store.load_final(app_id) is not None:
            return  # already ended: cancelling changes nothing
        with self._engine_errors():
            self._cancel(app_id)

    def _cancel(self, app_id: str) -> None:
        containers = self._containers(app_id)
        if not containers and self._store.load_job(app_id) is None:
            raise AppNotFoundError(f"docker app {app_id!r} not found (see `xrun list -s docker`)")
        state = app_state([replica_state(c.attrs)[0] for c in containers], False)
        if not is_terminal(state):
            # Before any stop: a replica killed by this cancel must read as CANCELLED.
            self._store.mark_cancelled(app_id)
        self._finalize(app_id)

    # ------------------------------------------------------------------ logs
    def log_iter(
        self,
        app_id: str,
        role_name: str,
        k: int = 0,
        regex: str | None = None,
        since: float | None = None,
        until: float | None = None,
        should_tail: bool = False,
        streams: Stream | None = None,
    ) -> Iterable[str]:
        names = {Stream.STDOUT: ["stdout"], Stream.STDERR: ["stderr"]}.get(
            streams or Stream.COMBINED, ["stdout", "stderr"]
        )
        return filter_regex(
            regex, self._log_lines(app_id, role_name, k, names, since, until, should_tail)
        )

    def _log_lines(
        self,
        app_id: str,
        role: str,
        k: int,
        streams: list[str],
        since: float | None,
        until: float | None,
        follow: bool,
    ) -> Iterator[str]:
        import docker

        if not self._store.has_logs(app_id, role, k):
            with self._engine_errors() as client:
                labels = [
                    f"{LABEL_APP_ID}={app_id}",
                    f"{LABEL_ROLE}={role}",
                    f"{LABEL_REPLICA}={k}",
                ]
                found = client.containers.list(all=True, filters={"label": labels})
                try:
                    if found:
                        chunks = found[0].logs(
                            stdout="stdout" in streams,
                            stderr="stderr" in streams,
                            stream=True,
                            follow=follow,
                            since=since,
                            until=until,
                        )
                        yield from _lines(chunks)
                        return
                except docker.errors.NotFound:
                    pass  # removed by a finaliser meanwhile: its logs are in the state dir now
        if self._store.has_logs(app_id, role, k):
            yield from self._store.read_logs(app_id, role, k, streams, since, until)
            return
        resp = self.describe(app_id)
        if resp is None:
            raise AppNotFoundError(f"docker app {app_id!r} not found (see `xrun list -s docker`)")
        valid = [f"{r.role}/{rep.id}" for r in resp.roles_statuses for rep in r.replicas]
        raise UsageError(
            f"docker app {app_id!r} has no replica {role}/{k}; valid: {', '.join(valid) or 'none'}"
        )

    # ------------------------------------------------------------------ list
    # Last in the class: below this point `list` would name the method, not the builtin.
    def list(self) -> list[ListAppResponse]:
        """This session's apps: those with containers, then those that ended (from the state dir)."""
        with self._engine_errors() as client:
            labels = [LABEL_APP_ID, f"{LABEL_SESSION}={self.session_name}"]
            containers = client.containers.list(all=True, filters={"label": labels})
        apps: dict[str, list[Any]] = {}
        for c in containers:
            apps.setdefault(c.labels[LABEL_APP_ID], []).append(c)
        out = []
        for app_id, cs in sorted(apps.items()):
            final = self._store.load_final(app_id)
            if final is not None:
                continue  # ended; listed below from its record
            states = [replica_state(c.attrs)[0] for c in cs]
            out.append(
                ListAppResponse(
                    app_id=app_id,
                    state=app_state(states, self._store.is_cancelled(app_id)),
                    name=cs[0].labels.get(LABEL_APP, ""),
                    app_handle=f"docker://{self.session_name}/{app_id}",
                )
            )
        for app_id in self._store.final_app_ids():
            final = self._store.load_final(app_id) or {}
            job = self._store.load_job(app_id) or {}
            if job.get("session", self.session_name) != self.session_name:
                continue
            out.append(
                ListAppResponse(
                    app_id=app_id,
                    state=AppState[final.get("state", "UNKNOWN")],
                    name=str(job.get("app_name", "")),
                    app_handle=f"docker://{self.session_name}/{app_id}",
                )
            )
        return out


def _lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """Whole lines ("\\n"-terminated, like a file's) from docker's arbitrarily cut chunks."""
    buf = b""
    for chunk in chunks:
        buf += chunk
        *done, buf = buf.split(b"\n")
        for line in done:
            yield line.decode("utf-8", "replace") + "\n"
    if buf:
        yield buf.decode("utf-8", "replace") + "\n"


def _job_from_containers(app_id: str, containers: list[Any]) -> dict[str, Any]:
    """``job.json``'s shape, rebuilt from the engine's view of the containers."""
    specs = []
    for c in sorted(containers, key=lambda c: c.name):
        config = c.attrs.get("Config") or {}
        specs.append(
            {
                "name": c.name,
                "role": c.labels[LABEL_ROLE],
                "replica_id": int(c.labels[LABEL_REPLICA]),
                "image": config.get("Image", ""),
                "command": list(config.get("Entrypoint") or []) + list(config.get("Cmd") or []),
            }
        )
    first = containers[0].labels if containers else {}
    return {
        "app_id": app_id,
        "app_name": first.get(LABEL_APP, ""),
        "session": first.get(LABEL_SESSION, ""),
        "containers": specs,
    }


def _role_statuses(containers: list[Any], stopped: set[str]) -> list[RoleStatus]:
    """Per-role replica statuses; a replica in ``stopped`` was stopped by xrun (CANCELLED)."""
    roles: dict[str, list[ReplicaStatus]] = {}
    for c in containers:
        state, code = replica_state(c.attrs)
        if c.name in stopped:
            state = AppState.CANCELLED
        role = c.labels[LABEL_ROLE]
        roles.setdefault(role, []).append(
            ReplicaStatus(
                id=int(c.labels[LABEL_REPLICA]),
                state=state,
                role=role,
                hostname=c.name,
                exit_code=code,
            )
        )
    return [
        RoleStatus(role=r, replicas=sorted(reps, key=lambda x: x.id))
        for r, reps in sorted(roles.items())
    ]


def _end_message(
    app_id: str,
    state: AppState,
    roles: list[RoleStatus],
    store: AppStateStore,
    containers_gone: bool,
) -> str:
    if containers_gone:
        return f"the containers of {app_id} are gone (removed outside xrun?)"
    if state == AppState.CANCELLED:
        return "cancelled"
    if state != AppState.FAILED:
        return ""
    parts = []
    for r in roles:
        for rep in r.replicas:
            if rep.state != AppState.FAILED:
                continue
            last = [
                line.rstrip("\n")
                for line in store.read_logs(app_id, r.role, rep.id, ["stderr"], None, None)
                if line.strip()
            ]
            hint = f" (last stderr line: {last[-1][:200]})" if last else ""
            parts.append(f"replica {r.role}/{rep.id} exited with code {rep.exit_code}{hint}")
    stopped = sum(rep.state == AppState.CANCELLED for r in roles for rep in r.replicas)
    tail = f"; stopped the other {stopped} replica(s)" if stopped else ""
    return "; ".join(parts) + tail


def create_scheduler(session_name: str, **kwargs: Any) -> DockerScheduler:
    return DockerScheduler(session_name, **kwargs)
