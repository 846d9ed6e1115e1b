#!/usr/bin/env bash
# The same work on batch-inbox and on the peer a team would pick instead (Kafka Connect with
# Debezium's JDBC sink, scripts/peers/lib.sh), in one run: the same topic from
# `batch-inbox-bench produce --envelope connect-json` (a Connect JSON envelope, 10%
# duplicates: records re-sent with the id of an earlier one), the same broker and PostgreSQL.
# Two works (WORK), each on databases of its own:
#
# upsert: last write wins, the customer's latest entry by key, on the same table
# (examples/sql/customer_entries.ddl.sql), upserted by Debezium's sink in upsert mode and by
# `batch-inbox run --handler sql --apply-sql examples/sql/customer_entries.sql`. A trigger logs
# every write with the record id it wrote (customer_applications), so that a second application
# of one record shows although the table hides it.
#
# additive: balance += amount per account. Ours adds each batch's new amounts to `balances`
# (examples/sql/balances_connect.sql on examples/sql/balances.ddl.sql); Debezium's sink cannot add
# to a column, so it keeps a row per record in a table of amounts
# (scripts/peers/amount_entries.ddl.sql) and its balance is sum(amount) GROUP BY account_id: by
# inserting every record it receives (ADDITIVE_SINKS "insert", connector-amounts.properties), or
# by upserting each record id's row (by-id, connector-amounts-by-id.properties). All are checked
# against the model's per-account sums of the new records' amounts (`produce --expect`: "sums";
# no overdraft rule on either side).
#
# For each run: msgs/s, CPU seconds per 1000 records of the sink process (the Connect JVM, our
# processor), PostgreSQL and the broker, and the final state against the model. upsert: the peer
# is checked against "the last record of each key in the topic", ours against "the last new
# record of each key", and the ids applied more than once are counted. additive: accounts whose
# balance equals the model's, the sum over accounts of |balance - model|, and the records counted
# more than once (the peer's rows beyond the first of each record id). With KILL=1 each sink is
# also run once more per work with a kill -9 in the middle and a restart. The script fails when
# ours differs from the model in any run.
#
#   scripts/peers/compare.sh                 MESSAGES=200000 by default, results/peers/
#   MESSAGES=20000 KILL=1 scripts/peers/compare.sh
#   WORK=additive MESSAGES=20000 scripts/peers/compare.sh
#
# Environment: WORK ("upsert additive", or one of them), MESSAGES, ACCOUNTS (1000), PARTITIONS
# (8), SEED (1), OUT (results/peers), PEERS ("default" or a space-separated list of the peer
# configurations below; the same for both works and each additive sink), ADDITIVE_SINKS
# ("insert by-id"), KILL (0), FLUSH_MS (the peer's offset.flush.interval.ms, 10000),
# KILL_FLUSH_MS (those of the peer's kill runs, "10000 1000"), KAFKA_BROKERS (an existing broker;
# otherwise a single Apache Kafka node of its own), MACHINE_NOTE (what else ran on the machine
# meanwhile, as results.md states it, e.g. "nothing else ran on the machine").
# Databases are named ${TEST_DATABASE_PREFIX:-bi_}peers_*; they are dropped and created again.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/peers/lib.sh

MESSAGES=${MESSAGES:-200000}
ACCOUNTS=${ACCOUNTS:-1000}
PARTITIONS=${PARTITIONS:-8}
SEED=${SEED:-1}
OUT=${OUT:-results/peers}
KILL=${KILL:-0}
WORK=${WORK:-"upsert additive"}
for w in $WORK; do
  case $w in upsert | additive) ;; *) echo "WORK: upsert or additive, not $w" >&2; exit 2 ;; esac
done
PREFIX=${TEST_DATABASE_PREFIX:-bi_}
# Peer configurations: NAME:BATCH_SIZE:MAX_POLL:UNNEST:REDUCTION. The additive work's sink
# has no key fields, so its reduction buffer is never used (connector-amounts.properties).
PEERS=${PEERS:-"default:500:500:false:false batch2000:2000:2000:false:false unnest2000:2000:2000:true:true"}
# The peer's offset-commit interval (Connect's offset.flush.interval.ms; its default is 60000),
# and those of its kill runs.
FLUSH_MS=${FLUSH_MS:-10000}
KILL_FLUSH_MS=${KILL_FLUSH_MS:-"$FLUSH_MS 1000"}
# The peer's ways to keep amounts in the additive work: "insert" (a row per record received) and
# "by-id" (a row per record id, upserted); see facts below.
ADDITIVE_SINKS=${ADDITIVE_SINKS:-"insert by-id"}
for k in $ADDITIVE_SINKS; do
  case $k in insert | by-id) ;; *) echo "ADDITIVE_SINKS: insert or by-id, not $k" >&2; exit 2 ;; esac
