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
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

from xrun.calls.files import CALL_FILE, DEFAULT_MAX_BYTES, dump
from xrun.calls.job import DebugJob, Job
from xrun.errors import UsageError
from xrun.specs import macros
from xrun.specs.jobspec import parse_j
from xrun.xdg import state_dir

if TYPE_CHECKING:
    from xrun.runner import Runner

R = TypeVar("R")

WORKER_MODULE = "xrun.calls.worker"
DEBUG = "debug"

# dist.ddp's own options that submit sets itself: the rest (cpu, memMB, h, env, mounts, tee,
# rdzv_backend, stall_timeout, ...) pass through as keyword arguments.
_OWN = {"script_args", "script", "m"}

_runner: Runner | None = None


def default_runner() -> Runner:
    """One Runner for every job this process submits (its schedulers are cached)."""
    global _runner
    if _runner is None:
        from xrun.runner import get_runner

        _runner = get_runner()
    return _runner


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
    target = fn.func if isinstance(fn, functools.partial) else fn
    code = getattr(target, "__code__", None)
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


# The API mirrors the CLI's options (as a component's signature does): many keywords by design.
def submit(  # noqa: PLR0913
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
    ``workspace``: as ``--workspace`` (docker: default, an empty one, to carry xrun into the
    image). ``max_result_bytes``: the bound on the pickled arguments and on each rank's result.
    ``options``: dist.ddp's other options (``cpu``, ``memMB``, ``h``, ``env``, ``mounts``,
    ``max_retries``, ``name``, ``tee``, ...).
    """
    _check_callable(fn)
    kw = dict(kwargs or {})
    if scheduler == DEBUG:
        if j not in ("1", "1x1") or options or all_ranks:
            extra = sorted(options) + (["all_ranks"] if all_ranks else [])
            raise UsageError(
                f"xrun.submit: scheduler='debug' calls fn once in this process; j={j!r} "
                f"{'and ' + ', '.join(extra) + ' ' if extra else ''}do not apply "
                "(expected j='1x1' and no component options)"
            )
        return DebugJob(fn, args, kw)
    known = _component_options()
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise UsageError(
            f"xrun.submit: unknown option(s) {', '.join(unknown)}; expected dist.ddp's: "
            f"{', '.join(sorted(known))} (the function's keyword arguments go in kwargs=)"
        )
    if not isinstance(max_result_bytes, int) or max_result_bytes < 1:
        raise UsageError(
            f"xrun.submit: max_result_bytes={max_result_bytes!r} is invalid; expected bytes >= 1"
        )
    from xrun.components.dist import ddp

    name = _name_of(fn)
    call = _folder(folder, name)
    mounts = list(options.pop("mounts", None) or [])
    if scheduler == "docker":
        # The outcome comes back through the call's folder: the container sees it at the
        # same path (the worker is told the path on its command line).
        mounts.append(f"type=bind,src={call},dst={call}")
        workspace = workspace or _empty_workspace()
    options.setdefault("name", f"/{name}")
    # dist.ddp checks the rest (j, cpu, env, ...) before anything is pickled or submitted.
    args_ = (str(call), str(max_result_bytes), macros.replica_id)
    app = ddp(*args_, m=WORKER_MODULE, j=j, mounts=mounts, **options)
    payload = {
        "fn": fn,
        "args": args,
        "kwargs": kw,
        "all_ranks": all_ranks,
        "filename": _filename(fn),  # for the remote traceback's lines (worker._refile)
    }
    try:
        with _by_value(_user_module(fn)):
            dump(payload, call / CALL_FILE, max_result_bytes, "the call (fn and its arguments)")
    except Exception as e:
        _remove(call)
        if isinstance(e, UsageError):
            raise
        raise UsageError(f"xrun.submit: the call of {name} does not pickle: {e}") from e
    runner = runner or default_runner()
    try:
        handle = runner.run(app, scheduler, cfg, workspace)
    except BaseException:
        _remove(call)
        raise
    return Job(
        runner,
        handle,
        call,
        app.roles[0].name,
        all_ranks=all_ranks,
        max_bytes=max_result_bytes,
        nproc_per_node=parse_j(j).nproc_per_node,
    )


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
