#!/usr/bin/env bash
# Load test: batched vs per-message on the same input, in the same run, against a real broker.
#
#   scripts/loadtest.sh           full run (1,000,000 messages), results in results/
#   scripts/loadtest.sh --quick   smoke run (small input, a few minutes), results in target/loadtest-quick/
#   scripts/loadtest.sh --latency  the default settings at fixed rates alone: REPEATS (5) runs of
#                                 each of DEFAULT_RATES, the rates in turn (a rate's runs about
#                                 two minutes apart), with PostgreSQL's WAL syncs, their time and
#                                 the checkpoints while each run's input flows (PostgreSQL 15 or
#                                 16: pg_stat_wal's sync columns, pg_stat_bgwriter's checkpoints;
#                                 it switches track_wal_io_timing on and leaves it on); results
#                                 in results/latency/
#   scripts/loadtest.sh --sql-handler   the SQL handler against the Rust ledger alone: ROUNDS
#                                 (3) rounds of the ledger, the typed statement and the jsonb one
#                                 at SQL_BATCH_SIZE on one input of MESSAGES (400,000), in turn;
#                                 results in results/sql-handler/
#   scripts/loadtest.sh --soak    the default settings at SOAK_RATE (10,000 msgs/s) for
#                                 SOAK_MINUTES (30), sampled once a minute (`batch-inbox-bench
#                                 soak`): p99 from the processor's /metrics, CPU per record of
#                                 the processor, PostgreSQL and the broker, RSS, the inbox's size,
#                                 checkpoints, autovacuum runs, WAL syncs and the kernel's dirty
#                                 pages; a table and a plot in results/soak/ (switches
#                                 track_wal_io_timing on, as --latency does). The quick run ends
#                                 with the same soak, SOAK_MINUTES 5 there, in OUT/soak/.
#
# Steps: build release; ensure PostgreSQL (with pg_stat_statements, to count statements); start
# an Apache Kafka node (scripts/kafka/lib.sh; or use $KAFKA_BROKERS, or nisshi with NISSHI_BIN); produce ONE input set with duplicates, bad input and
# overdrafts; then, each on a fresh database and consumer group, drain it with: the per-message
# baseline, the batched mode over a batch-size sweep, natural batching, the SQL handler
# (examples/sql/balances_upsert.sql, on a database migrated with --handler sql and its table from
# examples/sql/balances.ddl.sql) per message and batched, and a consume-only drain
# (broker/client ceiling); replay the same records from memory with the same statements and
# handler and no Kafka (database-only ceiling); copy the same ids with binary COPY (raw database
# floor); drain with 1, 2 and 4 processes in one group (scale-out); drain a smaller input through
# a delaying TCP proxy in front of PostgreSQL (remote database, 0.5 and 2 ms each way); run
# fixed-rate latency runs at shares of the best batched throughput, each with a consume-only run at
# the same rate (the broker-and-client floor), and light traffic with the default settings. Every
# processor run is verified against the generator's model: a run that is fast and wrong fails the
# script. CPU is sampled per run for the machine, the broker and PostgreSQL's processes. Finally
# writes summary.md and SVG plots.
#
# The producer uses librdkafka's defaults (linger.ms=5), as an application would, with
# idempotence; a fixed-rate run's producer gets its producer id before its clock starts (one
# record to <topic>-warmup), and its acknowledgement times go into the run's report (acked_ms).
#
# Overridable: MESSAGES, ACCOUNTS, PARTITIONS, DUPLICATE_RATIO, BAD_RATIO, DEBIT_RATIO, ID_VERSION,
# BATCH_SIZES, SQL_BATCH_SIZE (the SQL handler's batched run), LATENCY_RUNS (batch size:percent of the best batched throughput[:natural]),
# DEFAULT_RATES (msgs/s of the default-settings runs at fixed rates, each with its floor),
# LIGHT_RATE (msgs/s of the default-settings runs), LATENCY_SECONDS, WARMUP_S, LINGER_MS, POOL_SIZE,
# REMOTE_MESSAGES, REMOTE_DELAYS_MS, SCALE_OUT, KAFKA_BROKERS, OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