done
bin=./target/release/batch-inbox bench=./target/release/batch-inbox-bench
stamp=$(date +%s)
work=$(mktemp -d /tmp/peers-compare.XXXXXX)
mkdir -p "$OUT"
log() { echo "[$(date +%T)] $*" >&2; }

ensure_postgres
ensure_peer
log "building the release binaries"
cargo build --release -q -p batch-inbox -p batch-inbox-tools --bins

broker_pid=""
cleanup() {
  local rc=$1
  [ -f "$work/peer/pid" ] && stop_peer "$work/peer"
  [ -n "${our_pid:-}" ] && kill -KILL "$our_pid" 2>/dev/null
  [ -n "$own_broker" ] && stop_broker "$work/broker"
  if [ "$rc" = 0 ]; then rm -rf "$work"; else log "the run failed; its logs are in $work"; fi
  return 0
}
own_broker=""
trap 'cleanup $?' EXIT
if [ -z "${KAFKA_BROKERS:-}" ]; then
  own_broker=1
  start_broker "$work/broker"
  broker_pid=$BROKER_PID
  KAFKA_BROKERS=$BROKER_ADDR
  broker_kind=$BROKER_KIND
else
  broker_kind="the broker of KAFKA_BROKERS (its CPU is not measured)"
fi
log "broker: $broker_kind on $KAFKA_BROKERS"

psql_db() { psql -X -q -At -h 127.0.0.1 -U postgres -d "$@"; }
db_url() { echo "postgres://postgres@127.0.0.1:5432/$1"; }
# What every run's CPU figures cover (`batch-inbox-bench cpu`): the machine, PostgreSQL's
# processes (the postmaster and its backends, ended ones included) and the broker's process (not
# measured for an external broker).
cpu_targets=(--machine --postgres-data "$(psql_db postgres -c 'SHOW data_directory')")
[ -n "$broker_pid" ] && cpu_targets+=(--broker "$broker_pid")

# The input, once, for every run.
topic="peers-$stamp"
log "producing $MESSAGES records (10% duplicates, no bad input) to $topic ($PARTITIONS partitions)"
$bench produce --brokers "$KAFKA_BROKERS" --topic "$topic" --partitions "$PARTITIONS" \
  --messages "$MESSAGES" --accounts "$ACCOUNTS" --duplicate-ratio 0.1 --bad-ratio 0 \
  --seed "$SEED" --envelope connect-json --expect "$work/expect.json" >&2
read -r new dups keys sum_accounts < <($bench peers model --expect "$work/expect.json")
log "model: $new new records, $dups duplicates, $keys customers, $sum_accounts accounts with a sum"
# Our ledger reads the entry itself, not a Connect envelope: the same entries (same seed: the
# same accounts, amounts and duplicates; the ids are drawn anew) once more without it, to a topic
# of their own. The generator's model of balances, sums and counts must be the same.
if [[ " $WORK " == *" additive "* ]]; then
  log "producing the same $MESSAGES records without the envelope to $topic-bare, for the ledger"
  $bench produce --brokers "$KAFKA_BROKERS" --topic "$topic-bare" --partitions "$PARTITIONS" \
    --messages "$MESSAGES" --accounts "$ACCOUNTS" --duplicate-ratio 0.1 --bad-ratio 0 \
    --seed "$SEED" --envelope bare --expect "$work/expect-bare.json" >&2
  $bench peers same-model "$work/expect.json" "$work/expect-bare.json"
fi

# model_rows FIELD: the model's map FIELD of expect.json as tab-separated key and value lines.
model_rows() { $bench peers model-rows --expect "$work/expect.json" "$1"; }

