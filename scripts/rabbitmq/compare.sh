#!/usr/bin/env bash
# RabbitMQ in one run, on the same machine and database server as the Kafka load test: the
# broker's own floor (the queues read with the processor's prefetch and acknowledged by batches,
# nothing applied: `batch-inbox-bench amqp-consume-only`), the per-message baseline
# (`--mode per-message`) and the batched default, each on the same generated input (ledger
# entries, 10% duplicates, 1% bad input, published with their id in `message_id`) in queues of
# its own, on a RabbitMQ node of the run's own. Each run of ours is checked against the model
# (`batch-inbox-bench verify`); the script fails when one differs.
#
#   scripts/rabbitmq/compare.sh                     MESSAGES=200000 QUEUES=4, results/rabbitmq/
#   MESSAGES=20000 OUT=/tmp/r scripts/rabbitmq/compare.sh
#
# Environment: MESSAGES, QUEUES (each account's records go to one of them), QUEUE_TYPE (classic
# or quorum), ACCOUNTS (1000), SEED (1), OUT (results/rabbitmq), MACHINE_NOTE (what else ran on
# the machine meanwhile, as the results state it). Databases: ${TEST_DATABASE_PREFIX:-bi_}rabbitmq_*.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/lib.sh

MESSAGES=${MESSAGES:-200000}
QUEUES=${QUEUES:-4}
QUEUE_TYPE=${QUEUE_TYPE:-classic}
ACCOUNTS=${ACCOUNTS:-1000}
SEED=${SEED:-1}
OUT=${OUT:-results/rabbitmq}
PREFIX=${TEST_DATABASE_PREFIX:-bi_}
bin=./target/release/batch-inbox bench=./target/release/batch-inbox-bench
log() { echo "[$(date +%T)] $*" >&2; }

ensure_postgres
ensure_rabbitmq
log "building the release binaries"
cargo build --release -q -p batch-inbox -p batch-inbox-tools --bins
work=$(mktemp -d /tmp/rabbitmq-compare.XXXXXX)
trap 'stop_rabbitmq "$work/node"; rm -rf "$work"' EXIT
start_rabbitmq "$work/node"
broker_pid=$(cat "$work/node/pid")
log "rabbitmq $("$AMQP_CTL" version) on ${AMQP_URL#*@}, pid $broker_pid"
pg_data=$(psql -X -At -h 127.0.0.1 -U postgres -d postgres -c 'SHOW data_directory')
cpu=(--machine --postgres-data "$pg_data" --broker "$broker_pid")
mkdir -p "$OUT"
: >"$work/rows.jsonl"

# queues RUN: the run's queue flags.
queues() {
  local i
  for i in $(seq 1 "$QUEUES"); do printf -- '--queue\nrmq-%s-%s\n' "$1" "$i"; done
}
# publish RUN: the input into the run's queues (timed apart from the run).
publish() {
  local -a q
  mapfile -t q < <(queues "$1")
  log "$1: publishing $MESSAGES records to $QUEUES $QUEUE_TYPE queues"
  $bench amqp-publish --url "$AMQP_URL" "${q[@]}" --queue-type "$QUEUE_TYPE" \
    --messages "$MESSAGES" --accounts "$ACCOUNTS" --duplicate-ratio 0.1 --bad-ratio 0.01 \
    --seed "$SEED" --expect "$work/expect.json" >&2
}
# row RUN MSGS_PER_S CPU_JSON NOTE: one line of rows.jsonl.
row() {
  python3 - "$1" "$2" "$3" "$4" "$MESSAGES" >>"$work/rows.jsonl" <<'PY'
import json, sys
run, rate, cpu_path, note, n = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
c = json.load(open(cpu_path))
per_k = lambda k: round(1e6 * c.get(k, 0.0) / n, 1)
print(json.dumps({"run": run, "records": n, "msgs_per_s": round(rate), "wall_s": round(c["wall_s"], 2),
  "cpu_ms_per_1k": {"process": per_k("process_cpu_s"), "broker": per_k("broker_cpu_s"),
  "postgres": per_k("postgres_cpu_s"), "machine": per_k("machine_cpu_s")}, "note": note}))
PY
}

