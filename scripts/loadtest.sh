#!/usr/bin/env bash
# Load test: batched vs per-message on the same input, in the same run, against a real broker.
#
#   scripts/loadtest.sh           full run (1,000,000 messages), results in results/
#   scripts/loadtest.sh --quick   smoke run (small input, < 3 minutes), results in target/loadtest-quick/
#
# Steps: build release; ensure PostgreSQL (with pg_stat_statements, to count statements); start
# a nisshi broker (or use $KAFKA_BROKERS); produce ONE input set with duplicates, bad input and overdrafts;
# then, each on a fresh database and consumer group, drain it with: the per-message baseline, the
# batched mode over a batch-size sweep, the SQL handler (examples/sql/balances_upsert.sql) per
# message and batched, and a consume-only drain (broker/client ceiling); copy the
# same ids with binary COPY (database ceiling); run fixed-rate latency runs at half the best
# batched throughput. Every processor run is verified against the generator's model: a run that
# is fast and wrong fails the script. Finally writes summary.md and SVG plots.
#
# Overridable: MESSAGES, ACCOUNTS, PARTITIONS, DUPLICATE_RATIO, BAD_RATIO, DEBIT_RATIO, ID_VERSION,
# BATCH_SIZES, SQL_BATCH_SIZE (the SQL handler's batched run), LATENCY_RUNS (batch size:percent of the best batched throughput), LATENCY_SECONDS, LINGER_MS, POOL_SIZE, KAFKA_BROKERS, OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

quick=0
[ "${1:-}" = "--quick" ] && quick=1
if [ "$quick" = 1 ]; then
  MESSAGES=${MESSAGES:-40000}; ACCOUNTS=${ACCOUNTS:-5000}
  BATCH_SIZES=${BATCH_SIZES:-"1 100 1000"}; LATENCY_RUNS=${LATENCY_RUNS:-"1000:50"}
  LATENCY_SECONDS=${LATENCY_SECONDS:-10}; OUT=${OUT:-target/loadtest-quick}
else
  MESSAGES=${MESSAGES:-1000000}; ACCOUNTS=${ACCOUNTS:-100000}
  BATCH_SIZES=${BATCH_SIZES:-"1 10 100 500 1000 5000"}
  LATENCY_RUNS=${LATENCY_RUNS:-"100:25 500:25 1000:25 500:50 1000:50"}
  LATENCY_SECONDS=${LATENCY_SECONDS:-20}; OUT=${OUT:-results}
fi
PARTITIONS=${PARTITIONS:-8}; DUPLICATE_RATIO=${DUPLICATE_RATIO:-0.1}; BAD_RATIO=${BAD_RATIO:-0.01}
DEBIT_RATIO=${DEBIT_RATIO:-0.3}; ID_VERSION=${ID_VERSION:-7}; LINGER_MS=${LINGER_MS:-20}
POOL_SIZE=${POOL_SIZE:-$PARTITIONS}; SQL_BATCH_SIZE=${SQL_BATCH_SIZE:-1000}