# fresh_db WORK NAME: the database of one run, with the work's tables and the model's expected
# state. upsert: customer_entries, its trigger, expected_last_new and expected_last_sent
# (customer_id → id). additive: our balances, the peer's amount_entries and expected_sums
# (account_id → the sum of its new records' amounts).
fresh_db() {
  local db=$2
  fresh_database "$db"
  if [ "$1" = upsert ]; then
    psql_db "$db" -v ON_ERROR_STOP=1 -f examples/sql/customer_entries.ddl.sql >/dev/null
    psql_db "$db" -v ON_ERROR_STOP=1 -c \
      "CREATE TABLE expected_last_new (customer_id text PRIMARY KEY, id text NOT NULL);
       CREATE TABLE expected_last_sent (customer_id text PRIMARY KEY, id text NOT NULL);" >/dev/null
    model_rows last_new | psql_db "$db" -c "\\copy expected_last_new FROM STDIN"
    model_rows last_sent | psql_db "$db" -c "\\copy expected_last_sent FROM STDIN"
  else
    psql_db "$db" -v ON_ERROR_STOP=1 -f examples/sql/balances.ddl.sql \
      -f scripts/peers/amount_entries.ddl.sql >/dev/null
    psql_db "$db" -v ON_ERROR_STOP=1 -c \
      "CREATE TABLE expected_sums (account_id bigint PRIMARY KEY, amount bigint NOT NULL)" >/dev/null
    model_rows sums | psql_db "$db" -c "\\copy expected_sums FROM STDIN"
  fi
}

# matching DB TABLE: customers whose row holds the id TABLE expects (upsert).
matching() {
  psql_db "$1" -c "SELECT count(*) FROM customer_entries c JOIN $2 x USING (customer_id)
                   WHERE c.id = x.id"
}

# The additive work's sinks: ours, and the peer's two ways to keep amounts (SINK): "insert", a
# row per record received (connector-amounts.properties into amount_entries), and "by-id", a row
# per record id, upserted (connector-amounts-by-id.properties into amount_entries_by_id).
# table_of SINK: the table; balances_of SINK: one row (account_id, amount) per account.
table_of() { [ "$1" = by-id ] && echo amount_entries_by_id || echo amount_entries; }
balances_of() {
  if [ "$1" = ours ]; then
    echo "SELECT account_id, amount FROM balances"
  else
    echo "SELECT account_id, sum(amount) AS amount FROM $(table_of "$1") GROUP BY account_id"
  fi
}

# facts WORK DB [SINK]: one JSON object of what the run left. additive: every account of the
# model or of the table, its balance against the model's sum (absent = 0); the peer's rows, and
# for "insert" the records it counted more than once (rows beyond the first of each id; none for
# ours or "by-id", which keep each id once by a primary key: their balances are the check).
facts() {
  if [ "$1" = upsert ]; then
    psql_db "$2" -c "SELECT json_build_object(
      'rows', (SELECT count(*) FROM customer_entries),
      'match_last_new', (SELECT count(*) FROM customer_entries c
                         JOIN expected_last_new x USING (customer_id) WHERE c.id = x.id),
      'match_last_sent', (SELECT count(*) FROM customer_entries c
                          JOIN expected_last_sent x USING (customer_id) WHERE c.id = x.id),
      'applications', (SELECT count(*) FROM customer_applications),
      'ids_applied', (SELECT count(DISTINCT id) FROM customer_applications),
      'ids_applied_twice', (SELECT count(*) FROM (SELECT id FROM customer_applications
                            GROUP BY id HAVING count(*) > 1) t),
      'extra_applications', (SELECT count(*) - count(DISTINCT id) FROM customer_applications))"
    return
  fi
  local observed entries="NULL::bigint" twice="NULL::bigint" ids_twice="NULL::bigint"
  observed=$(balances_of "$3")
  [ "$3" = ours ] || entries="(SELECT count(*) FROM $(table_of "$3"))"
  if [ "$3" = insert ]; then
    twice="(SELECT count(*) - count(DISTINCT id) FROM amount_entries)"
    ids_twice="(SELECT count(*) FROM (SELECT id FROM amount_entries GROUP BY id
                HAVING count(*) > 1) t)"
  fi
  psql_db "$2" -c "WITH observed AS ($observed),
    cmp AS (SELECT coalesce(o.amount, 0) AS o, coalesce(x.amount, 0) AS x
            FROM observed o FULL JOIN expected_sums x USING (account_id))
    SELECT json_build_object(
      'model_accounts', (SELECT count(*) FROM expected_sums),
      'accounts', (SELECT count(*) FROM cmp),
      'accounts_right', (SELECT count(*) FROM cmp WHERE o = x),
      'abs_error', (SELECT coalesce(sum(abs(o - x)), 0) FROM cmp),
      'total', (SELECT coalesce(sum(o), 0) FROM cmp),
      'model_total', (SELECT coalesce(sum(x), 0) FROM cmp),
      'entries', $entries,
      'counted_twice', $twice,
      'ids_counted_twice', $ids_twice)"
}

