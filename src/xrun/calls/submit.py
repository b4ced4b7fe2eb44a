"""The caller's side of ``xrun.submit``: a Python callable as a job of any scheduler.

The call (function, arguments) is pickled with cloudpickle into a fresh folder of its own
(``<folder>/<name>-<id>/call.pkl``, see :mod:`xrun.calls.files`), and submitted as
``dist.ddp -m xrun.calls.worker FOLDER MAX_BYTES``: each replica runs xrun's runtime agent,
each rank the worker, with torchrun's env (RANK, WORLD_SIZE, MASTER_ADDR, ...). The outcome
comes back as a file in the same folder, which the scheduler's replicas must see: on local_cwd
and Slurm the folder's path is the same everywhere (a shared filesystem on a real cluster); on
Docker it is bind-mounted at the same path.

Functions are pickled by value when the workers might not import them: cloudpickle does so for
``__main__`` (a script, a notebook), lambdas and closures; xrun adds the function's own module
when it is the user's code (a file outside the interpreter's prefix: not the standard library,
not an installed package), so a function of ``experiments.py`` runs where that file is not.
"""

from __future__ import annotations

import functools
import inspect
import os
import re
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

from xrun.calls.files import ARGS_FILE, CALL_FILE, DEFAULT_MAX_BYTES, dump
from xrun.calls.job import DebugJob, Job, default_runner
from xrun.errors import UsageError
from xrun.specs import macros
from xrun.specs.jobspec import parse_j
from xrun.xdg import state_dir

if TYPE_CHECKING:
    from xrun.runner import Runner
    from xrun.specs import AppDef

R = TypeVar("R")

WORKER_MODULE = "xrun.calls.worker"
DEBUG = "debug"

# dist.ddp's own options that submit sets itself: the rest (cpu, memMB, h, env, mounts, tee,
# rdzv_backend, stall_timeout, ...) pass through as keyword arguments.
_OWN = {"script_args", "script", "m"}


def _component_options() -> dict[str, inspect.Parameter]:
    from xrun.components.dist import ddp

    params = inspect.signature(ddp).parameters
    return {k: p for k, p in params.items() if k not in _OWN and p.kind == p.KEYWORD_ONLY}


def _name_of(fn: Callable[..., Any]) -> str:
    target = fn.func if isinstance(fn, functools.partial) else fn
    name = getattr(target, "__name__", None) or type(target).__name__
    cleaned = re.sub(r"[^A-Za-z0-9_.-]", "-", name).strip("_.-")
    return cleaned[:40] or "call"


def _user_module(fn: Callable[..., Any]) -> ModuleType | None:
    """The module to pickle by value with ``fn``: its own, when that is the user's code."""
    target = fn.func if isinstance(fn, functools.partial) else fn
    modname = getattr(target, "__module__", None) or type(target).__module__
    mod = sys.modules.get(modname or "")
    if mod is None or modname in ("__main__", "builtins") or modname.startswith("xrun."):
        return None  # __main__ goes by value anyway; xrun's own is in every job
    path = getattr(mod, "__file__", None)
    if not path:
        return None
    path = os.path.realpath(path)
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    if any(path.startswith(p + os.sep) for p in prefixes) or "site-packages" in path:
        return None
    return mod


@contextmanager
def _by_value(mod: ModuleType | None) -> Iterator[None]:
    import cloudpickle

    if mod is None or mod.__name__ in cloudpickle.list_registry_pickle_by_value():
        yield
        return
    cloudpickle.register_pickle_by_value(mod)
    try:
        yield
    finally:
        cloudpickle.unregister_pickle_by_value(mod)


def _filename(fn: Callable[..., Any]) -> str | None:
    """The file of ``fn``'s code, or of a callable object's ``__call__``."""
    target = fn.func if isinstance(fn, functools.partial) else fn
    code = getattr(target, "__code__", None) or getattr(type(target).__call__, "__code__", None)
    return getattr(code, "co_filename", None)


def _check_callable(fn: object) -> None:
    if not callable(fn):
        raise UsageError(
            f"xrun.submit: fn {fn!r} (a {type(fn).__name__}) is not callable; expected a "
            "function or another callable, then its arguments: xrun.submit(fn, *args, ...)"
        )


def _folder(folder: str | os.PathLike[str] | None, name: str) -> Path:
    root = Path(folder) if folder is not None else Path(state_dir("calls"))
    call = root.absolute() / f"{name}-{uuid.uuid4().hex[:12]}"
    try:
        call.mkdir(parents=True, mode=0o700)
    except OSError as e:
        raise UsageError(f"xrun.submit: folder {str(root)!r} is not usable: {e}") from None
    return call


