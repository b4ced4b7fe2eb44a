#!/usr/bin/env bash
# The whole test suite N times in a row while a CPU burner loads every core: a flaky test (a race
# that needs a slow, busy machine to show) fails one of the runs. Prints pass/fail per run and a
# summary; exit 0 only if every run passed. Each run's output is kept in the log dir.
#
#   bash scripts/stress-suite.sh [N] [pytest args...]      (N defaults to 5)
#   e.g. bash scripts/stress-suite.sh 1 -n 2               (one run, two pytest workers)
#
# STRESS_BURNERS (default: the number of cores) sets how many busy loops run beside the suite;
# STRESS_LOG_DIR (default: a new temp dir) where the runs' outputs go.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
N=${1:-5}
shift || true
case "$N" in '' | *[!0-9]*)
    echo "stress-suite.sh: N=$N is not a number of runs; e.g. bash scripts/stress-suite.sh 5" >&2
    exit 2
    ;;
esac
BURNERS=${STRESS_BURNERS:-$(nproc)}
LOG_DIR=${STRESS_LOG_DIR:-$(mktemp -d -t xrun-stress-XXXXXX)}
mkdir -p "$LOG_DIR"
PY=${PYTHON:-.venv/bin/python}

burner_pids=()
stop_burners() {
    for pid in "${burner_pids[@]}"; do
        kill "$pid" 2>/dev/null
    done
    for pid in "${burner_pids[@]}"; do
        wait "$pid" 2>/dev/null
    done
    burner_pids=()
}
trap stop_burners EXIT
trap 'stop_burners; exit 130' INT TERM
for _ in $(seq 1 "$BURNERS"); do
    # Lowest priority is NOT used on purpose: the burners compete with the suite as another
    # user's job would.
    "$PY" -c "while True: pass" &
    burner_pids+=($!)
done
echo "stress-suite: $N run(s) of the suite beside $BURNERS CPU burner(s); logs in $LOG_DIR"

# With -n, as scripts/test.sh: an idle worker takes queued tests over (the benchmark smokes).
dist=()
for a in "$@"; do
    case "$a" in -n | -n[0-9]* | --numprocesses*) dist=(--dist worksteal) ;; esac
done

passed=0
failed=0
for i in $(seq 1 "$N"); do
    log="$LOG_DIR/run-$i.log"
    start=$(date +%s)
    "$PY" -m pytest -q -p no:cacheprovider "${dist[@]}" tests "$@" >"$log" 2>&1
    rc=$?
    secs=$(($(date +%s) - start))
    summary=$(grep -E '^(=+ )?[0-9]+ (passed|failed)|(passed|failed|error).* in [0-9.]+s' "$log" | tail -1)
    if [ "$rc" -eq 0 ]; then
        passed=$((passed + 1))
        echo "run $i/$N: PASS in ${secs}s ($summary)"
    else
        failed=$((failed + 1))
        echo "run $i/$N: FAIL (exit $rc) in ${secs}s ($summary)"
        grep -E '^(FAILED|ERROR) ' "$log" | sed 's/^/    /'
    fi
done
stop_burners
echo "stress-suite: $passed of $N run(s) passed, $failed failed"
[ "$failed" -eq 0 ]