# peer_failed: Kafka Connect ended or its task failed (its errors logged).
peer_failed() {
  if [ -n "${PEER_PID:-}" ] && { ! kill -0 "$PEER_PID" 2>/dev/null ||
    grep -q "Task threw an uncaught and unrecoverable exception" "$work/peer/connect.log"; }; then
    log "Kafka Connect ended or its task failed; its errors:"
    grep -A3 ERROR "$work/peer/connect.log" | head -n 20 >&2
    return 0
  fi
  return 1
}

# peer_progress WORK DB SINK: records the peer has written (upsert: row writes; additive: rows).
peer_progress() {
  if [ "$1" = upsert ]; then
    psql_db "$2" -c 'SELECT count(*) FROM customer_applications'
  else
    psql_db "$2" -c "SELECT count(*) FROM $(table_of "$3")"
  fi
}

# peer_target WORK SINK: peer_progress once the whole topic is applied (upsert: not used).
peer_target() { [ "$2" = by-id ] && echo "$new" || echo "$MESSAGES"; }

# wait_peer WORK DB DEADLINE_S SINK: until the peer has applied the whole topic (polled). upsert:
# every customer's row holds the last record of its key in the topic. additive: "insert", a row
# per record of the topic (a re-delivery after a kill adds rows, so after a kill this is only a
# lower bound: kill_peer also waits for the group's commit of the topic's end); "by-id", a row
# per new id (the records after the last new one of a partition rewrite rows with the values
# they hold: the state is final, though the sink may still be writing them).
wait_peer() {
  local deadline=$((SECONDS + $3))
  while if [ "$1" = upsert ]; then [ "$(matching "$2" expected_last_sent)" != "$keys" ]; else
    [ "$(peer_progress "$1" "$2" "$4")" -lt "$(peer_target "$1" "$4")" ]; fi; do
    [ $SECONDS -lt "$deadline" ] || return 1
    peer_failed && return 1
    sleep 0.2
  done
}

# record WORK LABEL SINK CPU_JSON FACTS [NOTE]: one result row (`batch-inbox-bench peers row`):
# msgs/s and CPU per 1000 records from CPU_JSON (the run's `cpu stop` or `cpu run` figures; the
# sink's are process_cpu_s), or "" for a kill run (not measured).
record() {
  local figures=()
  [ -n "$4" ] && figures=(--cpu "$4")
  $bench peers row --rows "$work/rows.jsonl" --records "$MESSAGES" --work "$1" --label "$2" \
    --sink "$3" "${figures[@]}" --state "$5" --note "${6:-}"
}

# The work's names: labels of its rows, databases, connectors and groups (the sink "by-id" gets a
# prefix of its own). The upsert work keeps the names it had before the additive one was added.
label_of() {
  case $1:${3:-} in
    upsert:*) echo "$2" ;;
    *:by-id) echo "additive-by-id-$2" ;;
    *) echo "additive-$2" ;;
  esac
}
db_of() {
  case $1:${3:-} in
    upsert:*) echo "${PREFIX}peers_$2" ;;
    *:by-id) echo "${PREFIX}peers_add_byid_$2" ;;
    *) echo "${PREFIX}peers_add_$2" ;;
  esac
}
sql_of() {
  [ "$1" = upsert ] && echo examples/sql/customer_entries.sql || echo examples/sql/balances_connect.sql
}
# peer_args WORK SINK: the connector's template and table (lib.sh's defaults for upsert).
peer_args() {
  case $1:$2 in
    upsert:*) ;;
    *:by-id) echo "CONNECTOR_TEMPLATE=connector-amounts-by-id.properties TABLE=amount_entries_by_id" ;;
    *) echo "CONNECTOR_TEMPLATE=connector-amounts.properties TABLE=amount_entries" ;;
  esac
}

