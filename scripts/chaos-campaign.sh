#!/usr/bin/env bash
# Many chaos runs in a row, then one table of them all.
#
#   scripts/chaos-campaign.sh [--seeds "1 2 3"] [--duration SECONDS] [--out DIR] [chaos.sh flags...]
#
# Runs scripts/chaos.sh once per seed (default seeds 1-20, 60 s each) with its results in DIR
# (default results/chaos/apache-kafka-<version>), then writes DIR/summary.md from every chaos-*.json in
# DIR: one row per run (verdict, faults, partition moves, retries, replays, offset gaps, drain
# time) and the totals. Exit status: 0 when every run passed, 1 otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

seeds=$(seq -s ' ' 1 20) duration=60 out="results/chaos/apache-kafka-$KAFKA_VERSION" extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seeds) seeds=$2; shift ;;
    --duration) duration=$2; shift ;;
    --out) out=$2; shift ;;
    *) extra+=("$1") ;;
  esac
  shift
done
mkdir -p "$out"
failed=0
for seed in $seeds; do
  scripts/chaos.sh --seed "$seed" --duration "$duration" --results-dir "$out" "${extra[@]}" || failed=1
done
./target/release/batch-inbox-bench chaos summary "$out" >"$out/summary.md"
echo "wrote $out/summary.md" >&2
exit "$failed"
