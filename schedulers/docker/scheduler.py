"""The ``docker`` scheduler: one container per replica on a private network of its own.

``xrun run -s docker dist.ddp -j 2x2 --script train.py`` creates a user-defined bridge network
named after the app id and one container per replica, named ``<app_id>-<role>-<i>`` (also its
hostname and network alias). Every container gets ``XRUN_RANK0_HOST`` = its role's replica-0
name, which the dist.ddp command line uses as the rendezvous host.

Gang semantics: a replica that fails for good fails the app and the others are stopped, except
in an elastic role (``min_replicas < num_replicas``, e.g. ``-j 1:3x8``), which may lose replicas
down to ``max(min_replicas, 1)``: the survivors carry on (dist.ddp's agents re-form the group
without the lost node) and the app succeeds if they do, as on local_cwd. Each container carries
its role's allowance in a label, so any process can judge.

Who enforces them: there is no daemon of ours, so every :meth:`describe` (``xrun run``
polls it while it waits; ``xrun status`` calls it from any shell) reconciles. When it sees the
end -- a replica failed beyond its role's allowance (others are then stopped), all ended
otherwise, or a cancel -- it
copies every replica's logs to the state dir (see :mod:`xrun.schedulers.docker.statedir`), records
the terminal status there, and removes the containers and the network. Logs and status stay
readable after that from the state dir. So that this happens with nobody watching too,
``schedule()`` starts a detached watcher per app (:mod:`xrun.schedulers.docker.watch`).

Retries: a role's ``max_retries`` N means N+1 attempts in all, with one owner. A ``dist.*``
role's runtime agent restarts its workers in place (``--max-restarts N``) and the container
gets no restart policy; any other role (``utils.sh``, a TorchX torchrun AppDef) gets the
engine's ``--restart on-failure:N``, as with TorchX.

Signals, the grace period and exit codes (tests/schedulers/docker/test_signals.py): every container runs
with ``--init``, so tini (PID 1) forwards a SIGTERM to the replica's command. For ``dist.ddp``
that is the runtime agent, which forwards it to its workers' process groups, SIGKILLs those
still alive after its shutdown timeout (``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``, default 30 s) and
exits 143 (128 + SIGTERM).

- ``cancel`` (and the stop of the survivors when a replica failed) is ``docker stop`` with the
  app's ``stop_timeout`` run option (default :data:`STOP_TIMEOUT`, kept in a label of each
  container): the engine SIGKILLs whatever still runs in a container that long after the
  SIGTERM, and that replica exits 137. A worker's grace period is therefore
  ``min(agent shutdown timeout, stop_timeout)``; with dist.ddp's defaults it is 10 s.
  The app ends CANCELLED, and so does every replica the cancel found running, whatever its exit
  code: 143, 137, or 1 from a dist.ddp agent that saw a stopped peer close the rendezvous
  before its own SIGTERM arrived (it SIGTERMs its workers all the same).
- A SIGTERM from outside xrun to one container (``docker stop``/``docker kill``, a node drain)
  is that replica's failure: it exits 143 and the app ends FAILED. The other dist.ddp agents of
  a fixed-size job see the rendezvous closed, SIGTERM their workers and exit 1 (FAILED too); a
  replica still running when xrun notices the failure is stopped as by a cancel (CANCELLED).

The docker SDK is imported on first use of the engine: ``--dryrun`` needs neither the SDK nor
an engine.

The pieces, in this package: ``request`` (AppDef -> DockerJob, the value --dryrun prints; the
status rules), ``workspace`` (the image build context), ``engine`` (the SDK calls), ``statedir``
(what is kept on disk per app), ``status`` (reading containers), ``watch`` (the detached
watcher's entry point).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import string
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xrun.contract import TOKEN_ENV
from xrun.errors import AppNotFoundError, SchedulerError, UsageError
from xrun.specs import AppDef, AppState, Role, is_terminal

from ..api import (
    AppDryRunInfo,
    DescribeAppResponse,
    ListAppResponse,
    LogQuery,
    Scheduler,
    WorkspaceBuilder,
    runopts,
)
from ..workspace import Workspace, check_scripts, script_problem
from .engine import (
    build_image,
    connect,
    create_args,
    engine_errors,
    ensure_images,
    image_pythonpath,
    parallel,
)
from .options import STOP_TIMEOUT, DockerOptions
from .request import (
    LABEL_APP,
    LABEL_APP_ID,
    LABEL_REPLICA,
    LABEL_ROLE,
    LABEL_SESSION,
    LABEL_STOP_TIMEOUT,
    DockerJob,
    format_job,
    make_app_id,
    materialize,
    replica_state,
)
from .statedir import DamagedRecord, StateDir, replicas_from_json, replicas_to_json
from .status import (
    containers_app_state,
    end_message,
    job_from_containers,
    role_statuses,
    split_lines,
)
from .workspace import CUSTOM_DOCKERFILE, IMAGE_REPO, WORKDIR, build_context

if TYPE_CHECKING:
    from ..stacks import NodeStacks

# The watcher's module (watch.py), run by this interpreter with -m: it imports the same xrun.
WATCH_MODULE = "xrun.schedulers.docker.watch"


def start_watcher(app_id: str, session: str) -> None:
    """Start the watcher for ``app_id``, detached (it outlives the CLI that submitted)."""
    import subprocess  # lazy: only a real submit needs it, not --dryrun

    subprocess.Popen(
        [sys.executable, "-m", WATCH_MODULE, app_id, session],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
        env=os.environ.copy(),
    )


def being_removed(e: Any) -> bool:
    """The engine's answer about a container that is gone or going: 404, or 409 "dead or
    marked for removal" (asked for its logs while ``docker rm`` runs)."""
    import docker

    if isinstance(e, docker.errors.NotFound):
        return True
    text = str(getattr(e, "explanation", "") or e)
    return getattr(e, "status_code", None) == 409 and "removal" in text


