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

python3 - "$work" "$out" "$RATE" "$SECONDS_" "$KAFKA_VERSION" <<'PY'
import json, sys, glob, os, datetime
work, out, rate, secs, kv = sys.argv[1:]
rows = []
for proto in ("classic", "consumer"):
    members = [json.load(open(f)) for f in sorted(glob.glob(f"{work}/{proto}-[ABC].json"))]
    produced = json.load(open(f"{work}/{proto}-expected.json"))
    produced = produced.get("records", produced.get("messages"))
    read = sum(m["stats"]["records"] for m in members)
    lat = [m["e2e_latency_ms"] for m in members if m.get("e2e_latency_ms", {}).get("count")]
    worst = lambda k: max(l[k] for l in lat)
    rows.append((proto, produced, read, read - produced, worst("p99"), worst("p999"), worst("max")))
with open(os.path.join(out, "README.md"), "w") as f:
    f.write(f"""# Consumer group protocols under membership changes

`scripts/group-protocol-compare.sh`, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, one Apache Kafka
{kv} node, PostgreSQL 15 (`synchronous_commit=on`), {os.cpu_count()} cores shared by all. A paced
producer writes {rate} records/s for {secs} s to 8 partitions; member A starts, B joins at 8 s, A
leaves (SIGTERM) at 16 s, C joins at 24 s. Each run's database equals the generator's model.

| protocol | produced | read by the members | read again | worst member's p99 ms | p99.9 ms | max ms |
|---|---:|---:|---:|---:|---:|---:|
""")
    for r in rows:
        f.write("| {} | {} | {} | {} | {:.1f} | {:.1f} | {:.1f} |\n".format(*r))
    f.write("""
Latency is from each record's timestamp (its intended send time) to the COMMIT of its batch;
its tail is the pause the membership changes cost, since records wait while their partition
has no owner. "read again": records delivered to a second member after their partition moved
(applied once, skipped by the inbox as duplicates).
""")
print(open(os.path.join(out, "README.md")).read())
PY
