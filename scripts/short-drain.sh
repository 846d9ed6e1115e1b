#!/usr/bin/env bash
# A short backlog drained with the default settings: round four's second target (≥ 30× the
# per-message baseline, from the first record's arrival to the last COMMIT, the stats file's
# window). Produces MESSAGES (40,000) records once (8 partitions, 10% duplicates, 1% bad input),
# then drains them ROUNDS (5) times with the default settings and twice per message, each on a
# fresh database and group, every run checked against the generator's model. With VS=BINARY,
# each default-settings drain is paired with one by that binary (another build), in turn, so
# that a change is measured against what it changes on the same minutes of the machine.
#
#   scripts/short-drain.sh                       results in results/short-drain/
#   VS=/tmp/batch-inbox-before scripts/short-drain.sh
#
# Overridable: MESSAGES, ACCOUNTS (5000), PARTITIONS (8), ROUNDS, VS, OUT (results/short-drain),
# KAFKA_BROKERS (an existing broker; otherwise an Apache Kafka node of its own).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
MESSAGES=${MESSAGES:-40000} ACCOUNTS=${ACCOUNTS:-5000} PARTITIONS=${PARTITIONS:-8}
ROUNDS=${ROUNDS:-5} VS=${VS:-} OUT=${OUT:-results/short-drain}
bin=./target/release/batch-inbox bench=./target/release/batch-inbox-bench
work=$(mktemp -d)
trap 'stop_broker "$work/broker"; rm -rf "$work"' EXIT
cargo build --release --quiet --workspace --bins
ensure_postgres
if [ -z "${KAFKA_BROKERS:-}" ]; then
  start_broker "$work/broker"
  export KAFKA_BROKERS=$BROKER_ADDR
fi
mkdir -p "$OUT/runs"
rm -f "$OUT"/runs/*.json
topic="short-drain-$(date +%s)"
$bench produce --topic "$topic" --partitions "$PARTITIONS" --messages "$MESSAGES" \
  --accounts "$ACCOUNTS" --duplicate-ratio 0.1 --bad-ratio 0.01 --seed 1 \
  --expect "$work/expected.json" >/dev/null

# drain LABEL BINARY [run flags…]: one drain on a fresh database and group; prints msgs/s.
drain() {
  local label=$1 binary=$2; shift 2
  fresh_database bi_short_drain >/dev/null
  local url=postgres://postgres@127.0.0.1:5432/bi_short_drain
  DATABASE_URL=$url "$binary" migrate --handler ledger >/dev/null
  DATABASE_URL=$url RUST_LOG=warn $bench drain --label "$label" --report "$OUT/runs/$label.json" \
    --expect "$work/expected.json" -- "$binary" run --topic "$topic" \
    --group "$label-$RANDOM$RANDOM" --exit-on-eof "$@" >/dev/null
  $bench json get "$OUT/runs/$label.json" msgs_per_sec
}

for round in 1 2; do
  drain "per-message-$round" "$bin" --mode per-message >>"$work/per-message"
done
for round in $(seq 1 "$ROUNDS"); do
  drain "default-$round" "$bin" >>"$work/default"
  [ -n "$VS" ] && drain "vs-$round" "$VS" >>"$work/vs"
done

# The median of the numbers in file $1.
median() { sort -g "$1" | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
{
  echo "# A short backlog, default settings"
  echo
  echo "$MESSAGES records ($PARTITIONS partitions, $ACCOUNTS accounts, 10% duplicates, 1% bad" \
    "input), the reference ledger, each drain on a fresh database and group, msgs/s over the" \
    "stats file's window (first record's arrival to last COMMIT). \`scripts/short-drain.sh\`" \
    "on $(date -u '+%Y-%m-%d %H:%M') UTC; load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)."
  echo
  echo "| drains | msgs/s, each | median | × per-message |"
  echo "|---|---|---:|---:|"
  pm=$(median "$work/per-message")
  for kind in per-message default vs; do
    [ -s "$work/$kind" ] || continue
    m=$(median "$work/$kind")
    each=$(awk '{ printf "%s%.0f", (NR > 1 ? " · " : ""), $1 }' "$work/$kind")
    name=$kind
    [ "$kind" = vs ] && name="VS ($(basename "$VS"))"
    awk -v n="$name" -v e="$each" -v m="$m" -v p="$pm" \
      'BEGIN { printf "| %s | %s | %.0f | %.1f× |\n", n, e, m, m / p }'
  done
} >"$OUT/summary.md"
cat "$OUT/summary.md"
