#!/usr/bin/env bash
# The log lines of a broker outage: one processor applies a topic of one Apache Kafka node while
# records arrive (4 partitions, 200 records/s), the node is killed for DOWN seconds (default 20)
# and started again, and the processor's WARN lines are counted by message, from the kill until
# AFTER seconds (default 30) after the restart. BIN is the processor to measure (default the
# debug build), OUT the directory of its log and the counts (results/outage-lines/NAME).
#
#   scripts/outage-lines.sh NAME
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
name=${1:?usage: scripts/outage-lines.sh NAME}
bin=${BIN:-target/debug/batch-inbox}
bench=${BENCH:-target/debug/batch-inbox-bench}
down=${DOWN:-20} after=${AFTER:-30}
out=results/outage-lines/$name
work=$(mktemp -d /tmp/outage-lines.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  stop_kafka "$work/kafka"
  rm -rf "$work"
}
trap cleanup EXIT
log() { echo "[outage-lines $(date +%T)] $*" >&2; }

ensure_postgres
start_kafka "$work/kafka"
export KAFKA_BROKERS=$BROKER_ADDR
db=bi_outage_lines topic=outage-lines-$(date +%s)
fresh_database "$db"
export DATABASE_URL="postgres://postgres@127.0.0.1:5432/$db"
$bin migrate >/dev/null
$bench produce --topic "$topic" --partitions 4 --messages 0 >/dev/null 2>&1 || true
mkdir -p "$out"
RUST_LOG=info $bin run --topic "$topic" --group "$topic" --log-format json --log-interval 0 \
  >"$work/run.out" 2>"$out/log.jsonl" &
pids+=($!)
$bench produce --topic "$topic" --partitions 4 --messages 1000000 --rate 200 --bad-ratio 0 \
  -X message.timeout.ms=600000 >"$work/produce.out" 2>&1 &
pids+=($!)
sleep 15
killed_at=$(date -u +%FT%T)
log "killing the node for $down s"
kafka_node_kill "$work/kafka" 1
sleep "$down"
log "starting it again"
kafka_node_start "$work/kafka" 1
sleep "$after"
kill -TERM "${pids[0]}"
wait "${pids[0]}" || true
$bench outage-lines --log "$out/log.jsonl" --since "$killed_at" --down "$down" >"$out/counts.txt"
cat "$out/counts.txt"
