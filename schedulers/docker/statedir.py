"""What the docker scheduler keeps on disk, per app, under ``$XDG_STATE_HOME/xrun/docker/<app_id>``.

No daemon of ours watches a docker app, and a container's labels cannot change after it is
created, so the facts the engine cannot tell us live here:

- ``job.json``     the request, written once every container exists (marks the app as ours)
- ``cancelled``    written by ``cancel`` *before* it stops anything, so a replica killed by the
                   cancel reads as CANCELLED, never FAILED
- ``status.json``  the terminal status, written once by whoever first observes the end
- ``logs/<role>-<i>.stdout|.stderr``  each replica's output (docker timestamps kept), copied
                   before the containers are removed, so ``xrun log`` works after cleanup
- ``.lock``        serialises the finalisation between processes (``xrun run`` polling and an
                   ``xrun status`` from another shell may both see the end)

Nothing here imports the docker SDK.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import heapq
import json
import os
import re
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from xrun.errors import SchedulerError, UsageError
from xrun.specs import AppState, ReplicaStatus, RoleStatus
from xrun.xdg import state_dir

_APP_ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")


def default_root() -> Path:
    return Path(state_dir("docker"))


class StateDir:
    def __init__(self, root: Path | None = None) -> None:
        self.root = root or default_root()

    def dir(self, app_id: str) -> Path:
        # The id comes from a user's handle: never let it walk out of our directory.
        if not _APP_ID_RE.match(app_id):
            raise UsageError(
                f"docker app id {app_id!r} is malformed; expected lowercase letters, digits and "
                f"'-' (as printed by `xrun run -s docker`, e.g. docker://default/ddp-1a2b3c)"
            )
        return self.root / app_id

    # ---------------------------------------------------------------- records
    def _write(self, path: Path, text: str | bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        if isinstance(text, bytes):
            tmp.write_bytes(text)
        else:
            tmp.write_text(text)
        os.replace(tmp, path)

    def save_job(self, app_id: str, job: dict[str, Any]) -> None:
        self._write(self.dir(app_id) / "job.json", json.dumps(job, indent=1, default=str))

    def load_job(self, app_id: str) -> dict[str, Any] | None:
        """``job.json``, its shape checked (DamagedRecord), or None when there is none."""
        path = self.dir(app_id) / "job.json"
        job = _load_json(path)
        if job is None:
            return None
        containers = job.get("containers", [])
        if not isinstance(containers, list):
            raise DamagedRecord(path, "containers is not a list")
        for i, c in enumerate(containers):
            if not (
                isinstance(c, dict)
                and isinstance(c.get("role"), str)
                and isinstance(c.get("image"), str)
                and isinstance(c.get("command"), list)
                and all(isinstance(a, str) for a in c["command"])
            ):
                raise DamagedRecord(path, f"containers[{i}] is not a container's record")
        for key in ("session", "app_name"):
            if not isinstance(job.get(key, ""), str):
                raise DamagedRecord(path, f"{key} is not a string")
        return job

    def forget(self, app_id: str) -> None:
        """Drop an app that never started (schedule failed): it must not look like ours."""
        import shutil

        shutil.rmtree(self.dir(app_id), ignore_errors=True)

    def mark_cancelled(self, app_id: str) -> None:
        self._write(self.dir(app_id) / "cancelled", "")

    def is_cancelled(self, app_id: str) -> bool:
        return (self.dir(app_id) / "cancelled").exists()

    def save_final(self, app_id: str, status: dict[str, Any]) -> None:
        self._write(self.dir(app_id) / "status.json", json.dumps(status, indent=1))

    def load_final(self, app_id: str) -> dict[str, Any] | None:
        """``status.json`` (how the app ended), its shape checked (DamagedRecord), or None."""
        path = self.dir(app_id) / "status.json"
        final = _load_json(path)
        if final is None:
            return None
        if final.get("state") not in AppState.__members__:
            raise DamagedRecord(path, f"state {final.get('state')!r:.40} is no app state")
        restarts = final.get("num_restarts", 0)
        if not isinstance(restarts, int) or isinstance(restarts, bool):
            raise DamagedRecord(path, "num_restarts is not an integer")
        if not isinstance(final.get("msg", ""), str):
            raise DamagedRecord(path, "msg is not a string")
        try:
            replicas_from_json(final.get("roles", []))
        except (TypeError, KeyError, AttributeError):
            raise DamagedRecord(path, "roles is not a list of roles and replicas") from None
        return final

    def final_exists(self, app_id: str) -> bool:
        return (self.dir(app_id) / "status.json").exists()

    def final_app_ids(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.parent.name for p in self.root.glob("*/status.json"))

    @contextlib.contextmanager
    def lock(self, app_id: str) -> Iterator[None]:
        d = self.dir(app_id)
        d.mkdir(parents=True, exist_ok=True)
        with open(d / ".lock", "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    # ---------------------------------------------------------------- logs
    def log_path(self, app_id: str, role: str, replica_id: int, stream: str) -> Path:
        return self.dir(app_id) / "logs" / f"{role}-{replica_id}.{stream}"

    def save_log(self, app_id: str, role: str, replica_id: int, stream: str, data: bytes) -> None:
        # Atomic: a reader in another process (`xrun log` while a finaliser keeps the logs)
        # must never see a log file truncated or half-written.
        self._write(self.log_path(app_id, role, replica_id, stream), data)

    def has_logs(self, app_id: str, role: str, replica_id: int) -> bool:
        """Both streams kept: the finaliser saves stdout, then stderr, and removes the
        container only after; with stdout alone a reader would miss the stderr still in the
        container (it reads the container's logs instead)."""
        return all(
            self.log_path(app_id, role, replica_id, s).exists() for s in ("stdout", "stderr")
        )

    def read_logs(
        self,
        app_id: str,
        role: str,
        replica_id: int,
        streams: list[str],
        since: float | None,
        until: float | None,
    ) -> Iterator[str]:
        """The saved lines of ``streams`` (merged by time), timestamps stripped."""
        files = [self.log_path(app_id, role, replica_id, s) for s in streams]
        readers = [_timestamped_lines(p) for p in files if p.exists()]
        for ts, line in heapq.merge(*readers, key=lambda t: t[0]):
            if since is not None and ts < since:
                continue
            if until is not None and ts > until:
                continue
            yield line


class DamagedRecord(SchedulerError):
    """A docker app's record is JSON of the wrong shape (edited by hand, another version):
    exit 1 and one line naming the file, never a KeyError deep in ``status``."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(
            f"docker's record {path} is damaged ({why}); `rm -r {path.parent}` forgets the app"
        )


def _load_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):  # half-written, not UTF-8, not JSON
        raise DamagedRecord(path, "it is not JSON") from None
    if not isinstance(data, dict):
        raise DamagedRecord(path, f"it is a JSON {type(data).__name__}, not an object")
    return data


def split_timestamp(line: str) -> tuple[float, str]:
    """``2026-11-22T09:28:40.123456789Z text`` -> (epoch seconds, ``text``)."""
    stamp, _, rest = line.partition(" ")
    try:
        # Python parses at most microseconds: cut the nanoseconds docker writes.
        head, _, frac = stamp.rstrip("Z").partition(".")
        when = dt.datetime.fromisoformat(head).replace(tzinfo=dt.timezone.utc).timestamp()
        return when + (float("0." + frac) if frac else 0.0), rest
    except ValueError:
        return 0.0, line


def _timestamped_lines(path: Path) -> Iterator[tuple[float, str]]:
    with open(path, encoding="utf-8", errors="replace", newline="") as f:
        for raw in f:
            yield split_timestamp(raw)


# ---------------------------------------------------------------- status (de)serialisation
def replicas_to_json(roles: list[RoleStatus]) -> list[dict[str, Any]]:
    out = []
    for r in roles:
        reps = []
        for rep in r.replicas:
            d = asdict(rep)
            d["state"] = rep.state.name
            reps.append(d)
        out.append({"role": r.role, "replicas": reps})
    return out


def replicas_from_json(data: list[dict[str, Any]]) -> list[RoleStatus]:
    roles = []
    for r in data:
        reps = [ReplicaStatus(**{**rep, "state": AppState[rep["state"]]}) for rep in r["replicas"]]
        roles.append(RoleStatus(role=r["role"], replicas=reps))
    return roles
