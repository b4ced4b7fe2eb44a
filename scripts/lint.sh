#!/usr/bin/env bash
# ruff + mypy over the whole project.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
"$PY" -m ruff check src/xrun/*.py components schedulers runtime tests examples benchmarks
# src/ is laid out as installed: src/xrun/{components,schedulers,runtime} are symlinks.
MYPYPATH=src "$PY" -m mypy --no-incremental -p xrun