# run_peer WORK SINK NAME BATCH MAX_POLL UNNEST REDUCTION: the peer on the whole topic, timed
# from its task's start to the moment it has applied the whole topic (wait_peer). SINK: "-" for
# the upsert work, "insert" or "by-id" for the additive one.
run_peer() {
  local w=$1 k=$2 name=$3 db
  db=$(db_of "$w" "connect_$name" "$k")
  fresh_db "$w" "$db"
  rm -rf "$work/peer"
  log "$w: peer $(label_of "$w" "$name" "$k"): batch.size=$4 max.poll.records=$5 unnest=$6 reduction=$7"
  # shellcheck disable=SC2046 # peer_args is a list of K=V words
  start_peer "$work/peer" "$KAFKA_BROKERS" "$topic" "$db" CONNECTOR="$(label_of "$w" "peer-$name" "$k")-$stamp" \
    BATCH_SIZE="$4" MAX_POLL="$5" UNNEST="$6" REDUCTION="$7" FLUSH_MS="$FLUSH_MS" $(peer_args "$w" "$k")
  $bench cpu start --state "$work/cpu.state" --pid "$PEER_PID" "${cpu_targets[@]}"
  wait_peer "$w" "$db" 900 "$k" || { log "$w: peer $name: no final state in 900 s"; return 1; }
  $bench cpu stop --state "$work/cpu.state" --out "$work/cpu.json"
  stop_peer "$work/peer"
  PEER_PID=""
  record "$w" "$(label_of "$w" "connect-$name" "$k")" \
    "Kafka Connect $KAFKA_VERSION + Debezium JDBC sink $PEER_DEBEZIUM_VERSION ($name)" \
    "$work/cpu.json" "$(facts "$w" "$db" "$k")" \
    "batch.size=$4 consumer.max.poll.records=$5 unnest=$6 use.reduction.buffer=$7 offset.flush.interval.ms=$FLUSH_MS"
}

our_run() { # WORK DB GROUP [flags...]: the processor, in place of the calling (sub)shell
  local w=$1 db=$2 group=$3
  shift 3
  exec env DATABASE_URL="$(db_url "$db")" RUST_LOG=warn $bin run --brokers "$KAFKA_BROKERS" --topic "$topic" \
    --group "$group" --handler sql --apply-sql "$(sql_of "$w")" "$@"
}

# check_ours WORK DB INBOX_ROWS: the model's count of new ids in the inbox, no dead letter, and
# the model's final state: upsert, every customer on its last new record and no id written twice;
# additive, every account's balance equal to the model's sum (and no account beyond the model's).
# The run fails otherwise.
check_ours() {
  local w=$1 db=$2 inbox=$3 letters
  letters=$(psql_db "$db" -c "SELECT count(*) FROM dead_letters")
  if [ "$w" = upsert ]; then
    local state twice
    state=$(matching "$db" expected_last_new)
    twice=$(psql_db "$db" -c "SELECT count(*) FROM (SELECT id FROM customer_applications
                             GROUP BY id HAVING count(*) > 1) t")
    if [ "$state" != "$keys" ] || [ "$inbox" != "$new" ] || [ "$twice" != 0 ] || [ "$letters" != 0 ]; then
      log "batch-inbox (upsert): $state of $keys customers as the model, $inbox inbox rows" \
        "(model: $new), $twice ids written twice, $letters dead letters"
      exit 1
    fi
    return
  fi
  local right accounts error
  read -r right accounts error < <(facts additive "$db" ours |
    $bench json get - accounts_right accounts abs_error)
  if [ "$right" != "$sum_accounts" ] || [ "$accounts" != "$sum_accounts" ] || [ "$error" != 0 ] ||
    [ "$inbox" != "$new" ] || [ "$letters" != 0 ]; then
    log "batch-inbox (additive): $right of $accounts accounts as the model ($sum_accounts in the" \
      "model), total absolute error $error, $inbox inbox rows (model: $new), $letters dead letters"
    exit 1
  fi
}

# run_ours WORK: batch-inbox on the whole topic with --exit-on-eof, its CPU from getrusage
# (`batch-inbox-bench cpu run`).
run_ours() {
  local w=$1 db
  db=$(db_of "$w" ours)
  fresh_db "$w" "$db"
  DATABASE_URL=$(db_url "$db") $bin migrate --handler sql >/dev/null
  log "$w: batch-inbox run --handler sql --apply-sql $(sql_of "$w") (defaults)"
  $bench cpu run --out "$work/cpu.json" "${cpu_targets[@]}" -- \
    env DATABASE_URL="$(db_url "$db")" RUST_LOG=warn $bin run --brokers "$KAFKA_BROKERS" \
    --topic "$topic" --group "$(label_of "$w" ours)-$stamp" --handler sql \
    --apply-sql "$(sql_of "$w")" --exit-on-eof >/dev/null
  local inbox
  inbox=$(psql_db "$db" -c "SELECT count(*) FROM inbox")
  check_ours "$w" "$db" "$inbox"
  record "$w" "$(label_of "$w" batch-inbox)" "batch-inbox run --handler sql" "$work/cpu.json" \
    "$(facts "$w" "$db" ours)" "defaults; $(sql_of "$w"); inbox rows $inbox (model: $new)"
}