def stop_timeout(attrs: Mapping[str, Any]) -> int:
    """The stop timeout a container was created with (the app's ``stop_timeout`` run option)."""
    value = ((attrs.get("Config") or {}).get("Labels") or {}).get(LABEL_STOP_TIMEOUT, "")
    return int(value) if str(value).isdigit() else STOP_TIMEOUT


def check_image_scripts(app: AppDef, ws: Workspace) -> None:
    """Each role's ``--script`` is in the workspace the image is built from (N11: it would
    otherwise only fail as the app), unless the workspace's own ``Dockerfile.xrun`` builds
    the image: where that puts the files is its own business."""
    if script_problem(ws, CUSTOM_DOCKERFILE) is None:
        return
    check_scripts(app, ws, f"the image runs a copy of it, in {WORKDIR}", "in the image")


class DockerScheduler(WorkspaceBuilder, Scheduler[DockerJob]):
    backend = "docker"

    def __init__(self, session_name: str, state_dir: str | None = None) -> None:
        super().__init__(session_name)
        self._state_dir = StateDir(Path(state_dir) if state_dir else None)
        self.__client: Any = None

    # ------------------------------------------------------------------ engine
    def _client(self) -> Any:
        if self.__client is None:
            self.__client = connect()
        return self.__client

    @contextlib.contextmanager
    def _engine_errors(self) -> Iterator[Any]:
        """The client, with the engine's errors made one-line (see engine.engine_errors)."""
        client = self._client()
        with engine_errors():
            yield client

    def close(self) -> None:
        if self.__client is not None:
            self.__client.close()
            self.__client = None

    # ------------------------------------------------------------------ submit
    def run_opts(self) -> runopts[DockerOptions]:
        return runopts(DockerOptions)

    def _validate(self, app: AppDef, cfg: DockerOptions) -> None:
        for role in app.roles:
            if not role.image:
                raise UsageError(
                    f"role {role.name!r} has no image; the docker scheduler runs every replica in "
                    f"one (e.g. --image xrun-python:latest, built by scripts/docker-engine.sh image)"
                )

    def _submit_dryrun(
        self, app: AppDef, cfg: DockerOptions, workspace: Workspace | None = None
    ) -> AppDryRunInfo[DockerJob]:
        """The request, headed by the workspace :meth:`submit` would build into each image
        (its URL and ignore set, read as the build reads them), or that none is built."""
        alphabet = string.ascii_lowercase + string.digits
        app_id = make_app_id(app.name, "".join(secrets.choice(alphabet) for _ in range(8)))
        job = materialize(
            app, app_id, cfg, os.environ, self.session_name, xrun_in_image=workspace is not None
        )
        if workspace is not None:
            check_image_scripts(app, workspace)
            head = (
                # the repository submit tags the images in (B14: it said xrun-workspace always)
                f"# workspace {workspace.url} -> each image below, as "
                f"{cfg.image_repo or IMAGE_REPO}:<hash>\n"
                f"#   {workspace.describe_ignored()}\n"
            )
        else:
            head = "# no workspace (--workspace ''): the role images run unchanged\n"
        return AppDryRunInfo(job, lambda j: head + format_job(j))

    def submit(
        self, app: AppDef, cfg: Mapping[str, object], workspace: Workspace | str | None = None
    ) -> str:
        """Build the workspace into the role images (none: they run unchanged), then schedule
        the request made from the built images."""
        ws = self.open_workspace(workspace)
        opts = self._checked(app, cfg)
        if ws is not None:
            check_image_scripts(app, ws)  # before a build, which takes a while
            self.build_workspace(app.roles, ws, opts)
        return self.schedule(self._stamped(self._submit_dryrun(app, opts, ws), app, opts))

    def build_workspace(
        self, roles: Iterable[Role], workspace: Workspace, cfg: DockerOptions
    ) -> None:
        """Build ``<role image> + workspace + xrun`` and point the roles at it (see .workspace)."""
        context, dockerfile = build_context(workspace)
        built: dict[str, str] = {}
        with self._engine_errors() as client:
            for role in roles:
                if role.image not in built:
                    built[role.image] = build_image(
                        client, context, dockerfile, role.image, workspace.given or workspace.url,
                        cfg.image_repo, cfg.quiet,
                    )  # fmt: skip
                role.image = built[role.image]

    def schedule(self, dryrun_info: AppDryRunInfo[DockerJob]) -> str:
        with self._engine_errors() as client:
            return self._schedule(client, dryrun_info.request)

    def _schedule(self, client: Any, job: DockerJob) -> str:
        import docker

        ensure_images(client, [c.image for c in job.containers])
        # once per image that a container appends to (DockerContainer.pythonpath_tail)
        tails = {c.image for c in job.containers if c.pythonpath_tail}
        paths = {image: image_pythonpath(client, image) for image in tails}
        labels = {LABEL_APP: job.app_name, LABEL_APP_ID: job.app_id, LABEL_SESSION: job.session}
        network = client.networks.create(job.network, driver="bridge", labels=labels)
        created: list[Any] = []
        try:
            # A per-app secret for the rendezvous store. It is made here, not in the request
            # value, so that --dryrun and the saved job never show it.
            token = secrets.token_hex(16)
            for spec in job.containers:
                args = create_args(client, job, spec, paths.get(spec.image, ""))
                args["environment"] = {**args["environment"], TOKEN_ENV: token}
                created.append(client.containers.create(**args))
            # Written once every container exists: from here on a missing container means
            # someone removed it, not that schedule() is still busy.
            self._state_dir.save_job(job.app_id, job.to_dict())
            parallel(lambda c: c.start(), created)
        except docker.errors.APIError as e:
            # Nothing of a half-started app may stay behind (e.g. a bind mount whose source
            # does not exist fails at start, after the first replicas already run).
            parallel(lambda c: c.remove(force=True), created)
            network.remove()
            self._state_dir.forget(job.app_id)
            raise SchedulerError(
                f"docker refused app {job.app_id}: {e.explanation or e}; nothing was left running"
            ) from None
        start_watcher(job.app_id, self.session_name)
        return job.app_id

    # ------------------------------------------------------------------ status
    def _containers(self, app_id: str) -> list[Any]:
        """The app's containers, each inspected. The SDK lists, then inspects one by one: a
        container removed in between (another process finalising the app) is a NotFound,
        which the callers take as "someone is finalising: wait for the record"."""
        return list(
            self._client().containers.list(all=True, filters={"label": f"{LABEL_APP_ID}={app_id}"})
        )

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        final = self._state_dir.load_final(app_id)
        if final is not None:
            if not final.get("cleaned", True):
                # Recorded, but the finaliser is still removing the containers: wait for it
                # (its lock), so a caller that sees the end never sees what is left of it.
                return self._finalize(app_id)
            return self._from_final(app_id, final)  # no engine needed for an ended app
        with self._engine_errors():
            import docker  # here: a missing SDK is _client()'s usage error, not an ImportError

            try:
                return self._describe_live(app_id)
            except docker.errors.APIError as e:
                if not being_removed(e):
                    raise
                # A container vanished under us: another reader (another shell, the watcher)
                # is finalising the app. Every concurrent reader must get the final state, so
                # wait for that finaliser's lock and read its record.
                return self._finalize(app_id)

    def _describe_live(self, app_id: str) -> DescribeAppResponse | None:
        containers = self._containers(app_id)
        if not containers:
            if (
                self._state_dir.load_final(app_id) is not None
                or self._state_dir.load_job(app_id) is not None
            ):
                # Finalised meanwhile by another process, or removed behind our back.
                return self._finalize(app_id)
            return None
        state = containers_app_state(containers, self._state_dir.is_cancelled(app_id))
        if is_terminal(state):
            return self._finalize(app_id)
        return self._live(app_id, containers, state)

    def _live(self, app_id: str, containers: list[Any], state: AppState) -> DescribeAppResponse:
        return DescribeAppResponse(
            app_id=app_id,
            state=state,
            num_restarts=max(int(c.attrs.get("RestartCount") or 0) for c in containers),
            roles_statuses=role_statuses(containers, stopped=set()),
            roles=self._roles(app_id, containers),
        )

    def _finalize(self, app_id: str) -> DescribeAppResponse:
        """Stop what still runs, keep the logs and the status, remove containers and network.

        Serialised by a file lock: the first caller does the work, later ones read its record.
        """
        with self._state_dir.lock(app_id):
            final = self._state_dir.load_final(app_id)
            if final is not None:
                if not final.get("cleaned", True):  # a finaliser died before cleaning up
                    self._remove_app(app_id, self._settled_containers(app_id))
                    self._state_dir.save_final(app_id, {**final, "cleaned": True})
                return self._from_final(app_id, final)
            containers = self._settled_containers(app_id)
            before = {c.name: replica_state(c.attrs)[0] for c in containers}
            cancelled = self._state_dir.is_cancelled(app_id)
            state = containers_app_state(containers, cancelled, before)
            if not containers:
                state = AppState.FAILED
            elif not is_terminal(state):
                return self._live(app_id, containers, state)  # e.g. a replica is being restarted
            alive = [
                c for c in containers if before[c.name] in (AppState.RUNNING, AppState.PENDING)
            ]
            # Each container carries its app's stop_timeout (a label, set at create).
            parallel(lambda c: c.stop(timeout=stop_timeout(c.attrs)), alive)
            for c in alive:
                c.reload()
            stopped = {c.name for c in alive}
            for c in containers:
                role, k = c.labels[LABEL_ROLE], int(c.labels[LABEL_REPLICA])
                for stream in ("stdout", "stderr"):
                    data = c.logs(
                        stdout=stream == "stdout", stderr=stream == "stderr", timestamps=True
                    )
                    self._state_dir.save_log(app_id, role, k, stream, data)
            roles = role_statuses(containers, stopped)
            msg = end_message(app_id, state, roles, self._state_dir, containers_gone=not containers)
            record = {
                "state": state.name,
                "num_restarts": max(
                    (int(c.attrs.get("RestartCount") or 0) for c in containers), default=0
                ),
                "msg": msg,
                "roles": replicas_to_json(roles),
                "cleaned": False,  # True once the containers and the network are gone
            }
            if self._state_dir.load_job(app_id) is None and containers:
                # Submitted from elsewhere: keep what `xrun log`/`describe` need after cleanup.
                self._state_dir.save_job(app_id, job_from_containers(app_id, containers))
            self._state_dir.save_final(app_id, record)
            self._remove_app(app_id, containers)
            record["cleaned"] = True
            self._state_dir.save_final(app_id, record)
        return self._from_final(app_id, record)

    def _remove_app(self, app_id: str, containers: list[Any]) -> None:
        """Remove the app's containers and its network (the lock held)."""
        parallel(lambda c: c.remove(force=True), containers)
        for net in self._client().networks.list(filters={"label": f"{LABEL_APP_ID}={app_id}"}):
            net.remove()

    def _settled_containers(self, app_id: str) -> list[Any]:
        """The app's containers, listed again while one vanishes mid-listing (under the lock
        only something outside xrun, a `docker rm`, removes them; a few tries settle it)."""
        import docker

        for _ in range(4):
            try:
                return self._containers(app_id)
            except docker.errors.NotFound:
                continue
        return self._containers(app_id)

    def _from_final(self, app_id: str, final: dict[str, Any]) -> DescribeAppResponse:
        roles = replicas_from_json(final.get("roles", []))
        # the first failed replica's root cause, as its runtime agent named it
        errors = (rep.structured_error_msg for r in roles for rep in r.replicas)
        return DescribeAppResponse(
            app_id=app_id,
            state=AppState[final["state"]],
            num_restarts=int(final.get("num_restarts", 0)),
            msg=str(final.get("msg", "")),
            structured_error_msg=next((e for e in errors if e), ""),
            roles_statuses=roles,
            roles=self._roles(app_id),
        )

    def _roles(self, app_id: str, containers: list[Any] | None = None) -> list[Role]:
        """The app's roles from ``job.json``, or, for an app submitted from another machine or
        state dir, from its containers' labels and config."""
        job = self._state_dir.load_job(app_id) or job_from_containers(app_id, containers or [])
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

    def stacks(self, app_id: str, timeout: float = 10.0) -> Sequence[NodeStacks]:
        """Each running agent's answer, asked inside its container (see .stacks)."""
        from .stacks import gather_stacks

        with self._engine_errors():
            containers = self._containers(app_id)
        if not containers:
            raise AppNotFoundError(f"docker app {app_id!r} has no containers (ended or unknown)")
        return gather_stacks(containers, timeout)

    def cancel(self, app_id: str) -> None:
        if self._state_dir.load_final(app_id) is not None:
            return  # already ended: cancelling changes nothing
        with self._engine_errors():
            import docker  # (after _client(), as in describe)

            try:
                self._cancel(app_id)
            except docker.errors.APIError as e:  # being finalised by another process: it ended
                if not being_removed(e):
                    raise
                self._finalize(app_id)

    def _cancel(self, app_id: str) -> None:
        containers = self._containers(app_id)
        if not containers and self._state_dir.load_job(app_id) is None:
            raise AppNotFoundError(f"docker app {app_id!r} not found (see `xrun list -s docker`)")
        state = containers_app_state(containers, False)
        if not is_terminal(state):
            # Before any stop: a replica killed by this cancel must read as CANCELLED.
            self._state_dir.mark_cancelled(app_id)
        self._finalize(app_id)

    # ------------------------------------------------------------------ logs
    def logs(self, app_id: str, query: LogQuery) -> Iterable[str]:
        role_name, k = query.role, query.k
        names = query.stream_names()
        return query.filter(
            self._log_lines(app_id, role_name, k, names, query.since, query.until, query.follow)
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

        if not self._state_dir.has_logs(app_id, role, k):
            with self._engine_errors() as client:
                labels = [
                    f"{LABEL_APP_ID}={app_id}",
                    f"{LABEL_ROLE}={role}",
                    f"{LABEL_REPLICA}={k}",
                ]
                chunks = None
                try:
                    found = client.containers.list(all=True, filters={"label": labels})
                    if found:
                        chunks = found[0].logs(
                            stdout="stdout" in streams,
                            stderr="stderr" in streams,
                            stream=True,
                            follow=follow,
                            since=since,
                            until=until,
                        )
                except docker.errors.APIError as e:
                    if not being_removed(e):
                        raise
                    # A finaliser (another reader, the watcher) is removing the container: wait
                    # for it; it keeps the logs in the state dir before it removes anything.
                    self._finalize(app_id)
                if chunks is not None:
                    yield from split_lines(chunks)
                    return
        if self._state_dir.has_logs(app_id, role, k):
            yield from self._state_dir.read_logs(app_id, role, k, streams, since, until)
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
        labels = [LABEL_APP_ID, f"{LABEL_SESSION}={self.session_name}"]
        with self._engine_errors() as client:
            import docker  # (after _client(), as in describe)

            for attempt in range(5):  # an app finalised while we list: list again
                try:
                    containers = client.containers.list(all=True, filters={"label": labels})
                    break
                except docker.errors.NotFound:
                    if attempt == 4:
                        raise
        apps: dict[str, list[Any]] = {}
        for c in containers:
            apps.setdefault(c.labels[LABEL_APP_ID], []).append(c)
        out = []
        for app_id, cs in sorted(apps.items()):
            if self._state_dir.final_exists(app_id):
                continue  # ended; listed below from its record
            out.append(
                ListAppResponse(
                    app_id=app_id,
                    state=containers_app_state(cs, self._state_dir.is_cancelled(app_id)),
                    name=cs[0].labels.get(LABEL_APP, ""),
                    app_handle=f"docker://{self.session_name}/{app_id}",
                )
            )
        for app_id in self._state_dir.final_app_ids():
            try:
                final = self._state_dir.load_final(app_id) or {}
                job = self._state_dir.load_job(app_id) or {}
            except DamagedRecord:  # `status` names it; the other apps still list
                final, job = {}, {}
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


def create_scheduler(session_name: str, **kwargs: Any) -> DockerScheduler:
    return DockerScheduler(session_name, **kwargs)
