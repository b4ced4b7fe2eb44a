"""The one place where tests written for torch's launcher API meet xrun's runtime.

Tests import the launcher and elastic-multiprocessing names from here, never from torch or
xrun directly, so the same test runs against either implementation:

* ``XRUN_COMPAT_TARGET=xrun`` (the default, what CI runs): xrun's runtime;
* ``XRUN_COMPAT_TARGET=torch``: torch 2.13's own ``torch.distributed`` modules, to check that
  a test asserts what torch really does.

Every line that maps a name says why the names differ. ``EXCLUDED`` lists the tests of
PyTorch's own suite (kept outside this repository, see docs/runtime.md) that patch torch-internal
objects xrun has no counterpart for; a harness deselects them for the xrun target.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Any

__all__ = [
    "EXCLUDED",
    "RDZV_BACKEND",
    "TARGET",
    "CLI",
    "ChildFailedError",
    "DefaultLogsSpecs",
    "ErrorHandler",
    "LaunchConfig",
    "MultiprocessContext",
    "PContext",
    "ProcessFailure",
    "RdzvServer",
    "RunProcsResult",
    "SignalException",
    "Std",
    "_get_entrypoint_name",
    "_validate_full_rank",
    "_wrap",
    "elastic_launch",
    "excluded",
    "launch_agent",
    "record",
    "run",
    "start_processes",
    "to_map",
]

TARGET = os.environ.get("XRUN_COMPAT_TARGET", "xrun")
if TARGET not in ("xrun", "torch"):
    raise ValueError(f"XRUN_COMPAT_TARGET={TARGET!r}: expected xrun or torch")

# No etcd on the test machines: PyTorch's launcher API tests meet on a c10d endpoint instead.
RDZV_BACKEND = "c10d"
# The command line: torchrun's module, or xrun's agent.
CLI = [sys.executable, "-m", "torch.distributed.run" if TARGET == "torch" else "xrun.runtime"]

if TARGET == "torch":
    import torch.distributed.run as run
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, start_processes
    from torch.distributed.elastic.multiprocessing.api import (
        MultiprocessContext,
        PContext,
        RunProcsResult,
        SignalException,
        Std,
        _validate_full_rank,
        _wrap,
        to_map,
    )
    from torch.distributed.elastic.multiprocessing.errors import (
        ChildFailedError,
        ErrorHandler,
        ProcessFailure,
        record,
    )
    from torch.distributed.launcher.api import (
        LaunchConfig,
        _get_entrypoint_name,
        elastic_launch,
        launch_agent,
    )
else:
    from xrun.runtime import run  # torch.distributed.run: torchrun's main() as a library call
    from xrun.runtime.api import LaunchConfig, elastic_launch, launch_agent
    from xrun.runtime.api import entrypoint_name as _get_entrypoint_name  # a public name in xrun
    from xrun.runtime.errors import (
        ChildFailedError,
        ErrorHandler,
        ProcessFailure,
        SignalException,
        record,
    )
    from xrun.runtime.workers import (
        DefaultLogsSpecs,
        PContext,
        RunProcsResult,
        Std,
        start_processes,
        to_map,
    )
    from xrun.runtime.workers import check_full_rank as _validate_full_rank  # a public name in xrun

    # torch has one context class per entrypoint kind; xrun's one PContext serves both.
    MultiprocessContext = PContext
    # torch's per-worker multiprocessing target; xrun's (workers/child.py) takes other arguments,
    # so only the tests that EXCLUDED lists use it.
    _wrap: Any = None
    # torch keeps one TailLog thread per stream in ``_tail_logs``; xrun's one tee thread per
    # context answers the same ``stopped()``.
    PContext._tail_logs = property(lambda self: [self.tee])  # type: ignore[attr-defined]


class RdzvServer:
    """Stands in for torch's EtcdServer in PyTorch's launcher API tests: a c10d endpoint on a
    free localhost port (the first agent to arrive hosts the store there)."""

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("localhost", 0))
            self._port = int(s.getsockname()[1])

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def get_endpoint(self) -> str:
        return f"localhost:{self._port}"


# PyTorch's tests that patch torch-internal objects with no xrun counterpart (test id suffix ->
# why). They run against torch; for xrun the harness deselects them (never skips them).
_AGENT_MOCK = "patches torch's LocalElasticAgent; xrun's Agent is another class"
_EVENTS_MOCK = "asserts on a patched torch.distributed.elastic.events.record"
EXCLUDED: dict[str, str] = {
    "test_run.py::ElasticLaunchTest::test_nproc_gpu_launch_configurations": (
        "patches torch.cuda/torch.accelerator device counts; xrun counts GPUs without torch"
    ),
    "test_run.py::ElasticLaunchTest::test_nproc_xpu_launch_configurations": (
        "patches torch.xpu device counts; xrun counts NVIDIA GPUs only"
    ),
    "test_run.py::ElasticLaunchTest::test_launch_elastic_worker_raise_exception": _EVENTS_MOCK,
    "test_run.py::ElasticLaunchTest::test_launch_elastic_agent_raise_exception": _AGENT_MOCK,
    "test_run.py::ElasticLaunchTest::test_launch_shutdown": _AGENT_MOCK,
    "test_run.py::ElasticLaunchTest::test_is_torchelastic_launched_with_logs_spec_defined": (
        "patches torch.distributed.run.metadata (its entry-point lookup)"
    ),
    "api_test.py::ElasticLaunchTest::test_launch_elastic_worker_raise_exception": _EVENTS_MOCK,
    "api_test.py::ElasticLaunchTest::test_launch_elastic_agent_raise_exception": _AGENT_MOCK,
    "api_test.py::ElasticLaunchTest::test_launch_shutdown": _AGENT_MOCK,
    "api_test.py::ElasticLaunchTest::test_rdzv_handler_shutdown_on_agent_signal": _AGENT_MOCK,
    "api_test.py::ElasticLaunchTest::test_rdzv_handler_shutdown_on_agent_error": _AGENT_MOCK,
    "::test_wait_for_all_child_procs_to_exit": (
        "patches MultiprocessContext._pc/_is_done, torch's multiprocessing internals"
    ),
    "::test_multiprocessing_context_poll_raises_exception": (
        "patches MultiprocessContext._pc with torch.multiprocessing exceptions"
    ),
    "::test_wrap_bad": "calls torch's _wrap (its worker target); skipped under pytest on torch too",
    "::ApiTest::test_format_msg_enriches_root_signal_failure": (
        "patches torch's get_error_handler (a seam torch 2.13 does not have either)"
    ),
}


def excluded(nodeid: str) -> str | None:
    """Why the test ``nodeid`` is left out for xrun, or None when it runs."""
    for suffix, why in EXCLUDED.items():
        if nodeid.endswith(suffix):
            return why
    return None
