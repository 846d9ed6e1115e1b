#!/usr/bin/env bash
# The same work on batch-inbox and on the peer a team would pick instead (Kafka Connect with
# Debezium's JDBC sink, scripts/peers/lib.sh), in one run: the same topic from
# `batch-inbox-bench produce --envelope connect-json` (a Connect JSON envelope, 10%
# duplicates: records re-sent with the id of an earlier one), the same broker and PostgreSQL.
#
# Last write wins: the customer's latest entry by key, on the same table
# (examples/sql/customer_entries.ddl.sql), upserted by Debezium's sink in upsert mode and by
# `batch-inbox run --handler sql --apply-sql examples/sql/customer_entries.sql`. A trigger logs
# every write with the record id it wrote (customer_applications), so that a second application
# of one record shows although the table hides it.
#
# For each run: msgs/s, CPU seconds per 1000 records of the sink process (the Connect JVM, our
# processor), PostgreSQL and the broker, the final state against the model (the peer is checked
# against "the last record of each key in the topic", ours against "the last new record of
# each key"), and the ids applied more than once. With KILL=1 each sink is also run once more
# with a kill -9 in the middle and a restart.
#
#   scripts/peers/compare.sh                 MESSAGES=200000 by default, results/peers/
#   MESSAGES=20000 KILL=1 scripts/peers/compare.sh
#
# Environment: MESSAGES, ACCOUNTS (1000), PARTITIONS (8), SEED (1), OUT (results/peers),
# PEERS ("default" or a space-separated list of the peer configurations below), KILL (0),
# FLUSH_MS (the peer's offset.flush.interval.ms, 10000), KILL_FLUSH_MS (those of the peer's kill
# runs, "10000 1000"), KAFKA_BROKERS (an existing broker; otherwise a single Apache Kafka node of
# its own).
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
PREFIX=${TEST_DATABASE_PREFIX:-bi_}
# Peer configurations: NAME:BATCH_SIZE:MAX_POLL:UNNEST:REDUCTION.
PEERS=${PEERS:-"default:500:500:false:false batch2000:2000:2000:false:false unnest2000:2000:2000:true:true"}
# The peer's offset-commit interval (Connect's offset.flush.interval.ms; its default is 60000),
# and those of its kill runs.
FLUSH_MS=${FLUSH_MS:-10000}
KILL_FLUSH_MS=${KILL_FLUSH_MS:-"$FLUSH_MS 1000"}
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
proc_cpu() { # CPU seconds of one live process
  [ -n "$1" ] && [ -r "/proc/$1/stat" ] || { echo 0; return; }
  awk -v hz="$(getconf CLK_TCK)" '{sub(/.*\) /, ""); print ($12+$13)/hz}' "/proc/$1/stat"
}
machine_cpu() { awk -v hz="$(getconf CLK_TCK)" '/^cpu /{print ($2+$3+$4+$7+$8+$9)/hz}' /proc/stat; }
pg_cpu() {
  python3 - "$(psql_db postgres -c 'SHOW data_directory')/postmaster.pid" <<'PY'
import os, sys
try:
    pm = open(sys.argv[1]).readline().strip()
except OSError:
    print(0); sys.exit()
def fields(pid):
    s = open(f"/proc/{pid}/stat").read()
    return s[s.rindex(")") + 2:].split()
ticks = 0
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    try:
        f = fields(pid)
    except OSError:
        continue
    if pid == pm:
        ticks += sum(int(x) for x in f[11:15])  # utime stime cutime cstime
    elif f[1] == pm:
        ticks += int(f[11]) + int(f[12])
print(ticks / os.sysconf("SC_CLK_TCK"))
PY
}
now() { date +%s.%N; }
minus() { awk -v a="$1" -v b="$2" 'BEGIN { print a - b }'; }

# The input, once, for every run.
topic="peers-$stamp"
log "producing $MESSAGES records (10% duplicates, no bad input) to $topic ($PARTITIONS partitions)"
$bench produce --brokers "$KAFKA_BROKERS" --topic "$topic" --partitions "$PARTITIONS" \
  --messages "$MESSAGES" --accounts "$ACCOUNTS" --duplicate-ratio 0.1 --bad-ratio 0 \
  --seed "$SEED" --envelope connect-json --expect "$work/expect.json" >&2
