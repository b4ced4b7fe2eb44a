#!/usr/bin/env bash
# The whole test suite, as CI runs it, from a fresh machine:
#   system packages (Slurm + munge, Docker Engine, etcd, mmdebstrap, shellcheck) -> .venv -> lint
#   -> real Slurm cluster, Docker Engine and etcd -> pytest (everything, nothing skipped; the benchmark smoke run is one of its tests:
#   tests/e2e/test_benchmarks_smoke.py, so it is not run a second time here).
set -euo pipefail
cd "$(dirname "$0")/.."
# Byte-code caching on: start-up time is part of what the tests and benchmarks exercise.
unset PYTHONDONTWRITEBYTECODE
bash scripts/setup.sh
bash scripts/lint.sh
# Start the real backends up front (the test fixtures call the same idempotent scripts).
bash scripts/slurm-cluster.sh up
bash scripts/docker-engine.sh up
bash scripts/docker-engine.sh image
bash scripts/etcd-server.sh up
# -rs lists skips: the suite must not skip anything, and conftest fails a run that does.
# -n 2 (both cores): the real-cluster preemption, recovery and stop-path tests mostly wait on
# Slurm, Docker and timeouts; serially the suite would take about twice as long.
# XRUN_TEST_WORKERS=0 runs it serially. --dist worksteal: the benchmark smokes (minutes each)
# tend to end up queued on one worker; an idle worker takes them over instead of waiting.
.venv/bin/python -m pytest -q -rs -p no:cacheprovider -n "${XRUN_TEST_WORKERS:-2}" \
    --dist worksteal tests "$@"