quick=0 sql_only=0 latency_only=0 soak_only=0
[ "${1:-}" = "--quick" ] && quick=1
[ "${1:-}" = "--soak" ] && soak_only=1
mode_flag=${1:-}
[ "${1:-}" = "--sql-handler" ] && sql_only=1
[ "${1:-}" = "--latency" ] && latency_only=1
if [ "$latency_only" = 1 ]; then
  MESSAGES=${MESSAGES:-0}; ACCOUNTS=${ACCOUNTS:-100000}; OUT=${OUT:-results}
  DEFAULT_RATES=${DEFAULT_RATES:-"1000 5000 10000 20000"}; REPEATS=${REPEATS:-5}
  LATENCY_SECONDS=${LATENCY_SECONDS:-20}
elif [ "$soak_only" = 1 ]; then
  MESSAGES=${MESSAGES:-0}; ACCOUNTS=${ACCOUNTS:-100000}; OUT=${OUT:-results}
  SOAK_MINUTES=${SOAK_MINUTES:-30}
elif [ "$sql_only" = 1 ]; then
  MESSAGES=${MESSAGES:-400000}; ACCOUNTS=${ACCOUNTS:-100000}; OUT=${OUT:-results}
  ROUNDS=${ROUNDS:-3}
elif [ "$quick" = 1 ]; then
  MESSAGES=${MESSAGES:-40000}; ACCOUNTS=${ACCOUNTS:-5000}
  BATCH_SIZES=${BATCH_SIZES:-"1 100 1000"}; LATENCY_RUNS=${LATENCY_RUNS:-"1000:50"}
  DEFAULT_RATES=${DEFAULT_RATES:-"1000 5000"}
  LATENCY_SECONDS=${LATENCY_SECONDS:-10}; OUT=${OUT:-target/loadtest-quick}
  REMOTE_MESSAGES=${REMOTE_MESSAGES:-2000}; REMOTE_DELAYS_MS=${REMOTE_DELAYS_MS:-"2"}
  SCALE_OUT=${SCALE_OUT:-"2"}; SOAK_MINUTES=${SOAK_MINUTES:-5}
else
  MESSAGES=${MESSAGES:-1000000}; ACCOUNTS=${ACCOUNTS:-100000}
  BATCH_SIZES=${BATCH_SIZES:-"1 10 100 500 1000 5000"}
  LATENCY_RUNS=${LATENCY_RUNS:-"100:25 500:25 1000:25 500:50 1000:50 1000:25:natural 1000:50:natural"}
  DEFAULT_RATES=${DEFAULT_RATES:-"1000 5000 10000 20000"}
  LATENCY_SECONDS=${LATENCY_SECONDS:-20}; OUT=${OUT:-results}
  REMOTE_MESSAGES=${REMOTE_MESSAGES:-20000}; REMOTE_DELAYS_MS=${REMOTE_DELAYS_MS:-"0.5 2"}
  SCALE_OUT=${SCALE_OUT:-"1 2 4"}
fi
PARTITIONS=${PARTITIONS:-8}; DUPLICATE_RATIO=${DUPLICATE_RATIO:-0.1}; BAD_RATIO=${BAD_RATIO:-0.01}
DEBIT_RATIO=${DEBIT_RATIO:-0.3}; ID_VERSION=${ID_VERSION:-7}; LINGER_MS=${LINGER_MS:-20}
POOL_SIZE=${POOL_SIZE:-$PARTITIONS}; LIGHT_RATE=${LIGHT_RATE:-100}
SQL_BATCH_SIZE=${SQL_BATCH_SIZE:-1000}; WARMUP_S=${WARMUP_S:-3}; SOAK_RATE=${SOAK_RATE:-10000}