read -r new dups keys < <(python3 -c '
import json, sys
e = json.load(open(sys.argv[1]))
print(e["new"], e["duplicates"], len(e["last_new"]))' "$work/expect.json")
log "model: $new new records, $dups duplicates, $keys customers"

# fresh_db NAME: the database of one run, with the table, its trigger and the model's two
# expected states (expected_last_new, expected_last_sent: customer_id → id).
fresh_db() {
  local db=$1
  fresh_database "$db"
  psql_db "$db" -v ON_ERROR_STOP=1 -f examples/sql/customer_entries.ddl.sql >/dev/null
  psql_db "$db" -v ON_ERROR_STOP=1 -c \
    "CREATE TABLE expected_last_new (customer_id text PRIMARY KEY, id text NOT NULL);
     CREATE TABLE expected_last_sent (customer_id text PRIMARY KEY, id text NOT NULL);" >/dev/null
  python3 -c '
import json, sys
e = json.load(open(sys.argv[1]))
for k, v in e[sys.argv[2]].items():
    print(f"{k}\t{v}")' "$work/expect.json" last_new |
    psql_db "$db" -c "\\copy expected_last_new FROM STDIN"
  python3 -c '
import json, sys
e = json.load(open(sys.argv[1]))
for k, v in e[sys.argv[2]].items():
    print(f"{k}\t{v}")' "$work/expect.json" last_sent |
    psql_db "$db" -c "\\copy expected_last_sent FROM STDIN"
}

# matching DB TABLE: customers whose row holds the id TABLE expects.
matching() {
  psql_db "$1" -c "SELECT count(*) FROM customer_entries c JOIN $2 x USING (customer_id)
                   WHERE c.id = x.id"
}

# facts DB: one JSON object of what the run left.
facts() {
  psql_db "$1" -c "SELECT json_build_object(
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
}

# wait_state DB TABLE DEADLINE_S: until every customer's row holds TABLE's id (polled).
wait_state() {
  local deadline=$((SECONDS + $3))
  while [ "$(matching "$1" "$2")" != "$keys" ]; do
    [ $SECONDS -lt "$deadline" ] || return 1
    if [ -n "${PEER_PID:-}" ] && { ! kill -0 "$PEER_PID" 2>/dev/null ||
      grep -q "Task threw an uncaught and unrecoverable exception" "$work/peer/connect.log"; }; then
      log "Kafka Connect ended or its task failed; its errors:"
      grep -A3 ERROR "$work/peer/connect.log" | head -n 20 >&2
      return 1
    fi
    sleep 0.2
  done
}

# record LABEL SINK WALL SINK_CPU PG_CPU BROKER_CPU MACHINE_CPU FACTS [NOTE]: one result row.
record() {
  python3 - "$work/rows.jsonl" "$MESSAGES" "$@" <<'PY'
import json, sys
f, n, label, sink, wall, s, p, b, m, facts = sys.argv[1:11]
note = sys.argv[11] if len(sys.argv) > 11 else ""
n = int(n)
row = {"label": label, "sink": sink, "records": n, "wall_s": round(float(wall), 2),
       "msgs_per_s": round(n / float(wall)),
       "cpu_ms_per_1k": {"sink": round(float(s) * 1e6 / n, 1), "postgres": round(float(p) * 1e6 / n, 1),
                         "broker": round(float(b) * 1e6 / n, 1), "machine": round(float(m) * 1e6 / n, 1)},
       "state": json.loads(facts), "note": note}
open(f, "a").write(json.dumps(row) + "\n")
print(json.dumps(row))
PY
}

# run_peer NAME BATCH MAX_POLL UNNEST REDUCTION: the peer on the whole topic, timed from its task's
# start to the moment every customer holds the last record of its key in the topic.
run_peer() {
  local name=$1 db="${PREFIX}peers_connect_$1"
  fresh_db "$db"
  rm -rf "$work/peer"
  log "peer $name: batch.size=$2 max.poll.records=$3 unnest=$4 reduction=$5"
  start_peer "$work/peer" "$KAFKA_BROKERS" "$topic" "$db" CONNECTOR="peer-$name-$stamp" \
    BATCH_SIZE="$2" MAX_POLL="$3" UNNEST="$4" REDUCTION="$5" FLUSH_MS="$FLUSH_MS"
  local t0 s0 p0 b0 m0
  t0=$(now) s0=$(proc_cpu "$PEER_PID") p0=$(pg_cpu) b0=$(proc_cpu "$broker_pid") m0=$(machine_cpu)
  wait_state "$db" expected_last_sent 900 || { log "peer $name: no final state in 900 s"; return 1; }
  local t1 s1 p1 b1 m1
  t1=$(now) s1=$(proc_cpu "$PEER_PID") p1=$(pg_cpu) b1=$(proc_cpu "$broker_pid") m1=$(machine_cpu)
  stop_peer "$work/peer"
  PEER_PID=""
  record "connect-$name" "Kafka Connect $KAFKA_VERSION + Debezium JDBC sink $PEER_DEBEZIUM_VERSION ($name)" \
    "$(minus "$t1" "$t0")" "$(minus "$s1" "$s0")" "$(minus "$p1" "$p0")" \
    "$(minus "$b1" "$b0")" "$(minus "$m1" "$m0")" "$(facts "$db")" \
    "batch.size=$2 consumer.max.poll.records=$3 unnest=$4 use.reduction.buffer=$5 offset.flush.interval.ms=$FLUSH_MS"
}

our_run() { # DB GROUP [flags...]: the processor, in place of the calling (sub)shell
  local db=$1 group=$2
  shift 2
  exec env DATABASE_URL="$(db_url "$db")" RUST_LOG=warn $bin run --brokers "$KAFKA_BROKERS" --topic "$topic" \
    --group "$group" --handler sql --apply-sql examples/sql/customer_entries.sql "$@"
}

# check_ours DB INBOX_ROWS: the model's final state, its count of new ids in the inbox, and no id
# written twice; the run fails otherwise.
check_ours() {
  local state twice
  state=$(matching "$1" expected_last_new)
  twice=$(psql_db "$1" -c "SELECT count(*) FROM (SELECT id FROM customer_applications
                           GROUP BY id HAVING count(*) > 1) t")
  if [ "$state" != "$keys" ] || [ "$2" != "$new" ] || [ "$twice" != 0 ]; then
    log "batch-inbox: $state of $keys customers as the model, $2 inbox rows (model: $new)," \
      "$twice ids written twice"
    exit 1
  fi
}

# run_ours: batch-inbox on the whole topic with --exit-on-eof, its CPU from getrusage.
run_ours() {
  local db="${PREFIX}peers_ours"
  fresh_db "$db"
  DATABASE_URL=$(db_url "$db") $bin migrate --handler sql >/dev/null
  log "batch-inbox run --handler sql (defaults)"
  local t0 p0 b0 m0 s
  t0=$(now) p0=$(pg_cpu) b0=$(proc_cpu "$broker_pid") m0=$(machine_cpu)
  s=$(python3 -c '
import resource, subprocess, sys
rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(r.ru_utime + r.ru_stime)
sys.exit(rc)' env DATABASE_URL="$(db_url "$db")" RUST_LOG=warn $bin run --brokers "$KAFKA_BROKERS" \
    --topic "$topic" --group "ours-$stamp" --handler sql \
    --apply-sql examples/sql/customer_entries.sql --exit-on-eof)
  local t1 p1 b1 m1
  t1=$(now) p1=$(pg_cpu) b1=$(proc_cpu "$broker_pid") m1=$(machine_cpu)
  local inbox
  inbox=$(psql_db "$db" -c "SELECT count(*) FROM inbox")
  check_ours "$db" "$inbox"
  record "batch-inbox" "batch-inbox run --handler sql" "$(minus "$t1" "$t0")" "$s" \
    "$(minus "$p1" "$p0")" "$(minus "$b1" "$b0")" "$(minus "$m1" "$m0")" \
    "$(facts "$db")" "defaults; inbox rows $inbox (model: $new)"
}

# kill_peer FLUSH_MS: the peer's default configuration with offset.flush.interval.ms=FLUSH_MS,
# kill -9 once half the records are applied, a restart, until its group has committed the whole
# topic (nothing more can be re-delivered).
kill_peer() {
  local FLUSH_MS=$1 db="${PREFIX}peers_connect_kill_$1"
  fresh_db "$db"
  rm -rf "$work/peer"
  log "peer with a kill -9 at half the input (offset.flush.interval.ms=$FLUSH_MS)"
  start_peer "$work/peer" "$KAFKA_BROKERS" "$topic" "$db" CONNECTOR="peer-kill-$FLUSH_MS-$stamp" \
    FLUSH_MS="$FLUSH_MS"
  local deadline=$((SECONDS + 600))
  while [ "$(psql_db "$db" -c 'SELECT count(*) FROM customer_applications')" -lt $((MESSAGES / 2)) ]; do
    [ $SECONDS -lt $deadline ] || { log "peer: not half-way in 600 s"; return 1; }
    sleep 0.1
  done
  kill -KILL "$PEER_PID"
  local at
  at=$(psql_db "$db" -c 'SELECT count(*) FROM customer_applications')
  log "killed Kafka Connect (pid $PEER_PID) at $at writes"
  sleep 0.5
  start_peer "$work/peer" "$KAFKA_BROKERS" "$topic" "$db" CONNECTOR="peer-kill-$FLUSH_MS-$stamp" \
    FLUSH_MS="$FLUSH_MS"
  wait_state "$db" expected_last_sent 900 || return 1
  deadline=$((SECONDS + 300))
  while [ "$(peer_committed "$KAFKA_BROKERS" "connect-peer-kill-$FLUSH_MS-$stamp")" != "$MESSAGES" ]; do
    [ $SECONDS -lt $deadline ] || { log "peer: its group did not commit the topic's end"; return 1; }
    sleep 2
  done
  stop_peer "$work/peer"
  PEER_PID=""
  record "connect-kill-$FLUSH_MS" "Kafka Connect + Debezium JDBC sink, kill -9 at half" 1 0 0 0 0 "$(facts "$db")" \
    "killed at $at writes; offset.flush.interval.ms=$FLUSH_MS"
}

kill_ours() {
  local db="${PREFIX}peers_ours_kill"
  fresh_db "$db"
  DATABASE_URL=$(db_url "$db") $bin migrate --handler sql >/dev/null
  log "batch-inbox with a kill -9 at half the input"
  # In a subshell that becomes the processor (exec): $! is the processor's own pid.
  (our_run "$db" "ours-kill-$stamp") >"$work/ours-kill.log" 2>&1 &
  our_pid=$!
  local deadline=$((SECONDS + 600))
  while [ "$(psql_db "$db" -c 'SELECT count(*) FROM inbox')" -lt $((MESSAGES / 2)) ]; do
    [ $SECONDS -lt $deadline ] || { log "ours: not half-way in 600 s"; return 1; }
    sleep 0.1
  done
  kill -KILL "$our_pid"
  wait "$our_pid" 2>/dev/null || true
  our_pid=""
  local at late=""
  at=$(psql_db "$db" -c 'SELECT count(*) FROM inbox')
  log "killed batch-inbox at $at inbox rows"
  # A short input can be drained before the poll sees half of it: say so rather than claim a
  # restart mid-way.
  [ "$at" -lt "$new" ] || late=" (after the last record: no restart mid-way; take more MESSAGES)"
  (our_run "$db" "ours-kill-$stamp" --exit-on-eof) >>"$work/ours-kill.log" 2>&1
  check_ours "$db" "$(psql_db "$db" -c 'SELECT count(*) FROM inbox')"
  record "batch-inbox-kill" "batch-inbox, kill -9 at half" 1 0 0 0 0 "$(facts "$db")" \
    "killed at $at inbox rows$late; offsets in the database; inbox rows $(psql_db "$db" -c 'SELECT count(*) FROM inbox') (model: $new)"
}

rm -f "$work/rows.jsonl"
run_ours
for p in $PEERS; do
  IFS=: read -r name batch poll unnest reduction <<<"$p"
  run_peer "$name" "$batch" "$poll" "$unnest" "$reduction"
done
if [ "$KILL" = 1 ]; then
  kill_ours
  for f in $KILL_FLUSH_MS; do kill_peer "$f"; done
fi

python3 scripts/peers/table.py "$work/rows.jsonl" "$work/expect.json" "$OUT" "$broker_kind" \
  "$MESSAGES" "$PARTITIONS" "$ACCOUNTS" "$FLUSH_MS"
