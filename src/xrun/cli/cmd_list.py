"""``xrun list -s S``: the apps and sweeps a scheduler knows (a sweep's trials on its line)."""

from __future__ import annotations

import argparse

from xrun.runner import Runner
from xrun.schedulers.api import ListAppResponse
from xrun.specs import AppHandle, make_app_handle


def add_arguments(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ls = sub.add_parser("list", help="list the apps a scheduler knows")
    ls.add_argument("-s", "--scheduler", help="default local_cwd")


def main(ns: argparse.Namespace) -> int:
    with Runner() as runner:
        scheduler = ns.scheduler or runner.config.default_scheduler() or "local_cwd"
        apps = runner.list(scheduler)
        sweeps, owned = list_sweeps(runner, scheduler)
        for a in apps:
            if is_trial(a, owned):
                continue  # shown as part of its sweep's line
            handle = a.app_handle or make_app_handle(scheduler, runner.session_name, a.app_id)
            print(f"{handle}\t{a.state.name}\t{a.name}")
        for line in sweeps:
            print(line)
    return 0


def list_sweeps(runner: Runner, scheduler: str) -> tuple[list[str], set[str]]:
    """(one line per sweep: handle, state, counts by state, name; the ids of the apps or jobs
    that are its trials, which ``list`` leaves out)."""
    lines: list[str] = []
    owned: set[str] = set()
    for st in runner.sweep_backend(scheduler).list():
        sweep_id = AppHandle.parse(st.handle).app_id
        owned.add(sweep_id)
        owned.update(t.app_id for t in st.trials if t.app_id)
        counts = ",".join(f"{s.name}={n}" for s, n in st.counts().items())
        lines.append(f"{st.handle}\t{st.state.name}\t{st.name} (sweep: {counts})")
    return lines, owned


def is_trial(app: ListAppResponse, owned: set[str]) -> bool:
    """An app (or Slurm array task, ``ID_INDEX``) that is a trial of a listed sweep."""
    return app.app_id in owned or app.app_id.split("_", 1)[0] in owned
