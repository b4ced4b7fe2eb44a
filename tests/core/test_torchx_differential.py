"""xrun against TorchX 0.7.0, side by side, without TorchX installed: the same component
invocations' ``--dryrun`` facts, TorchX's recorded in tests/fixtures/torchx/ (README.md there
says how), xrun's computed now.

Each invocation is compared field by field (app and role names, sizes, retries, resources,
ports, mounts, env, the launcher's flags parsed from its command line, and for Slurm the sbatch
options). A field that differs must be listed in KNOWN with the reason xrun differs on purpose;
a listed difference that no longer occurs fails too, so the list stays true.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.paths import FIXTURES
from xrun.config import Config
from xrun.runner import Runner
from xrun.specs import appdef_to_dict

RECORDED = json.loads((FIXTURES / "torchx" / "dryrun-0.7.0.json").read_text())
RECORDS = {r["id"]: r for r in RECORDED["records"]}

# (invocation id, fact) -> why xrun differs on purpose. "*" matches every invocation.
_LAUNCHER = "xrun runs its own runtime agent (python3 -m xrun.runtime) through sh, not torchrun"
KNOWN: dict[tuple[str, str], str] = {
    ("*", "launcher.max_restarts"): "dist.* retries are the agent's in-place restarts on every "
    "scheduler (one owner, N+1 attempts); TorchX leaves them to the scheduler",
    ("*", "entrypoint"): _LAUNCHER,
    ("*", "metadata"): "dist.* roles carry xrun.restarts_in_place (who owns the retries)",
    ("*", "launcher.endpoint_default_defers"): "the default port defers to XRUN_RDZV_PORT, a "
    "free port local_cwd picks per app, so two multi-node local jobs never meet on 29500",
    ("*", "launcher.role"): "torchrun's --role '' is not passed (the agent's default role)",
    ("*", "image"): "builtins default to xrun's image (xrun-python:latest), not TorchX's",
    ("*", "port_map"): "a one-node dist job has no rendezvous port (localhost:0, a free one): "
    "nothing to publish (docker) or check (local_cwd)",
    ("sh-pipe", "args"): "xrun's utils.sh arguments are shell code, joined unquoted, so a pipe "
    "works (TorchX quotes each argument: sh -c \"'echo a | wc -l'\" is not found)",
    ("python-m", "name"): "utils.python names the app 'python' (TorchX: torchx_utils_python)",
    ("python-m", "entrypoint"): "utils.python runs python3, the interpreter local_cwd puts "
    "first on PATH",
    ("python-m", "env"): "no HYDRA_MAIN_MODULE: xrun does not set Hydra's variable",
    ("copy", "name"): "utils.copy is xrun's own fsspec copier (python3 -m xrun.components.utils)",
    ("copy", "role"): "utils.copy is xrun's own fsspec copier",
    ("copy", "entrypoint"): "utils.copy is xrun's own fsspec copier",
    ("copy", "args"): "utils.copy is xrun's own fsspec copier",
    ("ddp-mounts-debug", "env"): "debug=True also sets NCCL_DEBUG=INFO",
    ("booth", "args"): "xrun's booth app (python3 -m xrun.components._apps booth), the same "
    "flags and values; it stores the result as TorchX's FsspecResultTracker does",
    ("tensorboard", "args"): "xrun's process monitor (python3 -m xrun.components._apps "
    "monitor), the same flags, then the same tensorboard command",
    ("slurm-echo", "slurm.layout"): "one allocation per role (--nodes=N), not one het group "
    "per replica",
    ("slurm-ddp", "slurm.layout"): "one allocation per role (--nodes=N), not one het group "
    "per replica",
    ("slurm-sh-retries", "slurm.layout"): "one allocation per role (--nodes=N), not one het "
    "group per replica",
    ("slurm-ddp", "slurm.requeue_after_failure"): "dist.* agents restart in place; the batch "
    "script requeues a failed dist job never (TorchX: max_retries times, so (N+1)^2 runs with "
    "in-place restarts)",
    ("slurm-echo", "slurm.requeue_flag"): "--no-requeue when max_retries is 0: Slurm must not "
    "requeue on its own (TorchX always passes --requeue)",
}


def _endpoint(text: str) -> dict[str, Any]:
    if text == "localhost:0":
        return {"endpoint": "localhost:0"}
    port = re.search(r"(\d+)\}?$", text)
    assert port is not None and "rank0_env" in text, text
    return {
        "endpoint": f"RANK0:{port.group(1)}",
        "endpoint_default_defers": "XRUN_RDZV_PORT" in text,
    }


def _launcher(cmd: str) -> dict[str, Any]:
    """The torchrun-style flags of a dist command line, in one form for both tools."""
    words = shlex.split(cmd)
    if words[:1] == ["exec"]:
        words = words[4:]  # exec python3 -m xrun.runtime
    else:
        assert words[0] == "torchrun", cmd
        words = words[1:]
    flags: dict[str, Any] = {"max_restarts": "0", "role": None, "node_rank": None}
    i = 0
    while i < len(words) and words[i].startswith("--"):
        key = words[i][2:].replace("-", "_")
        flags[key] = words[i + 1]
        i += 2
    nnodes = flags.pop("nnodes")
    flags["nnodes"] = nnodes if ":" in nnodes else f"{nnodes}:{nnodes}"
    flags.update(_endpoint(flags.pop("rdzv_endpoint")))
    flags.setdefault("endpoint_default_defers", False)
    flags["entry"] = words[i : i + 2] if words[i] == "-m" else words[i : i + 1]
    flags["script_args"] = words[i + len(flags["entry"]) :]
    flags.pop("rdzv_id")  # '${app_id}' in both
    return flags


def _role_facts(role: dict[str, Any]) -> dict[str, Any]:
    facts = {
        k: role[k]
        for k in ("name", "num_replicas", "min_replicas", "max_retries", "port_map", "env")
    }
    facts["role"] = role["name"]
    res = role["resource"]
    facts["resource"] = {k: res[k] for k in ("cpu", "gpu", "memMB", "capabilities", "devices")}
    facts["mounts"] = [
        (m.get("type", "").replace("Mount", "").lower() or "bind", m.get("src_path"), m["dst_path"])
        for m in role["mounts"]
    ]
    facts["image"] = role["image"]
    facts["metadata"] = role["metadata"]
    cmd = role["args"][1] if role["entrypoint"] in ("sh", "bash") and len(role["args"]) == 2 else ""
    if "torchrun" in cmd or "xrun.runtime" in cmd:
        facts["entrypoint"] = "launcher"
        for k, v in _launcher(cmd).items():
            facts[f"launcher.{k}"] = v
    else:
        facts["entrypoint"] = role["entrypoint"]
        facts["args"] = role["args"]
    return facts


def _app_facts(app: dict[str, Any]) -> dict[str, Any]:
    [role] = app["roles"]
    facts = _role_facts(role)
    facts["name"] = app["name"]
    return facts


_SBATCH_COMPARED = ("--partition", "--time", "--constraint", "--cpus-per-task", "--mail")


def _slurm_facts_torchx(rec: dict[str, Any]) -> dict[str, Any]:
    s = rec["slurm"]
    opts = " ".join(s["sbatch_lines"]).split() + s["sbatch"][2:]
    return {
        "slurm.layout": f"one het group per replica ({s['groups']})",
        "slurm.requeue_flag": "--requeue" in opts,
        "slurm.requeue_after_failure": s["max_retries"],
        "slurm.options": sorted(
            {o for o in opts if o.startswith((*_SBATCH_COMPARED, "--comment"))}
        ),
    }


def _slurm_facts_xrun(req: Any) -> dict[str, Any]:
    lines = re.findall(r"^#SBATCH (\S+)$", req.script, flags=re.M)
    opts = lines + req.sbatch_argv[2:]
    fail = re.search(r'elif \[ "\$XRUN_RC" -ne 0 \]; then\n    XRUN_RETRIES=(\d+)', req.script)
    assert fail is not None
    comment = [o for o in opts if o.startswith("--comment=")]
    user = [c.split(",", 1)[1] for c in comment if "," in c]  # after xrun's own marker
    return {
        "slurm.layout": "one allocation per role",
        "slurm.requeue_flag": "--requeue" in opts,
        "slurm.requeue_after_failure": int(fail.group(1)),
        "slurm.options": sorted(
            {o for o in opts if o.startswith(_SBATCH_COMPARED)} | {f"--comment={u}" for u in user}
        ),
    }


def _xrun_facts(rec: dict[str, Any], runner: Runner) -> dict[str, Any]:
    app = runner.component_app(rec["component"], rec["args"])
    job = runner.with_job_env(app, rec["scheduler"])
    for role in job.roles:
        # xrun's one addition to TorchX's tracking variables (docs/tracking.md): the job's id
        # as a name, checked here and then left out of the comparison
        run_id = role.env.pop("XRUN_RUN_ID")
        assert run_id == f"{rec['scheduler']}_{runner.session_name}_${{app_id}}", run_id
    facts = _app_facts(appdef_to_dict(job))
    if rec["scheduler"] == "slurm":
        facts.update(_slurm_facts_xrun(runner.dryrun(app, "slurm", rec["cfg"]).request))
    return facts


def _known(rid: str, fact: str) -> str | None:
    return KNOWN.get((rid, fact)) or KNOWN.get(("*", fact))


@pytest.fixture(scope="module")
def runner() -> Runner:
    return Runner(config=Config())


@pytest.mark.parametrize("rid", sorted(RECORDS))
def test_dryrun_matches_torchx_or_differs_on_purpose(
    rid: str, runner: Runner, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for var in ("LOGLEVEL", "TORCHX_TRACKERS", "TORCHX_PARENT_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    rec = RECORDS[rid]
    if "--script" in rec["args"]:  # Slurm's dry run checks that the job will find it (N11)
        monkeypatch.chdir(tmp_path)
        (tmp_path / rec["args"][rec["args"].index("--script") + 1]).write_text("")
    theirs = _app_facts(rec["app"])
    if rec["scheduler"] == "slurm":
        theirs.update(_slurm_facts_torchx(rec))
    ours = _xrun_facts(rec, runner)
    unexplained = {
        k: (theirs.get(k), ours.get(k))
        for k in sorted(set(theirs) | set(ours))
        if theirs.get(k) != ours.get(k) and not _known(rid, k)
    }
    assert unexplained == {}, f"{rid}: differs from TorchX 0.7.0 (torchx, xrun)"
    stale = [
        k
        for (r, k) in KNOWN
        if r == rid and (k not in theirs and k not in ours or theirs.get(k) == ours.get(k))
    ]
    assert stale == [], f"{rid}: listed as different but equal now: {stale}"


def test_booth_and_tensorboard_args_differ_only_in_the_module() -> None:
    for rid, module in (("booth", "booth"), ("tensorboard", "monitor")):
        rec = RECORDS[rid]
        theirs = rec["app"]["roles"][0]["args"]
        ours = Runner(config=Config()).component_app(rec["component"], rec["args"]).roles[0].args
        assert ours[:3] == ["-m", "xrun.components._apps", module]
        assert ours[3:] == theirs[2:], rid


def test_the_recording_covers_what_the_issue_names() -> None:
    assert RECORDED["torchx"] == "0.7.0"
    ids = set(RECORDS)
    assert {"ddp-static", "ddp-2x4-name", "sh-env", "echo", "ddp-aws", "slurm-ddp"} <= ids
    assert len(ids) >= 20