# run_ledger: our reference ledger (--handler ledger) on the same records without the envelope,
# with --exit-on-eof, its CPU from getrusage (`batch-inbox-bench cpu run`). The ledger refuses overdrafts (insufficient_funds
# dead letters), so its balances are checked against the model's ledger balances ("balances"),
# exactly, by `batch-inbox-bench verify` (balances, inbox, dead letters by reason).
run_ledger() {
  local db="${PREFIX}peers_add_ledger"
  fresh_database "$db"
  DATABASE_URL=$(db_url "$db") $bin migrate --handler ledger >/dev/null
  psql_db "$db" -v ON_ERROR_STOP=1 -c \
    "CREATE TABLE expected_sums (account_id bigint PRIMARY KEY, amount bigint NOT NULL)" >/dev/null
  model_rows balances | psql_db "$db" -c "\\copy expected_sums FROM STDIN"
  log "additive: batch-inbox run --handler ledger on $topic-bare (defaults)"
  $bench cpu run --out "$work/cpu.json" "${cpu_targets[@]}" -- \
    env DATABASE_URL="$(db_url "$db")" RUST_LOG=warn $bin run --brokers "$KAFKA_BROKERS" \
    --topic "$topic-bare" --group "additive-ledger-$stamp" --handler ledger --exit-on-eof >/dev/null
  if ! $bench verify --database-url "$(db_url "$db")" --expect "$work/expect.json" >"$work/ledger-verify.log" 2>&1; then
    log "batch-inbox (ledger): not the model:"
    head -n 20 "$work/ledger-verify.log" >&2
    exit 1
  fi
  local inbox refused
  inbox=$(psql_db "$db" -c "SELECT count(*) FROM inbox")
  refused=$(psql_db "$db" -c "SELECT count(*) FROM dead_letters WHERE reason = 'insufficient_funds'")
  record additive additive-batch-inbox-ledger "batch-inbox run --handler ledger" "$work/cpu.json" \
    "$(facts additive "$db" ours)" \
    "defaults; the same entries without the envelope; checked against the ledger's model (overdrafts refused: $refused insufficient_funds dead letters); inbox rows $inbox (model: $new)"
}