class Executor:
    """Where and how calls run, set once; then :meth:`submit` and :meth:`map_array` as
    submitit's executors have them: ``Executor(scheduler="slurm", j="2x4", cpu=8)``, then
    ``job = ex.submit(fn, *args, **kwargs)`` (keyword arguments go to ``fn``, as in submitit)
    and ``jobs = ex.map_array(fn, xs)`` (one job array on Slurm). The settings are
    :func:`submit`'s; :meth:`update_parameters` changes them."""

    def __init__(  # noqa: PLR0913  (the API mirrors the CLI's options, as a component does)
        self,
        scheduler: str = "local_cwd",
        *,
        j: str = "1x1",
        all_ranks: bool = False,
        folder: str | os.PathLike[str] | None = None,
        cfg: Mapping[str, object] | None = None,
        workspace: str | None = None,
        max_result_bytes: int = DEFAULT_MAX_BYTES,
        max_parallel: int | None = None,
        runner: Runner | None = None,
        **options: Any,
    ) -> None:
        self.scheduler, self.j, self.all_ranks, self.folder = scheduler, j, all_ranks, folder
        self.cfg, self.workspace, self.max_result_bytes = cfg, workspace, max_result_bytes
        self.max_parallel, self.runner, self.options = max_parallel, runner, dict(options)
        self._check()

    def update_parameters(self, **params: Any) -> None:
        """Change settings (``j``, ``cfg``, ...) or dist.ddp options (``cpu``, ``memMB``, ...);
        UsageError, and nothing changed, for a bad one."""
        before = dict(vars(self)), dict(self.options)
        for key, value in params.items():
            if key in _SETTINGS:
                setattr(self, key, value)
            else:
                self.options[key] = value
        try:
            self._check()
        except UsageError:
            vars(self).update(before[0])
            self.options = before[1]
            raise

    def _check(self) -> None:
        """UsageError for a bad setting, before anything is pickled or submitted."""
        if self.scheduler == DEBUG:
            if self.j not in ("1", "1x1") or self.options or self.all_ranks:
                extra = sorted(self.options) + (["all_ranks"] if self.all_ranks else [])
                raise UsageError(
                    f"xrun.submit: scheduler='debug' calls fn once in this process; "
                    f"j={self.j!r} {'and ' + ', '.join(extra) + ' ' if extra else ''}do not "
                    "apply (expected j='1x1' and no component options)"
                )
            return
        known = _component_options()
        unknown = sorted(set(self.options) - set(known))
        if unknown:
            raise UsageError(
                f"xrun.submit: unknown option(s) {', '.join(unknown)}; expected dist.ddp's: "
                f"{', '.join(sorted(known))} (the function's keyword arguments go in kwargs=)"
            )
        limit = self.max_result_bytes
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise UsageError(
                f"xrun.submit: max_result_bytes={limit!r} is invalid; expected bytes >= 1"
            )
        parse_j(self.j)  # UsageError naming -j

    def _app(self, fn: Callable[..., Any], call: Path, name: str) -> tuple[AppDef, str | None]:
        from xrun.components.dist import ddp

        options = dict(self.options)
        mounts = list(options.pop("mounts", None) or [])
        workspace = self.workspace
        if self.scheduler == "docker":
            # The outcome comes back through the call's folder: the container sees it at the
            # same path (the worker is told the path on its command line).
            mounts.append(f"type=bind,src={call},dst={call}")
            workspace = workspace or _empty_workspace()
        options.setdefault("name", f"/{name}")
        # dist.ddp checks the rest (cpu, env, ...) before anything is pickled or submitted.
        argv = (str(call), str(self.max_result_bytes), macros.replica_id)
        return ddp(*argv, m=WORKER_MODULE, j=self.j, mounts=mounts, **options), workspace

    def _dump(self, obj: object, path: Path, fn: Callable[..., Any], what: str) -> None:
        try:
            with _by_value(_user_module(fn)):
                dump(obj, path, self.max_result_bytes, what)
        except UsageError:
            raise
        except Exception as e:
            raise UsageError(f"xrun.submit: {what} does not pickle: {e}") from e

    def _job(self, handle: str, call: Path, app: AppDef) -> Job[Any]:
        size = parse_j(self.j)
        fixed = size.min_nnodes == size.max_nnodes
        job: Job[Any] = Job(
            self.runner or default_runner(),
            handle,
            call,
            app.roles[0].name,
            all_ranks=self.all_ranks,
            max_bytes=self.max_result_bytes,
            nproc_per_node=size.nproc_per_node,
            world=size.max_nnodes * size.nproc_per_node if fixed else None,
            early=not self.options.get("max_retries"),
        )
        job.save()  # Job.attach(folder) finds it again from another process
        return job

    def submit(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> Job[R] | DebugJob[R]:
        """Run ``fn(*args, **kwargs)`` as one job; its :class:`Job` at once."""
        _check_callable(fn)
        if self.scheduler == DEBUG:
            return DebugJob(fn, args, kwargs)
        name = _name_of(fn)
        call = _folder(self.folder, name)
        try:
            app, workspace = self._app(fn, call, name)
            payload = _payload(fn, self.all_ranks, args=args, kwargs=kwargs)
            self._dump(payload, call / CALL_FILE, fn, f"the call of {name} (fn and its arguments)")
            runner = self.runner or default_runner()
            handle = runner.run(app, self.scheduler, self.cfg, workspace)
        except BaseException:
            _remove(call)
            raise
        return self._job(handle, call, app)

    def map_array(self, fn: Callable[..., R], /, *iterables: Iterable[Any]) -> list[Any]:
        """``fn(*args)`` for each ``args`` of ``zip(*iterables)``, all in ONE submission: a
        sweep of the scheduler (on Slurm one job array; elsewhere trials run at most
        ``max_parallel`` at once); one :class:`Job` per call, in order."""
        _check_callable(fn)
        calls = list(zip(*iterables, strict=False))
        if self.scheduler == DEBUG:
            return [DebugJob(fn, args, {}) for args in calls]
        if not calls:
            return []
        from xrun.sweeps.plan import MAX_TRIALS, Sweep, plan_from_app

        if len(calls) > MAX_TRIALS:
            raise UsageError(
                f"xrun.map_array: {len(calls):,} calls; one map_array runs at most "
                f"{MAX_TRIALS:,} (split it)"
            )
        name = _name_of(fn)
        call = _folder(self.folder, name)
        try:
            app, workspace = self._app(fn, call, name)
            self._dump(_payload(fn, self.all_ranks, map=True), call / CALL_FILE, fn, "the function")
            for i, args in enumerate(calls):
                (call / str(i)).mkdir()
                self._dump((args, {}), call / str(i) / ARGS_FILE, fn, f"the arguments of call {i}")
            sweep = Sweep(params={"call": [str(i) for i in range(len(calls))]})
            sweep.max_parallel = self.max_parallel
            runner = self.runner or default_runner()
            handle = runner.run_sweep(
                plan_from_app(app, sweep), None, self.scheduler, self.cfg, workspace
            )
        except BaseException:
            _remove(call)
            raise
        return [self._job(f"{handle}/{i}", call / str(i), app) for i in range(len(calls))]


_SETTINGS = (
    "scheduler",
    "j",
    "all_ranks",
    "folder",
    "cfg",
    "workspace",
    "max_result_bytes",
    "max_parallel",
    "runner",
)


def _payload(fn: Callable[..., Any], all_ranks: bool, **more: Any) -> dict[str, Any]:
    # filename: for the remote traceback's lines (worker._refile)
    return {"fn": fn, "all_ranks": all_ranks, "filename": _filename(fn), **more}


def submit(  # noqa: PLR0913  (the API mirrors the CLI's options, as a component does)
    fn: Callable[..., R],
    /,
    *args: Any,
    scheduler: str = "local_cwd",
    j: str = "1x1",
    kwargs: Mapping[str, Any] | None = None,
    all_ranks: bool = False,
    folder: str | os.PathLike[str] | None = None,
    cfg: Mapping[str, object] | None = None,
    workspace: str | None = None,
    max_result_bytes: int = DEFAULT_MAX_BYTES,
    runner: Runner | None = None,
    **options: Any,
) -> Job[R] | DebugJob[R]:
    """Run ``fn(*args, **kwargs)`` as a job of ``scheduler``; returns its :class:`Job` at once.

    ``j``: ``[[MIN:]NNODES x]NPROC`` as dist.ddp's ``-j``: every rank calls ``fn`` with
    torchrun's env; ``result()`` is rank 0's value, or every rank's with ``all_ranks``.
    ``scheduler="debug"``: call it in this process instead (a :class:`DebugJob`).
    ``folder``: where the call's folder is made (default ``$XDG_STATE_HOME/xrun/calls``; the
    scheduler's nodes must see it). ``cfg``: the scheduler's run options (``-cfg``);
    ``workspace``: as ``--workspace`` (docker: default, a fixed near-empty one, to carry xrun
    into the image). ``max_result_bytes``: the bound on the pickled call and on each rank's
    result. ``options``: dist.ddp's other options (``cpu``, ``memMB``, ``h``, ``env``,
    ``mounts``, ``max_retries``, ``name``, ``tee``, ...).
    """
    _check_callable(fn)
    ex = Executor(
        scheduler,
        j=j,
        all_ranks=all_ranks,
        folder=folder,
        cfg=cfg,
        workspace=workspace,
        max_result_bytes=max_result_bytes,
        runner=runner,
        **options,
    )
    return ex.submit(fn, *args, **dict(kwargs or {}))


def map_array(
    fn: Callable[..., R],
    /,
    *iterables: Iterable[Any],
    scheduler: str = "local_cwd",
    **settings: Any,
) -> list[Any]:
    """``Executor(scheduler, **settings).map_array(fn, *iterables)``: one submission, one
    :class:`Job` per call (on Slurm one job array)."""
    return Executor(scheduler, **settings).map_array(fn, *iterables)


def _remove(call: Path) -> None:
    import shutil

    shutil.rmtree(call, ignore_errors=True)


def _empty_workspace() -> str:
    """A folder with one small file, always the same: the docker scheduler builds xrun (and
    cloudpickle) into the image from it, and reuses that image while xrun is unchanged. (A
    folder with no file at all would leave the build context without its workspace/.)"""
    path = Path(state_dir("calls", "workspace"))
    path.mkdir(parents=True, exist_ok=True)
    readme = path / "README"
    text = "xrun.submit's default docker workspace: only xrun and cloudpickle go in the image.\n"
    if not readme.exists() or readme.read_text() != text:
        readme.write_text(text)
    return str(path)
