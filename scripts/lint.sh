#!/usr/bin/env bash
# ruff + mypy over the whole project.
# mypy cannot see through setuptools' editable-install finder (our sub-packages live in their
# own top-level folders), so it checks a throwaway tree of symlinks laid out as installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
"$PY" -m ruff check src components schedulers runtime tests examples benchmarks
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
mkdir "$tree/xrun"
for f in src/xrun/*; do ln -s "$PWD/$f" "$tree/xrun/$(basename "$f")"; done
for d in components schedulers runtime; do ln -s "$PWD/$d" "$tree/xrun/$d"; done
MYPYPATH="$tree" "$PY" -m mypy --no-incremental -p xrun