bin=./target/release/batch-inbox bench=./target/release/batch-inbox-bench
work=$(mktemp -d)
runs="$OUT/loadtest/runs"
cpu="$OUT/loadtest/cpu"
mkdir -p "$runs" "$cpu"
rm -f "$runs"/*.json "$cpu"/*.json
stamp=$(date +%s)
broker_pid=""
cleanup() {
  [ -n "$broker_pid" ] && kill "$broker_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

log() { echo "[loadtest $(date +%T)] $*" >&2; }

enable_pg_stat_statements() {
  local libs
  libs=$(psql -Atq -h 127.0.0.1 -U postgres -c "SHOW shared_preload_libraries")
  if [[ "$libs" != *pg_stat_statements* ]]; then
    log "enabling pg_stat_statements (restarts PostgreSQL once)"
    psql -q -h 127.0.0.1 -U postgres -c "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | sort -V | tail -n 1)" main restart
    ensure_postgres
  fi
}

start_broker() {
  if [ -n "${KAFKA_BROKERS:-}" ]; then
    log "using broker $KAFKA_BROKERS"
    return
  fi
  start_nisshi "$work/broker.log"
  broker_pid=$BROKER_PID
  export KAFKA_BROKERS=$BROKER_ADDR
  log "nisshi broker on $KAFKA_BROKERS"
}

db_url() { echo "postgres://postgres@127.0.0.1:5432/$1"; }

# CPU seconds used by the whole machine, and by the broker process (0 for an external broker).
machine_cpu() { awk '/^cpu /{print ($2+$3+$4+$7+$8+$9)/100}' /proc/stat; }
broker_cpu() {
  [ -n "$broker_pid" ] || { echo 0; return; }
  awk '{sub(/.*\) /, ""); print ($12+$13)/100}' "/proc/$broker_pid/stat"
}

# cpu_mark LABEL start|stop: where the machine's CPU went during a run.
cpu_mark() {
  if [ "$2" = start ]; then
    cpu_t0=$(date +%s.%N); cpu_m0=$(machine_cpu); cpu_b0=$(broker_cpu)
  else
    python3 - "$cpu/$1.json" "$cpu_t0" "$(date +%s.%N)" "$cpu_m0" "$(machine_cpu)" "$cpu_b0" "$(broker_cpu)" <<'PY'
import json, sys
f, t0, t1, m0, m1, b0, b1 = sys.argv[1], *map(float, sys.argv[2:])
json.dump({"wall_s": t1 - t0, "machine_cpu_s": m1 - m0, "broker_cpu_s": b1 - b0}, open(f, "w"))
PY
  fi
}

# run_drain LABEL TOPIC [run flags...]: fresh database and group, drain, verify, report.
run_drain() {
  local label=$1 topic=$2; shift 2
  local db="bi_lt_${label//-/_}"
  fresh_database "$db"
  DATABASE_URL=$(db_url "$db") $bin migrate >/dev/null
  log "run $label"
  cpu_mark "$label" start
  local expect=()
  if [ "${1:-}" = --expect ]; then expect=(--expect "$2"); shift 2; fi
  # --sums: the balances are the sums of every new entry (the SQL handler's balances upsert).
  if [ "${1:-}" = --sums ]; then expect+=(--sums); shift; fi
  DATABASE_URL=$(db_url "$db") RUST_LOG=warn $bench drain --label "$label" \
    --report "$runs/$label.json" "${expect[@]}" -- $bin run --topic "$topic" \
    --group "$label-$stamp" --exit-on-eof --pool-size "$POOL_SIZE" \
    --batch-linger-ms "$LINGER_MS" "$@" | tee -a "$work/runs.log"
  cpu_mark "$label" stop
}

machine_json() {
  python3 - "$OUT/loadtest/machine.json" <<PY
import json, os, subprocess, sys, platform, datetime
def q(sql):
    return subprocess.run(["psql","-Atq","-h","127.0.0.1","-U","postgres","-c",sql],capture_output=True,text=True).stdout.strip()
mem = next(int(l.split()[1]) for l in open("/proc/meminfo") if l.startswith("MemTotal"))
def fsync_rate():
    # The per-message baseline's limit: one WAL flush per message (fdatasync, one 8 kB write).
    import glob, re
    tools = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_test_fsync"))
    if not tools:
        return None
    data = q("SHOW data_directory")
    out = subprocess.run([tools[-1], "-s", "1", "-f", os.path.join(data, "..", "batch_inbox_fsync_test")],
                         capture_output=True, text=True).stdout
    m = re.search(r"fdatasync\s+([0-9.]+) ops/sec", out)
    return float(m.group(1)) if m else None
json.dump({
  "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
  "cores": os.cpu_count(), "memory_gib": round(mem/1048576, 1),
  "kernel": platform.release(), "postgres_version": q("SHOW server_version"),
  "synchronous_commit": q("SHOW synchronous_commit"), "fsync": q("SHOW fsync"),
  "pg_test_fsync_fdatasync_ops_per_s": fsync_rate(),
  "broker": "nisshi ${NISSHI_VERSION} (memory storage)" if "${broker_pid}" else "${KAFKA_BROKERS:-}",
  "messages": ${MESSAGES}, "accounts": ${ACCOUNTS}, "partitions": ${PARTITIONS},
  "duplicate_ratio": ${DUPLICATE_RATIO}, "bad_ratio": ${BAD_RATIO}, "debit_ratio": ${DEBIT_RATIO},
  "id_version": ${ID_VERSION}, "linger_ms": ${LINGER_MS}, "pool_size": ${POOL_SIZE},
  "quick": bool(${quick}),
}, open(sys.argv[1], "w"), indent=2)
PY
}

best_batched_rate() {
  python3 - "$runs" <<'PY'
import json, glob, sys
rates = [json.load(open(f))["msgs_per_sec"] for f in glob.glob(sys.argv[1] + "/batched-b*.json")]
print(int(max(rates)) if rates else 1000)
PY
}

# latency_run BATCH RATE PERCENT: the processor waits on an empty topic; then input arrives at
# RATE/s (PERCENT of the best batched throughput).
latency_run() {
  local size=$1 rate=$2 label="latency-b$1-r$3" topic="latency-b$1-r$3-$stamp"
  local n=$(( rate * LATENCY_SECONDS ))
  local db="bi_lt_${label//-/_}"
  fresh_database "$db"
  DATABASE_URL=$(db_url "$db") $bin migrate >/dev/null
  $bench produce --topic "$topic" --partitions "$PARTITIONS" --messages 0 >/dev/null
  log "run $label: $n messages at $rate/s"
  DATABASE_URL=$(db_url "$db") RUST_LOG=info $bench drain --label "$label" \
    --report "$runs/$label.json" --input-rate "$rate" --stop-after "$n" \
    --expect "$work/$label.expected.json" -- $bin run --topic "$topic" \
    --group "$label-$stamp" --batch-size "$size" --batch-linger-ms "$LINGER_MS" \
    --pool-size "$POOL_SIZE" >>"$work/runs.log" 2>"$work/$label.err" &
  local run_pid=$!
  for _ in $(seq 1 300); do
    [ "$(grep -c 'partition assigned' "$work/$label.err" || true)" -ge "$PARTITIONS" ] && break
    sleep 0.1
  done
  $bench produce --topic "$topic" --messages "$n" --accounts "$ACCOUNTS" --rate "$rate" \
    --duplicate-ratio "$DUPLICATE_RATIO" --bad-ratio "$BAD_RATIO" --debit-ratio "$DEBIT_RATIO" \
    --id-version "$ID_VERSION" --seed 2 --expect "$work/$label.expected.json" >/dev/null
  wait "$run_pid" || { cat "$work/$label.err" >&2; return 1; }
}

log "building release"
cargo build --release --quiet --workspace --bins
ensure_postgres
enable_pg_stat_statements
start_broker
machine_json

topic="loadtest-$stamp"
log "producing $MESSAGES messages to $topic ($PARTITIONS partitions)"
$bench produce --topic "$topic" --partitions "$PARTITIONS" --messages "$MESSAGES" \
  --accounts "$ACCOUNTS" --duplicate-ratio "$DUPLICATE_RATIO" --bad-ratio "$BAD_RATIO" \
  --debit-ratio "$DEBIT_RATIO" --id-version "$ID_VERSION" --expect "$work/expected.json"
expect="$work/expected.json"

run_drain per-message "$topic" --expect "$expect" --mode per-message
largest=0
for size in $BATCH_SIZES; do
  run_drain "batched-b$size" "$topic" --expect "$expect" --batch-size "$size"
  [ "$size" -gt "$largest" ] && largest=$size
done
# The SQL handler on the same input, next to the Rust ledger: one aggregate upsert per batch,
# checked against the model without the ledger's overdraft rule.
sql=(--handler sql --apply-sql examples/sql/balances_upsert.sql)
run_drain sql-per-message "$topic" --expect "$expect" --sums --mode per-message "${sql[@]}"
run_drain sql-batched "$topic" --expect "$expect" --sums --batch-size "$SQL_BATCH_SIZE" "${sql[@]}"
# The broker-and-client ceiling: the same pipeline without any database work.
db="bi_lt_consume_only"
fresh_database "$db"
log "run consume-only"
cpu_mark consume-only start
DATABASE_URL=$(db_url "$db") RUST_LOG=warn $bench drain --label consume-only \
  --report "$runs/consume-only.json" -- $bench consume-only --topic "$topic" \
  --group "consume-only-$stamp" --batch-size 1000 --pool-size "$POOL_SIZE" \
  --batch-linger-ms "$LINGER_MS" | tee -a "$work/runs.log"
cpu_mark consume-only stop
log "COPY ceiling with the ids of batched-b$largest"
$bench copy-ceiling --database-url "$(db_url "bi_lt_batched_b$largest")" --streams "$PARTITIONS" \
  --report "$runs/copy-ceiling.json"
if [ "$quick" = 0 ]; then
  run_drain backlog-1m "$topic" --expect "$expect" --batch-size 1000
fi

best=$(best_batched_rate)
for run in $LATENCY_RUNS; do
  size=${run%%:*} percent=${run##*:}
  latency_run "$size" $(( best * percent / 100 )) "$percent"
done

$bench summary --input "$OUT/loadtest" --output "$OUT"
log "done: $OUT/summary.md"
