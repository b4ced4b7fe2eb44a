"""Parsers for what Slurm says about jobs, and the mapping of its states to xrun's.

Four sources, because none is always there: ``squeue --json`` (schema changes across 22.05,
23.02, 23.11, 24.11), ``squeue --format`` text, ``scontrol show job -o`` (finished jobs until
MinJobAge passes) and ``sacct`` (only with accounting, or ``sacct -c`` from a jobcomp file).
Each parser returns :class:`SlurmJobRecord` s; a heterogeneous job is one record per component
(the leader's ``het_job_id`` is the app id). Pure functions: the recorded outputs under
``tests/fixtures/slurm/<version>/`` exercise them without a cluster.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from xrun.specs import AppState

# Every job state Slurm documents (squeue(1) "JOB STATE CODES"), mapped to xrun's.
STATE_MAP: dict[str, AppState] = {
    "PENDING": AppState.PENDING,
    "REQUEUED": AppState.PENDING,
    "REQUEUE_HOLD": AppState.PENDING,
    "REQUEUE_FED": AppState.PENDING,
    "RESV_DEL_HOLD": AppState.PENDING,
    "CONFIGURING": AppState.RUNNING,
    "RUNNING": AppState.RUNNING,
    "COMPLETING": AppState.RUNNING,
    "RESIZING": AppState.RUNNING,
    "SIGNALING": AppState.RUNNING,
    "STAGE_OUT": AppState.RUNNING,
    "SUSPENDED": AppState.RUNNING,
    "STOPPED": AppState.RUNNING,
    "UPDATE_DB": AppState.RUNNING,
    "POWER_UP_NODE": AppState.RUNNING,
    "COMPLETED": AppState.SUCCEEDED,
    "CANCELLED": AppState.CANCELLED,
    "REVOKED": AppState.CANCELLED,
    "FAILED": AppState.FAILED,
    "TIMEOUT": AppState.FAILED,
    "NODE_FAIL": AppState.FAILED,
    "PREEMPTED": AppState.FAILED,
    "OUT_OF_MEMORY": AppState.FAILED,
    "BOOT_FAIL": AppState.FAILED,
    "DEADLINE": AppState.FAILED,
    "SPECIAL_EXIT": AppState.FAILED,
}

# Terminal failures whose name alone is the explanation the user needs.
_REASONS = {
    "TIMEOUT": "the job reached its time limit",
    "NODE_FAIL": "a node of the allocation failed",
    "PREEMPTED": "the job was preempted",
    "OUT_OF_MEMORY": "a task ran out of memory",
    "BOOT_FAIL": "a node failed to boot",
    "DEADLINE": "the job reached its deadline before it could run",
    "SPECIAL_EXIT": "the job was held after a special exit",
}

# State flags that may accompany the base state in 23.02+ JSON lists.
_PENDING_FLAGS = {"REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"}


@dataclass
class SlurmJobRecord:
    """One job (or one het component) as Slurm reports it; raw state names kept."""

    job_id: str
    app_id: str  # the het leader's id; == job_id for a plain job
    het_offset: int = 0
    name: str = ""
    state: str = "UNKNOWN"
    reason: str = ""
    exit_code: int | None = None
    signal: int | None = None
    restarts: int = 0
    nodelist: str = ""
    comment: str = ""
    std_out: str = ""
    flags: list[str] = field(default_factory=list)


def app_state(slurm_state: str) -> AppState:
    """xrun's state for a Slurm state name (``CANCELLED by 0`` -> CANCELLED; unknown: UNKNOWN)."""
    base = slurm_state.split()[0].rstrip("+").upper() if slurm_state.strip() else ""
    return STATE_MAP.get(base, AppState.UNKNOWN)


def explain(rec: SlurmJobRecord) -> str:
    """A one-line message for the user: the raw state, why, and the exit code."""
    parts = [rec.state]
    if rec.state in _REASONS:
        parts.append(f"({_REASONS[rec.state]})")
    if rec.reason and rec.reason not in ("None", "(null)"):
        parts.append(f"reason={rec.reason}")
    if rec.exit_code not in (None, 0):
        parts.append(f"exit_code={rec.exit_code}")
    if rec.signal:
        parts.append(f"signal={rec.signal}")
    return " ".join(parts)


