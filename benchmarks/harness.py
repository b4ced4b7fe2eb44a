"""The measuring machinery every benchmark shares: interleaved repetitions, statistics, verdicts,
the printed table and the JSON file.

A measure module builds ``Row`` objects: one row is one comparison (e.g. "1x4 do-nothing job,
end to end") between contenders (``floor``, ``torchrun``, ``torchx``, ``xrun`` ...). Each
contender is a zero-argument callable that runs the thing once and returns the measured value
(seconds, MiB, a ratio). ``interleave`` calls them A B C A B C ... so that a load spike on this
shared machine hits every contender alike instead of one contender's whole series.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = 1


class Unavailable(Exception):
    """The contender is not installed or not built yet: the row says so instead of a figure."""


class RunFailed(Exception):
    """The contender ran but did not do the job (non-zero exit, lost lines...)."""


@dataclass
class Stats:
    samples: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    def as_json(self) -> dict[str, Any]:
        return {
            "median": self.median,
            "min": min(self.samples),
            "max": max(self.samples),
            "n": len(self.samples),
            "samples": self.samples,
        }


@dataclass
class Row:
    """One comparison. ``results`` maps contender -> Stats, or -> the reason it has no figure.

    ``check`` turns the results into the verdict on the target (``met``/``missed``) or None when
    the contender the target is about has no figure.
    """

    label: str
    unit: str
    target: str
    results: dict[str, Stats | str] = field(default_factory=dict)
    subject: str = "xrun"
    reference: str = "torchrun"
    check: Callable[[Mapping[str, Stats | str]], bool | None] | None = None
    note: str = ""

    def median(self, name: str) -> float | None:
        r = self.results.get(name)
        return r.median if isinstance(r, Stats) else None

    def ratio(self, name: str, reference: str) -> float | None:
        a, b = self.median(name), self.median(reference)
        return a / b if a is not None and b else None

    def verdict(self) -> str:
        if self.check is None:
            return "n/a"
        try:
            ok = self.check(self.results)
        except (KeyError, TypeError, ZeroDivisionError):
            ok = None
        return "n/a" if ok is None else ("met" if ok else "missed")

    def as_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "unit": self.unit,
            "target": self.target,
            "subject": self.subject,
            "reference": self.reference,
            "contenders": {k: _result_json(v) for k, v in self.results.items()},
            "ratio": self.ratio(self.subject, self.reference),
            "verdict": self.verdict(),
            "note": self.note,
        }


def _result_json(res: Stats | str) -> dict[str, Any]:
    """Figures, or ``{"failed": why}`` (it ran and did not do the job) or ``{"unavailable":
    why}`` (not installed / not built)."""
    if isinstance(res, Stats):
        return res.as_json()
    if res.startswith("failed: "):
        return {"failed": res.removeprefix("failed: ")}
    return {"unavailable": res.removeprefix("unavailable: ")}


def at_most(subject: str, limit: float, plus: str | None = None) -> Callable[..., bool | None]:
    """A check: median(subject) <= limit (+ median(plus) when given, e.g. the floor)."""

    def check(results: Mapping[str, Stats | str]) -> bool | None:
        s = results.get(subject)
        base = results.get(plus) if plus else None
        if not isinstance(s, Stats) or (plus and not isinstance(base, Stats)):
            return None
        return s.median <= limit + (base.median if isinstance(base, Stats) else 0.0)

    return check


def interleave(
    contenders: Mapping[str, Callable[[], float]], reps: int, warmup: bool = True
) -> dict[str, Stats | str]:
    """Run each contender ``reps`` times, round-robin; return Stats or the reason for none.

    With ``warmup`` every contender runs once first, unrecorded: it fills the page cache (the
    first ``import torch`` after a while costs seconds more) and finds unavailable contenders
    before the measured rounds. A contender that fails is dropped from later rounds and its row
    says why (a benchmark must not hide that a contender could not do the job).
    """
    out: dict[str, Stats | str] = {}
    live = dict(contenders)
    samples: dict[str, list[float]] = {k: [] for k in contenders}
    rounds = reps + (1 if warmup else 0)
    for i in range(rounds):
        for name, fn in list(live.items()):
            try:
                value = fn()
            except Unavailable as e:
                out[name] = f"unavailable: {e}"
                del live[name]
                continue
            except Exception as e:  # noqa: BLE001 - a broken contender is a result, not a crash
                out[name] = f"failed: {type(e).__name__}: {one_line(str(e))}"
                if os.environ.get("XRUN_BENCH_DEBUG"):
                    traceback.print_exc()
                del live[name]
                continue
            if not warmup or i > 0:
                samples[name].append(value)
    for name in contenders:
        if name not in out:
            out[name] = Stats(samples[name])
    return {k: out[k] for k in contenders}


def one_line(text: str, limit: int = 300) -> str:
    flat = " | ".join(line.strip() for line in text.strip().splitlines() if line.strip())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def peer_venv(
    venv: Path,
    what: str,
    pip_args: Sequence[str],
    probe: str,
    needs: Sequence[str] = (),
    constraints: str = "",
    timeout: float = 600,
) -> str:
    """A venv of a benchmark's own for a peer tool (submitit, ft_launcher, torchft: never the
    project's dependencies), its python. The project's venv (torch, xrun) shows through a .pth
    file, so nothing installs a torch of its own; ``constraints`` (a pip constraints file's
    text, e.g. ``torch==2.13.0``) keeps it so. Made once: reused while ``probe`` (Python code)
    passes and the ``needs`` (names in the venv's bin) exist. Raises Unavailable when pip
    cannot get ``what`` or it does not import."""
    import site
    import subprocess

    py = venv / "bin" / "python"
    check = [str(py), "-c", probe]
    ready = py.exists() and all((venv / "bin" / n).exists() for n in needs)
    if ready and subprocess.run(check, capture_output=True, timeout=300).returncode == 0:
        return str(py)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True,
                   capture_output=True, timeout=300)  # fmt: skip
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    pth = venv / "lib" / ver / "site-packages" / "xrun-project-venv.pth"
    pth.write_text("\n".join(site.getsitepackages()) + "\n")
    pins: list[str] = []
    if constraints:
        (venv / "constraints.txt").write_text(constraints)
        pins = ["-c", str(venv / "constraints.txt")]
    pip = subprocess.run([str(py), "-m", "pip", "install", "-q", *pins, *pip_args],
                         capture_output=True, text=True, timeout=timeout)  # fmt: skip
    if pip.returncode:
        raise Unavailable(f"pip install {what} failed: {one_line(pip.stderr)}")
    probed = subprocess.run(check, capture_output=True, text=True, timeout=300)
    if probed.returncode or not all((venv / "bin" / n).exists() for n in needs):
        raise Unavailable(f"{what} does not import: {one_line(probed.stderr)}")
    return str(py)


# --- output -------------------------------------------------------------------------------------


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "s":
        return f"{value:.3f} s"
    if unit == "x":
        return f"{value:.2f}x"
    return f"{value:.1f} {unit}"


def render(measures: Mapping[str, tuple[str, Sequence[Row]]]) -> str:
    """The human table: per row, every contender's median and min-max, its ratio to the
    reference, then the target and the verdict."""
    lines: list[str] = []
    for key, (title, rows) in measures.items():
        lines.append(f"\n## {key}. {title}")
        for row in rows:
            lines.append(f"  {row.label}   [target: {row.target} -> {row.verdict()}]")
            for name, res in row.results.items():
                if isinstance(res, Stats):
                    ratio = row.ratio(name, row.reference)
                    rel = f"{ratio:.2f}x {row.reference}" if ratio and name != row.reference else ""
                    lines.append(
                        f"    {name:<16}{_fmt(res.median, row.unit):>12}   "
                        f"[{_fmt(min(res.samples), row.unit)} - {_fmt(max(res.samples), row.unit)}]"
                        f"  n={len(res.samples)}  {rel}"
                    )
                else:
                    lines.append(f"    {name:<16}{'-':>12}   {res}")
            if row.note:
                lines.append(f"    note: {row.note}")
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    try:
        import importlib.metadata as md

        torch_version = md.version("torch")
    except Exception:  # noqa: BLE001 - the figure is informative only
        torch_version = None
    return {
        "host": socket.gethostname(),
        "cpus": len(os.sched_getaffinity(0)),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "torch": torch_version,
        "loadavg": os.getloadavg(),
    }


def document(
    measures: Mapping[str, tuple[str, Sequence[Row]]],
    *,
    smoke: bool,
    reps: int,
    wall_s: float,
    started: dict[str, Any],
) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "smoke": smoke,
        "reps": reps,
        "wall_s": wall_s,
        "machine": started,
        "loadavg_end": os.getloadavg(),
        "measures": {
            key: {"title": title, "rows": [r.as_json() for r in rows]}
            for key, (title, rows) in measures.items()
        },
    }


def write_json(path: str, doc: Mapping[str, Any]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


__all__ = [
    "Row",
    "RunFailed",
    "Stats",
    "Unavailable",
    "at_most",
    "document",
    "interleave",
    "machine",
    "render",
    "write_json",
]