# kill_peer WORK SINK FLUSH_MS: the peer's default configuration with
# offset.flush.interval.ms=FLUSH_MS, kill -9 once half the records are applied, a restart, until
# its group has committed the whole topic (nothing more can be re-delivered).
kill_peer() {
  local w=$1 k=$2 FLUSH_MS=$3 db connector
  db=$(db_of "$w" "connect_kill_$FLUSH_MS" "$k")
  connector="$(label_of "$w" "peer-kill-$FLUSH_MS" "$k")-$stamp"
  fresh_db "$w" "$db"
  rm -rf "$work/peer"
  local sink_name=${k#-}
  log "$w${sink_name:+ $sink_name}: peer with a kill -9 at half the input (offset.flush.interval.ms=$FLUSH_MS)"
  # shellcheck disable=SC2046 # peer_args is a list of K=V words
  start_peer "$work/peer" "$KAFKA_BROKERS" "$topic" "$db" CONNECTOR="$connector" \
    FLUSH_MS="$FLUSH_MS" $(peer_args "$w" "$k")
  local deadline=$((SECONDS + 600))
  while [ "$(peer_progress "$w" "$db" "$k")" -lt $((MESSAGES / 2)) ]; do
    [ $SECONDS -lt $deadline ] || { log "peer: not half-way in 600 s"; return 1; }
    peer_failed && return 1
    sleep 0.1
  done
  kill -KILL "$PEER_PID"
  local at
  at=$(peer_progress "$w" "$db" "$k")
  log "killed Kafka Connect (pid $PEER_PID) at $at writes"
  sleep 0.5
  # shellcheck disable=SC2046 # peer_args is a list of K=V words
  start_peer "$work/peer" "$KAFKA_BROKERS" "$topic" "$db" CONNECTOR="$connector" \
    FLUSH_MS="$FLUSH_MS" $(peer_args "$w" "$k")
  wait_peer "$w" "$db" 900 "$k" || return 1
  deadline=$((SECONDS + 300))
  while [ "$(peer_committed "$KAFKA_BROKERS" "connect-$connector")" != "$MESSAGES" ]; do
    [ $SECONDS -lt $deadline ] || { log "peer: its group did not commit the topic's end"; return 1; }
    sleep 2
  done
  stop_peer "$work/peer"
  PEER_PID=""
  record "$w" "$(label_of "$w" "connect-kill-$FLUSH_MS" "$k")" "Kafka Connect + Debezium JDBC sink, kill -9 at half" \
    "" "$(facts "$w" "$db" "$k")" "killed at $at rows written; offset.flush.interval.ms=$FLUSH_MS"
}

kill_ours() { # WORK
  local w=$1 db
  db=$(db_of "$w" ours_kill)
  fresh_db "$w" "$db"
  DATABASE_URL=$(db_url "$db") $bin migrate --handler sql >/dev/null
  log "$w: batch-inbox with a kill -9 at half the input"
  # In a subshell that becomes the processor (exec): $! is the processor's own pid. A session
  # timeout of 6 s (librdkafka's default is 45 s): the restarted member gets the killed one's
  # partitions once the broker gives up on it; the kill runs count writes, they are not timed.
  local session=(-X session.timeout.ms=6000 -X heartbeat.interval.ms=1000)
  (our_run "$w" "$db" "$(label_of "$w" ours-kill)-$stamp" "${session[@]}") >"$work/ours-kill-$w.log" 2>&1 &
  our_pid=$!
  local deadline=$((SECONDS + 600))
  while [ "$(psql_db "$db" -c 'SELECT count(*) FROM inbox')" -lt $((MESSAGES / 2)) ]; do
    [ $SECONDS -lt $deadline ] || { log "ours: not half-way in 600 s"; return 1; }
    sleep 0.1
  done
  kill -KILL "$our_pid"
  wait "$our_pid" 2>/dev/null || true
  our_pid=""
  local at late="" inbox
  at=$(psql_db "$db" -c 'SELECT count(*) FROM inbox')
  log "killed batch-inbox at $at inbox rows"
  # A short input can be drained before the poll sees half of it: say so rather than claim a
  # restart mid-way.
  [ "$at" -lt "$new" ] || late=" (after the last record: no restart mid-way; take more MESSAGES)"
  (our_run "$w" "$db" "$(label_of "$w" ours-kill)-$stamp" "${session[@]}" --exit-on-eof) >>"$work/ours-kill-$w.log" 2>&1
  inbox=$(psql_db "$db" -c 'SELECT count(*) FROM inbox')
  check_ours "$w" "$db" "$inbox"
  record "$w" "$(label_of "$w" batch-inbox-kill)" "batch-inbox, kill -9 at half" "" \
    "$(facts "$w" "$db" ours)" \
    "killed at $at inbox rows$late; offsets in the database; inbox rows $inbox (model: $new)"
}

rm -f "$work/rows.jsonl"
for w in $WORK; do
  # The peer's sinks of the work: one for upsert, ADDITIVE_SINKS for additive.
  sinks=-
  [ "$w" = upsert ] || sinks=$ADDITIVE_SINKS
  run_ours "$w"
  [ "$w" = upsert ] || run_ledger
  for k in $sinks; do
    for p in $PEERS; do
      IFS=: read -r name batch poll unnest reduction <<<"$p"
      run_peer "$w" "$k" "$name" "$batch" "$poll" "$unnest" "$reduction"
    done
  done
  if [ "$KILL" = 1 ]; then
    kill_ours "$w"
    for k in $sinks; do
      for f in $KILL_FLUSH_MS; do kill_peer "$w" "$k" "$f"; done
    done
  fi
done

$bench peers table --rows "$work/rows.jsonl" --expect "$work/expect.json" --out "$OUT" \
  --broker "$broker_kind" --messages "$MESSAGES" --partitions "$PARTITIONS" \
  --accounts "$ACCOUNTS" --flush-ms "$FLUSH_MS" \
  --machine-note "${MACHINE_NOTE:-other work on the machine during the measurement not stated}"
