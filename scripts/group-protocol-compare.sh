#!/usr/bin/env bash
# The two consumer group protocols side by side under the same membership changes, on one
# Apache Kafka node: the classic protocol (cooperative-sticky, the processor's default) and the
# consumer protocol of KIP-848 (-X group.protocol=consumer, the broker assigns).
#
#   scripts/group-protocol-compare.sh [--out DIR]      (default results/group-protocol)
#
# For each protocol, on a fresh database and topic (8 partitions): a paced producer writes
# RATE records/s (default 2000) for SECONDS (default 40), every id distinct; member A starts, B
# joins after 8 s, A leaves (SIGTERM) 8 s later, C joins 8 s after that; once the producer is done
# and Kafka's ConsumerGroupCommand reports lag 0, B and C stop. Reported per protocol: records
# read by all members beyond those produced (records read again after a handover: in flight at
# a move), and the end-to-end latency (record timestamp to COMMIT) across members, whose tail is
# the pause a rebalance costs. Each run's database is checked against the generator's model.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

out=results/group-protocol
[ "${1:-}" = --out ] && out=$2
RATE=${RATE:-2000} SECONDS_=${SECONDS_:-40}
bin=./target/release/batch-inbox bench=./target/release/batch-inbox-bench
work=$(mktemp -d /tmp/group-protocol.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  stop_broker "$work"
  rm -rf "$work"
}
trap cleanup EXIT
log() { echo "[group-protocol $(date +%T)] $*" >&2; }

cargo build --release --quiet --workspace --bins
ensure_postgres
start_kafka "$work/kafka"
brokers=$BROKER_ADDR
mkdir -p "$out"
stamp=$(date +%s)

member() { # NAME PROTOCOL TOPIC GROUP DB
  local flags=()
  [ "$2" = consumer ] && flags=(-X group.protocol=consumer)
  DATABASE_URL="postgres://postgres@127.0.0.1:5432/$5" RUST_LOG=info,rdkafka=warn \
    $bin run --topic "$3" --group "$4" --log-format json --log-interval 0 \
    --stats-file "$work/$2-$1.json" --stats-interval 250ms "${flags[@]}" \
    >"$work/$2-$1.out" 2>"$work/$2-$1.log" &
  pids+=($!)
  echo $!
}

for proto in classic consumer; do
  topic="gp-$proto-$stamp" group="gp-$proto-$stamp" db="bi_gp_$proto"
  fresh_database "$db"
  DATABASE_URL="postgres://postgres@127.0.0.1:5432/$db" $bin migrate >/dev/null
  # The topic first, so that A is assigned its partitions before the clock starts.
  KAFKA_BROKERS=$brokers $bench produce --topic "$topic" --partitions 8 --messages 0 \
    >/dev/null 2>&1 || true
  log "$proto: A starts"
  export KAFKA_BROKERS=$brokers
  a=$(member A "$proto" "$topic" "$group" "$db")
  $bench produce --topic "$topic" --partitions 8 --messages $((RATE * SECONDS_)) \
    --rate "$RATE" --duplicate-ratio 0 --bad-ratio 0 --debit-ratio 0 \
    --expect "$work/$proto-expected.json" >"$work/$proto-produce.out" 2>&1 &
  producer=$!
  sleep 8
  log "$proto: B joins"
  member B "$proto" "$topic" "$group" "$db" >/dev/null
  sleep 8
  log "$proto: A leaves"
  kill -TERM "$a"
  wait "$a" || true
  sleep 8
  log "$proto: C joins"
  member C "$proto" "$topic" "$group" "$db" >/dev/null
  wait "$producer"
  for _ in $(seq 1 120); do
    kafka_group_lag_zero "$brokers" "$group" 2>/dev/null && break
    sleep 1
  done
  kafka_group_lag_zero "$brokers" "$group"
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
  DATABASE_URL="postgres://postgres@127.0.0.1:5432/$db" $bench verify \
    --expect "$work/$proto-expected.json" >"$work/$proto-verify.out"
  log "$proto: database equals the model"
done

$bench group-protocol-report --work "$work" --out "$out" --rate "$RATE" --seconds "$SECONDS_" \
  --kafka-version "$KAFKA_VERSION"
