#!/usr/bin/env bash
# Create .venv with xrun (editable), torch (the CPU wheel, pinned) and the dev tools.
# Idempotent: a second run only checks that everything is there.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
# torch is pinned to 2.13.0 (a CPU wheel is provided locally): an unpinned `torch` would resolve
# to the newest release and download several GB of CUDA packages.
.venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0" numpy 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[dev,docker,torch,tensorboard,mlflow]" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import torch, xrun, xrun.runtime, xrun.components, xrun.schedulers; assert torch.__version__.startswith('2.13.0'), torch.__version__"
.venv/bin/py-spy --version >/dev/null  # a dependency of xrun: xrun stacks / --stall-timeout read workers with it