bin=./target/release/batch-inbox bench=./target/release/batch-inbox-bench
work=$(mktemp -d)
set_dir=loadtest
[ "$sql_only" = 1 ] && set_dir=sql-handler
[ "$latency_only" = 1 ] && set_dir=latency
[ "$soak_only" = 1 ] && set_dir=soak
runs="$OUT/$set_dir/runs"
cpu="$OUT/$set_dir/cpu"
mkdir -p "$runs" "$cpu"
rm -f "$runs"/*.json "$cpu"/*.json
stamp=$(date +%s)
broker_pid="" broker_kind="" proxy_pids=()
cleanup() {
  stop_broker "$work/broker"
  for pid in "${proxy_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
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

loadtest_broker() {
  start_broker "$work/broker"
  broker_pid=$BROKER_PID broker_kind=$BROKER_KIND
  export KAFKA_BROKERS=$BROKER_ADDR
  log "broker: $broker_kind on $KAFKA_BROKERS"
}

db_url() { echo "postgres://postgres@127.0.0.1:5432/$1"; }

# cpu_mark LABEL start|stop: where the machine's CPU went during a run, from `batch-inbox-bench
# cpu` into $cpu/LABEL.json: the machine, the broker's process (none for an external broker) and
# PostgreSQL's processes (the postmaster and its backends, ended ones included).
cpu_mark() {
  if [ "$2" = start ]; then
    local broker=()
    [ -n "$broker_pid" ] && broker=(--broker "$broker_pid")
    $bench cpu start --state "$work/cpu.state" --machine --postgres-data "$pg_data" "${broker[@]}"
  else
    $bench cpu stop --state "$work/cpu.state" --out "$cpu/$1.json"
  fi
}

# run_drain LABEL TOPIC [--ddl FILE] [run flags...]: fresh database and group, drain, verify,
# report.
run_drain() {
  local label=$1 topic=$2; shift 2
  local db="bi_lt_${label//-/_}"
  fresh_database "$db"
  # --ddl FILE: a SQL handler's run: the core's tables, and the statement's own from FILE.
  if [ "${1:-}" = --ddl ]; then
    DATABASE_URL=$(db_url "$db") $bin migrate --handler sql >/dev/null
    psql -q -h 127.0.0.1 -U postgres -d "$db" -v ON_ERROR_STOP=1 -f "$2" >/dev/null
    shift 2
  else
    DATABASE_URL=$(db_url "$db") $bin migrate --handler ledger >/dev/null
  fi
  log "run $label"
  cpu_mark "$label" start
  local expect=()
  if [ "${1:-}" = --expect ]; then expect=(--expect "$2"); shift 2; fi
  # --sums: the balances are the sums of every new entry (the SQL handler's balances upsert).
  if [ "${1:-}" = --sums ]; then expect+=(--sums); shift; fi
  local processes=1
  if [ "${1:-}" = --processes ]; then processes=$2; shift 2; fi
  # DB_HOST_PORT: a delaying proxy in front of PostgreSQL (remote-database runs).
  local url="postgres://postgres@${DB_HOST_PORT:-127.0.0.1:5432}/$db"
  DATABASE_URL=$url RUST_LOG=warn $bench drain --label "$label" --processes "$processes" \
    --report "$runs/$label.json" "${expect[@]}" -- $bin run --topic "$topic" \
    --group "$label-$stamp" --exit-on-eof --pool-size "$POOL_SIZE" \
    --batching "${DRAIN_BATCHING:-linger}" --batch-linger-ms "${DRAIN_LINGER_MS:-$LINGER_MS}" "$@" |
    tee -a "$work/runs.log"
  cpu_mark "$label" stop
  # Kafka's own tool must see the group's commits at the topic's end (lag 0), not only the
  # database's offsets. Skipped for nisshi, whose admin API the tool does not need to cover.
  if [ "${broker_kind#Apache Kafka}" != "$broker_kind" ]; then
    if ! kafka_group_lag_zero "$KAFKA_BROKERS" "$label-$stamp" 2>"$work/lag.txt"; then
      cat "$work/lag.txt" >&2
      log "run $label: Kafka's ConsumerGroupCommand reports lag for its group"
      exit 1
    fi
    tail -n 1 "$work/lag.txt" >&2
  fi
}

# machine.json: the machine, PostgreSQL (its settings and pg_test_fsync's fdatasync rate, the
# per-message baseline's limit: one WAL flush per message) and this run's parameters.
machine_json() {
  local quick_json=false
  [ "$quick" = 1 ] && quick_json=true
  $bench machine --out "$OUT/$set_dir/machine.json" --param "broker=$broker_kind" \
    --param "messages=$MESSAGES" --param "accounts=$ACCOUNTS" --param "partitions=$PARTITIONS" \
    --param "duplicate_ratio=$DUPLICATE_RATIO" --param "bad_ratio=$BAD_RATIO" \
    --param "debit_ratio=$DEBIT_RATIO" --param "id_version=$ID_VERSION" \
    --param "linger_ms=$LINGER_MS" --param "pool_size=$POOL_SIZE" --param "quick=$quick_json" \
    --param "default_batching=$default_batching"
}

# The best batched run's msgs/s (the batch-size sweep), 1000 without one.
best_batched_rate() { $bench best-rate --runs "$runs" --prefix batched-b --or 1000; }

# latency_run LABEL RATE PROCESSOR-COMMAND…: the processor waits on an empty topic; then input
# arrives at RATE/s for LATENCY_SECONDS. The command gets --topic and --group.
latency_run() {
  local label=$1 rate=$2 topic="$1-$stamp"; shift 2
  local n=$(( rate * LATENCY_SECONDS ))
  local db="bi_lt_${label//-/_}" expect=()
  fresh_database "$db"
  if [ "$2" = run ]; then
    DATABASE_URL=$(db_url "$db") $bin migrate --handler ledger >/dev/null
    expect=(--expect "$work/$label.expected.json")
  fi
  $bench produce --topic "$topic" --partitions "$PARTITIONS" --messages 0 >/dev/null
  log "run $label: $n messages at $rate/s"
  DATABASE_URL=$(db_url "$db") RUST_LOG=info $bench drain --label "$label" \
    --report "$runs/$label.json" --input-rate "$rate" --stop-after "$n" "${expect[@]}" \
    -- "$@" --topic "$topic" --group "$label-$stamp" >>"$work/runs.log" 2>"$work/$label.err" &
  local run_pid=$!
  # Until every partition is assigned (the file is created by the background job: -s until then).
  local assigned=0
  for _ in $(seq 1 300); do
    assigned=$(grep -sc 'partition assigned' "$work/$label.err" || true)
    [ "${assigned:-0}" -ge "$PARTITIONS" ] && break
    sleep 0.1
  done
  [ "${assigned:-0}" -ge "$PARTITIONS" ] ||
    log "run $label: ${assigned:-0} of $PARTITIONS partitions assigned after 30 s; producing anyway"
  # Warm-up: a consumer's first fetch after an assignment comes up to about 0.5 s later (its
  # offset lookup); records produced meanwhile would measure the start-up, not the steady state.
  sleep "$WARMUP_S"
  cpu_mark "$label" start
  # The soak's watcher starts with the traffic.
  if [ -n "${on_traffic:-}" ]; then "$on_traffic" "$label" "$db"; fi
  # --latency: PostgreSQL's WAL and checkpoints over the traffic alone.
  if [ "$latency_only" = 1 ]; then wal_counters >"$work/$label.wal"; fi
  $bench produce --topic "$topic" --messages "$n" --accounts "$ACCOUNTS" --rate "$rate" \
    --duplicate-ratio "$DUPLICATE_RATIO" --bad-ratio "$BAD_RATIO" --debit-ratio "$DEBIT_RATIO" \
    --id-version "$ID_VERSION" --seed 2 --expect "$work/$label.expected.json" \
    --ack-report "$work/$label.acks.json" >/dev/null
  wait "$run_pid" || { cat "$work/$label.err" >&2; return 1; }
  cpu_mark "$label" stop
  if [ "$latency_only" = 1 ]; then wal_counters >>"$work/$label.wal"; fi
  # The producer's side of each record's latency (timestamp to the broker's acknowledgement).
  $bench report merge-acks --run "$runs/$label.json" --acks "$work/$label.acks.json"
}

# floor_run RATE: consume-only at RATE/s, the broker-and-client floor of the latency runs.
floor_run() {
  [ -f "$runs/floor-r$1.json" ] && return 0
  latency_run "floor-r$1" "$1" $bench consume-only --batch-size 1000 --batching natural \
    --batch-linger-ms 0 --pool-size "$POOL_SIZE" --follow
}

# replay SIZE: the database-only ceiling at SIZE records per batch.
replay() {
  log "replay at batch size $1 (the same records, statements and handler; no Kafka)"
  $bench replay --server-url postgres://postgres@127.0.0.1:5432 --database bi_lt_replay \
    --records "$MESSAGES" --accounts "$ACCOUNTS" --duplicate-ratio "$DUPLICATE_RATIO" \
    --bad-ratio "$BAD_RATIO" --debit-ratio "$DEBIT_RATIO" --id-version "$ID_VERSION" --seed 1 \
    --partitions "$PARTITIONS" --batch-size "$1" --pool-size "$POOL_SIZE" --topic "$topic" \
    --label "replay-b$1" --report "$OUT/loadtest/replay.jsonl" >>"$work/runs.log"
}

log "building release"
cargo build --release --quiet --workspace --bins
ensure_postgres
enable_pg_stat_statements
loadtest_broker
default_batching=$($bin run --print-config | sed -n 's/^batching = "\([a-z]*\)".*/\1/p')
machine_json
pg_data=$(psql -Atq -h 127.0.0.1 -U postgres -c "SHOW data_directory")
# Only the full and quick runs replay (the other modes must not remove a committed replay).
if [ "$set_dir" = loadtest ]; then rm -f "$OUT/loadtest/replay.jsonl"; fi

