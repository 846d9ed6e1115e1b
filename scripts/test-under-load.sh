#!/usr/bin/env bash
# The test suite on a fresh clone of HEAD while another CPU-heavy job runs: `scripts/test.sh`
# RUNS times in a row (3 by default) in one clone, while a second clone builds the project in
# release mode over and over (`cargo clean` between builds, so the load never stops). Every run
# must pass; the durations and exit codes go to results/test-under-load.md.
#
#   scripts/test-under-load.sh [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
runs=${1:-3}
repo=$(pwd)
out="$repo/results/test-under-load.md"
work=$(mktemp -d)
load_pid=""
cleanup() {
  [ -n "$load_pid" ] && kill -- "-$load_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
log() { echo "[test-under-load $(date +%T)] $*" >&2; }
trap 'exit 130' INT TERM
ensure_postgres
# The broker's jars are fetched once per machine; fetched here first so that it is not counted.
[ -n "${KAFKA_BROKERS:-}" ] || ensure_kafka
commit=$(git rev-parse --short HEAD)
git clone -q "$repo" "$work/tests"
git clone -q "$repo" "$work/load"
# The load: release builds of the project, back to back, in their own process group.
setsid bash -c 'cd "$1" && while true; do cargo build --release --quiet --workspace \
  >/dev/null 2>&1; cargo clean --quiet; done' _ "$work/load" &
load_pid=$!
log "load started: release builds in a loop (pid $load_pid)"
results=()
failed=0
for i in $(seq 1 "$runs"); do
  start=$SECONDS rc=0
  log "test run $i of $runs"
  (cd "$work/tests" && scripts/test.sh) >"$work/test-$i.log" 2>&1 || rc=$?
  secs=$((SECONDS - start))
  load=$(cut -d' ' -f1-3 /proc/loadavg)
  passed=$(grep -ho '[0-9]* passed' "$work/test-$i.log" | awk '{s += $1} END {print s + 0}')
  results+=("| $i | $rc | $secs | $passed | $load |")
  log "test run $i: exit $rc in ${secs}s, $passed tests passed, load average $load"
  if [ "$rc" != 0 ]; then
    failed=1
    tail -n 60 "$work/test-$i.log" >&2
  fi
done
{
  echo "# The test suite under CPU load"
  echo
  echo "\`scripts/test-under-load.sh $runs\` on commit $commit, $(date -u '+%Y-%m-%d %H:%M UTC'):"
  echo "\`scripts/test.sh\` $runs times in a row on a fresh clone ($(nproc) cores), while another"
  echo "clone builds the project in release mode in a loop. The first run includes building the"
  echo "tests. Load average: 1, 5 and 15 minutes at the end of each run."
  echo
  echo "| run | exit | seconds | tests passed | load average |"
  echo "|---|---|---|---|---|"
  printf '%s\n' "${results[@]}"
} >"$out"
log "written: $out"
exit "$failed"