# --------------------------------------------------------------------------- hostlists
def expand_hostlist(text: str) -> list[str]:
    """``c[1-3,5],gpu01`` -> ``['c1', 'c2', 'c3', 'c5', 'gpu01']`` (zero padding kept)."""
    hosts: list[str] = []
    for m in re.finditer(r"([^,\[]+)(?:\[([^\]]*)\])?([^,]*)", text or ""):
        prefix, ranges, suffix = m.group(1), m.group(2), m.group(3)
        if prefix in ("(null)", "None"):
            continue
        if ranges is None:
            hosts.append(prefix + suffix)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            if not hi:
                hosts.append(f"{prefix}{lo}{suffix}")
                continue
            width = len(lo) if lo.startswith("0") else 0
            for n in range(int(lo), int(hi) + 1):
                hosts.append(f"{prefix}{str(n).zfill(width)}{suffix}")
    return hosts


# --------------------------------------------------------------------------- squeue --json
def _num(value: Any) -> int | None:
    """A number from 22.05 (plain int) or 23.02+ (``{"set": .., "infinite": .., "number": ..}``)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        return _num(value.get("number"))
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def _json_exit(value: Any) -> tuple[int | None, int | None]:
    """(exit code, signal) from 22.05's raw wait status or 23.11+'s process_exit_code object."""
    if isinstance(value, dict) and ("return_code" in value or "signal" in value):
        code = _num(value.get("return_code"))
        sig = value.get("signal")
        signum = _num(sig.get("id")) if isinstance(sig, dict) else _num(sig)
        return code, signum or None
    raw = _num(value)
    if raw is None:
        return None, None
    # A wait(2) status: exit code in the high byte, signal in the low 7 bits.
    return (raw >> 8) & 0xFF, (raw & 0x7F) or None


def _json_state(value: Any) -> tuple[str, list[str]]:
    """(base state, flags): a string in 22.05, a list of names from 23.02/23.11 on."""
    if isinstance(value, list):
        names = [str(v) for v in value]
        base = next((n for n in names if n in STATE_MAP and n not in _PENDING_FLAGS), "")
        if not base:
            base = names[0] if names else "UNKNOWN"
        flags = [n for n in names if n != base]
        if base != "PENDING" and any(f in _PENDING_FLAGS for f in flags):
            # A requeued job briefly lists its old state with REQUEUED: it is going back.
            base = next(f for f in flags if f in _PENDING_FLAGS)
        return base, flags
    return str(value or "UNKNOWN"), []


def parse_squeue_json(text: str) -> list[SlurmJobRecord]:
    """Every job in ``squeue --json`` (22.05 ignores -j: the caller filters)."""
    data = json.loads(text)
    out = []
    for j in data.get("jobs", []):
        job_id = str(_num(j.get("job_id")))
        het = _num(j.get("het_job_id")) or 0
        # A job array's task is JOBID_INDEX (as squeue's text form and scancel write it).
        array, task = _num(j.get("array_job_id")) or 0, _num(j.get("array_task_id"))
        shown = f"{array}_{task}" if array and task is not None else str(het or job_id)
        state, flags = _json_state(j.get("job_state"))
        code, sig = _json_exit(j.get("exit_code"))
        out.append(
            SlurmJobRecord(
                job_id=job_id,
                app_id=shown,
                het_offset=_num(j.get("het_job_offset")) or 0,
                name=str(j.get("name", "")),
                state=state,
                reason=str(j.get("state_reason", "")),
                exit_code=code,
                signal=sig,
                restarts=_num(j.get("restart_cnt")) or 0,
                nodelist=str(j.get("nodes", "") or ""),
                comment=str(j.get("comment", "") or ""),
                std_out=str(j.get("standard_output", "") or ""),
                flags=flags,
            )
        )
    return out


# --------------------------------------------------------------------------- squeue text
# %i: the job id as users write it (``23+1`` is component 1 of het job 23), %A: its own id.
SQUEUE_FORMAT = "%i|%A|%T|%r|%N|%j|%k"


def parse_squeue_text(text: str) -> list[SlurmJobRecord]:
    """``squeue -h -t all -o '%i|%A|%T|%r|%N|%j|%k'`` (no exit codes in this form)."""
    out = []
    for line in text.splitlines():
        fields = line.split("|", 6)
        if len(fields) < 7:
            continue
        shown, job_id, state, reason, nodes, name, comment = fields
        leader, plus, offset = shown.strip().partition("+")
        out.append(
            SlurmJobRecord(
                job_id=job_id.strip(),
                app_id=leader,
                het_offset=int(offset) if plus and offset.isdigit() else 0,
                name=name,
                state=state.strip(),
                reason=reason.strip(),
                nodelist=nodes.strip(),
                comment=comment,
            )
        )
    return out


# --------------------------------------------------------------------------- scontrol
_KV_KEYS = (
    "JobId|HetJobId|HetJobOffset|JobName|JobState|Reason|Restarts|ExitCode|NodeList|Comment|StdOut"
)
_KV_RE = re.compile(rf"(?:^|\s)({_KV_KEYS})=(.*?)(?=\s+[A-Za-z:/_]+=|\s*$)")


def parse_scontrol(text: str) -> list[SlurmJobRecord]:
    """``scontrol show job -o ID``: one line per job (per het component)."""
    out = []
    for line in text.splitlines():
        if "JobId=" not in line:
            continue
        kv = {m.group(1): m.group(2) for m in _KV_RE.finditer(line)}
        job_id = kv.get("JobId", "")
        code, _, sig = kv.get("ExitCode", "").partition(":")
        out.append(
            SlurmJobRecord(
                job_id=job_id,
                app_id=kv.get("HetJobId") or job_id,
                het_offset=int(kv.get("HetJobOffset") or 0),
                name=kv.get("JobName", ""),
                state=kv.get("JobState", "UNKNOWN"),
                reason=kv.get("Reason", ""),
                exit_code=int(code) if code.isdigit() else None,
                signal=(int(sig) or None) if sig.isdigit() else None,
                restarts=int(kv.get("Restarts") or 0),
                nodelist=kv.get("NodeList", ""),
                comment="" if kv.get("Comment") == "(null)" else kv.get("Comment", ""),
                std_out=kv.get("StdOut", ""),
            )
        )
    return out


# --------------------------------------------------------------------------- sacct
SACCT_FIELDS = "JobID,JobName,State,ExitCode,NodeList"
SACCT_COMP_FIELDS = "jobid,jobname,state,nodelist"


def parse_sacct(text: str, fields: str = SACCT_FIELDS) -> list[SlurmJobRecord]:
    """``sacct --parsable2 --noheader -o FIELDS``; steps (``12.batch``) skipped; the last row of a
    job wins (a requeued job has one row per attempt). ``12+1`` is component 1 of het job 12."""
    names = [f.strip().lower() for f in fields.split(",")]
    latest: dict[str, SlurmJobRecord] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        row = dict(zip(names, line.split("|"), strict=False))
        raw_id = row.get("jobid", "").strip()
        if not raw_id or "." in raw_id:
            continue
        leader, plus, offset = raw_id.partition("+")
        code, _, sig = row.get("exitcode", "").partition(":")
        latest[raw_id] = SlurmJobRecord(
            job_id=raw_id,
            app_id=leader,
            het_offset=int(offset) if plus and offset.isdigit() else 0,
            name=row.get("jobname", ""),
            state=row.get("state", "UNKNOWN").split()[0] if row.get("state") else "UNKNOWN",
            exit_code=int(code) if code.isdigit() else None,
            signal=(int(sig) or None) if sig.isdigit() else None,
            nodelist=row.get("nodelist", ""),
        )
    return list(latest.values())


# --------------------------------------------------------------------------- folding
def app_records(records: list[SlurmJobRecord], app_id: str) -> list[SlurmJobRecord]:
    """The components of app ``app_id``, in het order."""
    mine = [r for r in records if r.app_id == app_id or r.job_id == app_id]
    return sorted(mine, key=lambda r: r.het_offset)


def fold_state(records: list[SlurmJobRecord]) -> tuple[AppState, SlurmJobRecord]:
    """The app's state from its components: the worst one decides; returns it and its record."""
    order = [
        AppState.FAILED,
        AppState.CANCELLED,
        AppState.RUNNING,
        AppState.PENDING,
        AppState.UNKNOWN,
        AppState.SUCCEEDED,
    ]
    ranked = sorted(records, key=lambda r: order.index(app_state(r.state)))
    worst = ranked[0]
    return app_state(worst.state), worst


def preemptions(lines: list[str]) -> str:
    """The job's ``preempted`` file (``<epoch> <SIG> restart=<attempt>`` per stop, written by
    the batch script) as status says it: every one, in order, not only the last."""
    import time

    each = []
    for line in lines:
        parts = line.split()
        try:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(int(parts[0])))
            attempt = parts[2].removeprefix("restart=")
            each.append(f"attempt {attempt} at {when} ({parts[1]})")
        except (IndexError, ValueError):
            each.append(line.strip())  # a line this code did not write: shown as it is
    return f"preempted {len(lines)} time(s): {', '.join(each)}"