# wal_counters: PostgreSQL's WAL syncs, their total time (ms; track_wal_io_timing is on) and the
# checkpoints so far, one line.
wal_counters() {
  psql -Atq -h 127.0.0.1 -U postgres -F ' ' -c "SELECT w.wal_sync, w.wal_sync_time,
    b.checkpoints_timed + b.checkpoints_req FROM pg_stat_wal w, pg_stat_bgwriter b"
}

# PostgreSQL's WAL sync time, for --latency and the soak (left on).
wal_io_timing() {
  if [ "$(psql -Atq -h 127.0.0.1 -U postgres -c 'SHOW track_wal_io_timing')" != on ]; then
    psql -q -h 127.0.0.1 -U postgres -c "ALTER SYSTEM SET track_wal_io_timing = on" \
      -c "SELECT pg_reload_conf()" >/dev/null
  fi
}

# soak_watch LABEL DB: `soak watch` on LABEL's processor, in the background ($soak_watcher).
soak_watch() {
  local pid
  pid=$(pgrep -n -f "^$bin run .*--group $1-$stamp( |\$)")
  DATABASE_URL=$(db_url "$2") $bench soak watch --metrics-addr "$soak_metrics" --pid "$pid" \
    ${broker_pid:+--broker-pid "$broker_pid"} --out "$soak_dir/samples.jsonl" &
  soak_watcher=$!
}

