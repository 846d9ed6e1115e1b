#!/usr/bin/env bash
# RabbitMQ at fixed rates: the batched default on QUEUES queues, the input published paced at
# each rate for SECONDS seconds (ledger entries, 10% duplicates, 1% bad input), each record's
# latency from its `timestamp_in_ms` header (set when it is published) to its batch's COMMIT, as
# the processor's stats file measures it; each run checked against the model (`drain --expect`).
# On a RabbitMQ node of the run's own and the machine's PostgreSQL, like compare.sh.
#
#   scripts/rabbitmq/latency.sh                    RATES="1000 5000 10000 20000", results/rabbitmq/
#   RATES=1000 SECONDS_PER_RATE=5 OUT=/tmp/l scripts/rabbitmq/latency.sh
#
# Environment: RATES, SECONDS_PER_RATE (20), QUEUES (4), QUEUE_TYPE (classic), ACCOUNTS (1000),
# OUT (results/rabbitmq: latency.md and latency.jsonl), MACHINE_NOTE (what else ran meanwhile).
# Databases: ${TEST_DATABASE_PREFIX:-bi_}rabbitmq_latency_*.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/lib.sh

RATES=${RATES:-1000 5000 10000 20000}
SECONDS_PER_RATE=${SECONDS_PER_RATE:-20}
QUEUES=${QUEUES:-4}
QUEUE_TYPE=${QUEUE_TYPE:-classic}
ACCOUNTS=${ACCOUNTS:-1000}
OUT=${OUT:-results/rabbitmq}
PREFIX=${TEST_DATABASE_PREFIX:-bi_}
bin=./target/release/batch-inbox bench=./target/release/batch-inbox-bench
log() { echo "[$(date +%T)] $*" >&2; }

ensure_postgres
ensure_rabbitmq
log "building the release binaries"
cargo build --release -q -p batch-inbox -p batch-inbox-tools --bins
work=$(mktemp -d /tmp/rabbitmq-latency.XXXXXX)
drain_pid=""
cleanup() {
  [ -n "$drain_pid" ] && kill "$drain_pid" 2>/dev/null
  stop_rabbitmq "$work/node"
  rm -rf "$work"
}
trap cleanup EXIT
start_rabbitmq "$work/node"
log "rabbitmq $("$AMQP_CTL" version) on ${AMQP_URL#*@}"
mkdir -p "$OUT"
: >"$work/latency.jsonl"

for rate in $RATES; do
  run="r$rate" n=$((rate * SECONDS_PER_RATE)) db="${PREFIX}rabbitmq_latency_r$rate"
  q=()
  for i in $(seq 1 "$QUEUES"); do q+=(--queue "rmq-lat-$rate-$i"); done
  fresh_database "$db"
  export DATABASE_URL="postgres://postgres@127.0.0.1:5432/$db"
  $bin migrate >/dev/null
  log "$run: $n records at $rate/s"
  # The processor waits on its empty queues; drain stops it once it committed every record.
  RUST_LOG=warn $bench drain --label "rabbitmq-$run" --report "$work/$run.json" \
    --input-rate "$rate" --stop-after "$n" --expect "$work/$run.expect.json" -- \
    $bin run --source "$AMQP_URL" "${q[@]}" --queue-type "$QUEUE_TYPE" --log-interval 0 \
    >"$work/$run.out" 2>"$work/$run.err" &
  drain_pid=$!
  # Until every queue has its consumer (at most 60 s).
  consumers=0
  for _ in $(seq 1 600); do
    consumers=$("$AMQP_CTL" list_consumers -q 2>/dev/null | grep -c "rmq-lat-$rate-" || true)
    [ "$consumers" -ge "$QUEUES" ] && break
    sleep 0.1
  done
  if [ "$consumers" -lt "$QUEUES" ]; then
    log "$run: $consumers of $QUEUES consumers after 60 s"
    cat "$work/$run.err" >&2
    exit 1
  fi
  $bench amqp-publish --url "$AMQP_URL" "${q[@]}" --queue-type "$QUEUE_TYPE" --rate "$rate" \
    --messages "$n" --accounts "$ACCOUNTS" --duplicate-ratio 0.1 --bad-ratio 0.01 --seed 3 \
    --expect "$work/$run.expect.json" | tee "$work/$run.published" >&2
  if ! wait "$drain_pid"; then
    drain_pid=""
    cat "$work/$run.err" >&2
    exit 1
  fi
  drain_pid=""
  python3 - "$work/$run.json" "$rate" "$n" "$work/$run.published" >>"$work/latency.jsonl" <<'PY'
import json, re, sys
r = json.load(open(sys.argv[1]))
# "published N records in S s (R/s)": the rate the publisher achieved.
achieved = float(re.search(r"\(([0-9.]+)/s\)", open(sys.argv[4]).read()).group(1))
m = r
pick = lambda p: {k: round(p[k], 1) for k in ("p50", "p90", "p99", "p999", "max")}
print(json.dumps({"rate": int(sys.argv[2]), "achieved": round(achieved), "records": int(sys.argv[3]),
  "verified": r.get("verified"), "e2e_ms": pick(m["e2e_latency_ms"]),
  "receive_ms": pick(m["receive_latency_ms"]), "batch_size_p50": m["batch_size"]["p50"]}))
PY
done

cp "$work/latency.jsonl" "$OUT/latency.jsonl"
python3 - "$work/latency.jsonl" "$OUT/latency.md" "$QUEUES" "$QUEUE_TYPE" "$("$AMQP_CTL" version)" \
  "$SECONDS_PER_RATE" "${MACHINE_NOTE:-other work on the machine during the measurement not stated}" \
  "$(uptime | sed 's/.*load average: //')" <<'PY'
import json, sys, datetime
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
out, queues, kind, version, secs, note, load = sys.argv[2:9]
lines = [
  "# batch-inbox on RabbitMQ at fixed rates",
  "",
  f"Written by `scripts/rabbitmq/latency.sh` on {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC: RabbitMQ {version} (one node), PostgreSQL on the same host, **{note}** (load average at the end: {load}).",
  "",
  f"The batched default on {queues} {kind} queues, waiting on them empty; then {secs} s of input published paced at each rate with publisher confirms (ledger entries, 10% duplicates, 1% bad input), every run checked against the model. Latency per record in ms: end to end from the `timestamp_in_ms` header the publisher sets to its batch's COMMIT; receive from that header to its arrival at the queue's worker (publisher, broker and client).",
  "",
  "| msgs/s | published at | records | end to end p50 | p90 | p99 | p99.9 | max | receive p50 | receive p99 | batch size p50 | checked |",
  "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
]
for r in rows:
    e, v = r["e2e_ms"], r["receive_ms"]
    short = " (short of the rate)" if r["achieved"] < 0.95 * r["rate"] else ""
    lines.append(f"| {r['rate']:,} | {r['achieved']:,}{short} | {r['records']:,} | {e['p50']} | {e['p90']} | {e['p99']} | {e['p999']} | {e['max']} | {v['p50']} | {v['p99']} | {r['batch_size_p50']} | {'exact' if r['verified'] else r['verified']} |")
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