# The broker's floor.
publish floor
mapfile -t q < <(queues floor)
log "floor: amqp-consume-only"
$bench cpu run --out "$work/cpu.json" "${cpu[@]}" -- \
  $bench amqp-consume-only --url "$AMQP_URL" "${q[@]}" --queue-type "$QUEUE_TYPE" \
  --messages "$MESSAGES" --batch-size 1000 --out "$work/floor.json" >&2
row floor "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["msgs_per_sec"])' "$work/floor.json")" \
  "$work/cpu.json" "read and acknowledged by 1000 (multiple), nothing applied; prefetch 2000"

# ours RUN [flags...]: the processor on the run's queues, to their end, checked against the model.
ours() {
  local run=$1 db="${PREFIX}rabbitmq_$1"
  shift
  publish "$run"
  fresh_database "$db"
  DATABASE_URL="postgres://postgres@127.0.0.1:5432/$db" $bin migrate >/dev/null
  mapfile -t q < <(queues "$run")
  log "$run: batch-inbox run $*"
  $bench cpu run --out "$work/cpu.json" "${cpu[@]}" -- \
    env DATABASE_URL="postgres://postgres@127.0.0.1:5432/$db" RUST_LOG=warn \
    $bin run --source "$AMQP_URL" "${q[@]}" --queue-type "$QUEUE_TYPE" --exit-on-eof \
    --log-interval 0 --stats-file "$work/$run.stats.json" "$@" >&2
  DATABASE_URL="postgres://postgres@127.0.0.1:5432/$db" $bench verify --expect "$work/expect.json" >&2
  row "$run" "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["msgs_per_sec"])' "$work/$run.stats.json")" \
    "$work/cpu.json" "${*:-defaults}; checked against the model"
}
ours per-message --mode per-message
ours batched

cp "$work/rows.jsonl" "$OUT/rows.jsonl"
python3 - "$work/rows.jsonl" "$OUT/results.md" "$MESSAGES" "$QUEUES" "$QUEUE_TYPE" \
  "$("$AMQP_CTL" version)" "${MACHINE_NOTE:-other work on the machine during the measurement not stated}" \
  "$(uptime | sed 's/.*load average: //')" <<'PY'
import json, sys, datetime
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
out, n, queues, kind, version, note, load = sys.argv[2:9]
by = {r["run"]: r for r in rows}
lines = [
  "# batch-inbox on RabbitMQ: the broker's floor, the per-message baseline and the batched default",
  "",
  f"Written by `scripts/rabbitmq/compare.sh` on {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC: RabbitMQ {version} (Debian's package, one node), PostgreSQL on the same host, **{note}** (load average at the end: {load}).",
  "",
  f"Input: {int(n):,} generated ledger entries (10% duplicates, 1% bad input), published persistent with their id in `message_id` to {queues} {kind} queues (each account's records to one queue), once per run into queues of the run's own. msgs/s: from the first delivery to the last acknowledgement (floor) or COMMIT (ours: the stats file's window). CPU in ms per 1000 records over the run's process lifetime: the process, the broker (its Erlang VM), PostgreSQL (every backend), the whole machine.",
  "",
  "| run | msgs/s | CPU: process · broker · PostgreSQL · machine | note |",
  "| --- | ---: | ---: | --- |",
]
for r in rows:
    c = r["cpu_ms_per_1k"]
    lines.append(f"| {r['run']} | {r['msgs_per_s']:,} | {c['process']} · {c['broker']} · {c['postgres']} · {c['machine']} | {r['note']} |")
if {"floor", "batched", "per-message"} <= by.keys():
    b, f, p = by["batched"]["msgs_per_s"], by["floor"]["msgs_per_s"], by["per-message"]["msgs_per_s"]
    lines += ["", f"Batched: {b / f:.0%} of the broker's floor, {b / p:.1f}× the per-message baseline."]
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
