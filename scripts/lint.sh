#!/usr/bin/env bash
# ruff (lint and format) + mypy over the whole project.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
SRC=(src/xrun/*.py src/xrun/calls src/xrun/cli src/xrun/sweeps src/xrun/tracker components schedulers runtime tests examples benchmarks)
"$PY" -m ruff check "${SRC[@]}"
"$PY" -m ruff format --check "${SRC[@]}"
# src/ is laid out as installed: src/xrun/{components,schedulers,runtime} are symlinks.
MYPYPATH=src "$PY" -m mypy --no-incremental -p xrun