# soak DIR: the default settings at SOAK_RATE for SOAK_MINUTES, watched once a minute; the
# samples, the run's report, its table and its plot in DIR. The input flows half a minute
# longer than the minutes measured, so that the last sample falls while records still arrive.
soak() {
  soak_dir=$1
  runs="$soak_dir/runs" cpu="$soak_dir/cpu"
  mkdir -p "$runs" "$cpu"
  rm -f "$soak_dir/samples.jsonl" "$runs"/*.json "$cpu"/*.json
  wal_io_timing
  soak_metrics="127.0.0.1:$(free_port)"
  local label="soak-r$SOAK_RATE"
  LATENCY_SECONDS=$((SOAK_MINUTES * 60 + 30)) on_traffic=soak_watch latency_run "$label" \
    "$SOAK_RATE" $bin run --pool-size "$POOL_SIZE" --metrics-addr "$soak_metrics"
  wait "$soak_watcher"
  $bench soak report --samples "$soak_dir/samples.jsonl" --table "$soak_dir/summary.md" \
    --plot "$soak_dir/soak.svg" --intro "$SOAK_MINUTES minutes at $SOAK_RATE msgs/s \
($PARTITIONS partitions, duplicates $DUPLICATE_RATIO, bad input $BAD_RATIO, $ACCOUNTS accounts), \
the processor's default settings (--pool-size $POOL_SIZE), $WARMUP_S s after its partitions were \
assigned; $broker_kind; one sample a minute (\`batch-inbox-bench soak watch\`); every record \
checked against the model afterwards. \`scripts/loadtest.sh $mode_flag\` on $(date -u '+%Y-%m-%d %H:%M') UTC."
  cat "$soak_dir/summary.md"
}

if [ "$soak_only" = 1 ]; then
  soak "$OUT/soak"
  log "done: $OUT/soak/summary.md"
  exit 0
fi

if [ "$latency_only" = 1 ]; then
  wal_io_timing
  processor=($bin run --pool-size "$POOL_SIZE")
  table="$OUT/$set_dir/summary.md"
  rows="$work/latency-rows"
  for repeat in $(seq 1 "$REPEATS"); do
    for rate in $DEFAULT_RATES; do
      label="default-r$rate-n$repeat"
      latency_run "$label" "$rate" "${processor[@]}"
      { read -r syncs sync_ms checkpoints; read -r syncs2 sync_ms2 checkpoints2; } <"$work/$label.wal"
      r="$runs/$label.json"
      p50=$($bench json get "$r" e2e_latency_ms.p50)
      p99=$($bench json get "$r" e2e_latency_ms.p99)
      max=$($bench json get "$r" e2e_latency_ms.max)
      echo "$rate $repeat $p50 $p99 $max $((syncs2 - syncs)) $sync_ms $sync_ms2" \
        "$((checkpoints2 - checkpoints))" >>"$rows"
    done
  done
  {
    echo "# The default settings at fixed rates, repeated"
    echo
    echo "$REPEATS runs of each rate, $LATENCY_SECONDS s each after $WARMUP_S s of an idle," \
      "assigned processor, the rates in turn; $broker_kind; latency from each record's" \
      "CreateTime to its batch's COMMIT, in ms. WAL syncs and their time from pg_stat_wal" \
      "(track_wal_io_timing on), checkpoints from pg_stat_bgwriter, while the input flows." \
      "\`scripts/loadtest.sh --latency\` on $(date -u '+%Y-%m-%d %H:%M') UTC."
    echo
    echo "| msgs/s | run | p50 | p99 | max | WAL syncs | ms per WAL sync | checkpoints |"
    echo "|---:|---:|---:|---:|---:|---:|---:|---:|"
    sort -n -k1,1 -k2,2 "$rows" | awk '{
      per = ($6 > 0) ? ($8 - $7) / $6 : 0
      printf "| %d | %d | %.1f | %.1f | %.1f | %d | %.2f | %d |\n", $1, $2, $3, $4, $5, $6, per, $9 }'
  } >"$table"
  cat "$table"
  log "done: $table"
  exit 0
fi

topic="loadtest-$stamp"
log "producing $MESSAGES messages to $topic ($PARTITIONS partitions)"
$bench produce --topic "$topic" --partitions "$PARTITIONS" --messages "$MESSAGES" \
  --accounts "$ACCOUNTS" --duplicate-ratio "$DUPLICATE_RATIO" --bad-ratio "$BAD_RATIO" \
  --debit-ratio "$DEBIT_RATIO" --id-version "$ID_VERSION" --expect "$work/expected.json"
expect="$work/expected.json"

# The SQL handler's statements: typed input (balances_upsert.sql) and the jsonb form
# (balances_jsonb.sql), on a database of the SQL handler (the core's tables, and its balances
# table from its DDL file), checked against the model without the ledger's overdraft rule. The
# input's records without a value are bad input to these statements (they have nothing to
# delete): dead-lettered as empty_payload, as the ledger does and the model expects.
sql=(--handler sql --apply-sql examples/sql/balances_upsert.sql --tombstones dead-letter)
sql_jsonb=(--handler sql --apply-sql examples/sql/balances_jsonb.sql --tombstones dead-letter)
sql_ddl=(--ddl examples/sql/balances.ddl.sql)

if [ "$sql_only" = 1 ]; then
  # In turn, so that a slower minute of the machine falls on each alike.
  for round in $(seq 1 "$ROUNDS"); do
    run_drain "ledger-r$round" "$topic" --expect "$expect" --batch-size "$SQL_BATCH_SIZE"
    run_drain "typed-r$round" "$topic" "${sql_ddl[@]}" --expect "$expect" --sums \
      --batch-size "$SQL_BATCH_SIZE" "${sql[@]}"
    run_drain "jsonb-r$round" "$topic" "${sql_ddl[@]}" --expect "$expect" --sums \
      --batch-size "$SQL_BATCH_SIZE" "${sql_jsonb[@]}"
  done
  table="$OUT/$set_dir/summary.md"
  {
    echo "# The SQL handler against the Rust ledger"
    echo
    echo "$MESSAGES records ($PARTITIONS partitions, duplicates $DUPLICATE_RATIO, bad input" \
      "$BAD_RATIO), batch size $SQL_BATCH_SIZE, linger $LINGER_MS ms, $broker_kind; each run" \
      "on a fresh database, in turn. msgs/s over the stats file's window; PostgreSQL CPU per" \
      "record from its processes' CPU time over the run. \`scripts/loadtest.sh --sql-handler\`."
    echo
    echo "| run | msgs/s | PostgreSQL µs/record | processor µs/record |"
    echo "|---|---:|---:|---:|"
    for r in "$runs"/*.json; do
      label=$(basename "$r" .json)
      rate=$($bench json get "$r" msgs_per_sec)
      pg=$($bench json get "$cpu/$label.json" postgres_cpu_s)
      own=$($bench json get "$r" cpu_s)
      awk -v l="$label" -v r="$rate" -v pg="$pg" -v own="$own" -v n="$MESSAGES" \
        'BEGIN { printf "| %s | %.0f | %.2f | %.2f |\n", l, r, pg * 1e6 / n, own * 1e6 / n }'
    done
  } >"$table"
  cat "$table"
  log "done: $table"
  exit 0
fi

run_drain per-message "$topic" --expect "$expect" --mode per-message
largest=0
for size in $BATCH_SIZES; do
  run_drain "batched-b$size" "$topic" --expect "$expect" --batch-size "$size"
  [ "$size" -gt "$largest" ] && largest=$size
done
# The SQL handler on the same input, next to the Rust ledger: one aggregate upsert per batch,
# typed, and the same in the jsonb form.
run_drain sql-per-message "$topic" "${sql_ddl[@]}" --expect "$expect" --sums --mode per-message \
  "${sql[@]}"
run_drain sql-batched "$topic" "${sql_ddl[@]}" --expect "$expect" --sums \
  --batch-size "$SQL_BATCH_SIZE" "${sql[@]}"
run_drain sql-jsonb-batched "$topic" "${sql_ddl[@]}" --expect "$expect" --sums \
  --batch-size "$SQL_BATCH_SIZE" "${sql_jsonb[@]}"
# The broker-and-client ceiling: the same pipeline without any database work.
db="bi_lt_consume_only"
fresh_database "$db"
log "run consume-only"
cpu_mark consume-only start
DATABASE_URL=$(db_url "$db") RUST_LOG=warn $bench drain --label consume-only \
  --report "$runs/consume-only.json" -- $bench consume-only --topic "$topic" \
  --group "consume-only-$stamp" --batch-size 1000 --pool-size "$POOL_SIZE" --batching linger \
  --batch-linger-ms "$LINGER_MS" | tee -a "$work/runs.log"
cpu_mark consume-only stop
log "COPY ceiling with the ids of batched-b$largest"
$bench copy-ceiling --database-url "$(db_url "bi_lt_batched_b$largest")" --streams "$PARTITIONS" \
  --report "$runs/copy-ceiling.json"
for size in $(printf '%s\n' 1000 "$largest" | sort -un); do
  replay "$size"
done
DRAIN_BATCHING=natural DRAIN_LINGER_MS=0 run_drain "batched-natural-b$largest" "$topic" \
  --expect "$expect" --batch-size "$largest"
for n in $SCALE_OUT; do
  run_drain "scale-p$n" "$topic" --expect "$expect" --processes "$n" --batch-size 1000
done
if [ "$quick" = 0 ]; then
  run_drain backlog-1m "$topic" --expect "$expect" --batch-size 1000
fi

# A remote database: every round trip pays the proxy's delay each way.
remote_topic="loadtest-remote-$stamp"
$bench produce --topic "$remote_topic" --partitions "$PARTITIONS" --messages "$REMOTE_MESSAGES" \
  --accounts "$ACCOUNTS" --duplicate-ratio "$DUPLICATE_RATIO" --bad-ratio "$BAD_RATIO" \
  --debit-ratio "$DEBIT_RATIO" --id-version "$ID_VERSION" --seed 3 \
  --expect "$work/remote.expected.json" >/dev/null
for delay in $REMOTE_DELAYS_MS; do
  port=$(free_port)
  $bench delay-proxy --listen "127.0.0.1:$port" --target 127.0.0.1:5432 --delay-ms "$delay" &
  proxy_pids+=($!)
  for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
  DB_HOST_PORT="127.0.0.1:$port" run_drain "remote-${delay}ms-per-message" "$remote_topic" \
    --expect "$work/remote.expected.json" --mode per-message
  DB_HOST_PORT="127.0.0.1:$port" run_drain "remote-${delay}ms-batched-b1000" "$remote_topic" \
    --expect "$work/remote.expected.json" --batch-size 1000
done

best=$(best_batched_rate)
processor=($bin run --pool-size "$POOL_SIZE")
for run in $LATENCY_RUNS; do
  IFS=: read -r size percent batching <<<"$run"
  rate=$(( best * percent / 100 )) tag="" linger=$LINGER_MS
  # Natural batching closes a batch when no more record is ready: no minimum wait.
  [ -n "$batching" ] && tag="-$batching" && linger=0
  latency_run "latency$tag-b$size-r$percent" "$rate" "${processor[@]}" --batch-size "$size" \
    --batch-linger-ms "$linger" --batching "${batching:-linger}"
  floor_run "$rate"
done
# The default settings (natural batching, no minimum wait) at fixed rates, each with its floor.
# The per-message baseline at the same rates, where it keeps up (about 5,000 msgs/s here).
for rate in $DEFAULT_RATES; do
  latency_run "default-r$rate" "$rate" "${processor[@]}"
  floor_run "$rate"
  if [ "$rate" -le "${PER_MESSAGE_MAX_RATE:-5000}" ]; then
    latency_run "permessage-r$rate" "$rate" "${processor[@]}" --mode per-message
  fi
done
# Light traffic with the default batch settings and each batching (natural without a minimum
# wait); machine.json names the default.
latency_run "light-linger-r$LIGHT_RATE" "$LIGHT_RATE" "${processor[@]}" --batching linger
latency_run "light-natural-r$LIGHT_RATE" "$LIGHT_RATE" "${processor[@]}" --batching natural \
  --batch-linger-ms 0
floor_run "$LIGHT_RATE"

$bench summary --input "$OUT/loadtest" --output "$OUT"
log "done: $OUT/summary.md"
# The quick run's soak (SOAK_MINUTES, 5 here by default).
if [ "$quick" = 1 ]; then
  soak "$OUT/soak"
  log "done: $OUT/soak/summary.md"
fi
