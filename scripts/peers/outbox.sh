#!/usr/bin/env bash
# Outbox → inbox, end to end, with a producer no one here wrote: service A writes events to its
# `outbox` table; Debezium's PostgreSQL source connector (in Kafka Connect) publishes them through
# its outbox event router; batch-inbox applies them to service B's database with the SQL handler
# (examples/sql/outbox_events.sql). While A writes, Connect and the processor are killed with
# SIGKILL at seeded random moments and started again, ROUNDS times. Then:
#
#   - B holds exactly A's committed events (id, aggregate, type and payload, compared row by
#     row), each applied once, and none of A's rolled-back ones;
#   - every record in the topics is accounted for: the events applied (the inbox's rows) plus the
#     duplicates Debezium re-published after its restarts, skipped; no dead letter;
#   - a new consumer group over the same topics applies nothing and counts every record as a
#     duplicate (its --stats-file).
#
# Service A runs on a PostgreSQL cluster of the script's own (initdb in a temporary directory, on
# a free port): Debezium needs wal_level=logical, which is cluster-wide and needs a restart. Its
# replication slot is dropped and the cluster removed at the end. Service B is a database of the
# shared server (ensure_postgres), ${TEST_DATABASE_PREFIX:-bi_}outbox_b, dropped and created again.
#
#   scripts/peers/outbox.sh                   ROUNDS=10, results/peers/outbox.{md,json}
#   ROUNDS=3 OUT=/tmp/x scripts/peers/outbox.sh  the short form CI runs
#
# Environment: ROUNDS (10), SEED (1), PARTITIONS (4), FLUSH_MS (Connect's
# offset.flush.interval.ms, 5000), OUT (results/peers), KAFKA_BROKERS (an existing broker;
# otherwise a single Apache Kafka node of its own).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/peers/lib.sh

ROUNDS=${ROUNDS:-10}
SEED=${SEED:-1}
PARTITIONS=${PARTITIONS:-4}
FLUSH_MS=${FLUSH_MS:-5000}
OUT=${OUT:-results/peers}
PREFIX=${TEST_DATABASE_PREFIX:-bi_}
bin=./target/release/batch-inbox bench=./target/release/batch-inbox-bench
stamp=$(date +%s)
work=$(mktemp -d /tmp/peers-outbox.XXXXXX)
chmod 755 "$work" # service A's cluster runs as user postgres below it
log() { echo "[$(date +%T)] $*" >&2; }
started=$SECONDS

ensure_postgres
ensure_outbox_source
log "building the release binaries"
cargo build --release -q -p batch-inbox -p batch-inbox-tools --bins

a_dir=$work/service-a
a_port=$(free_port)
slot=outbox_$stamp
own_broker=""
writer_pid="" proc_pid=""
cleanup() {
  local rc=$1
  [ -n "$writer_pid" ] && kill "$writer_pid" 2>/dev/null
  [ -n "$proc_pid" ] && kill -KILL "$proc_pid" 2>/dev/null
  [ -f "$work/connect/pid" ] && stop_peer "$work/connect"
  if [ -f "$a_dir/data/postmaster.pid" ]; then
    drop_slot || true
    private_postgres_remove "$a_dir"
  fi
  [ -n "$own_broker" ] && stop_broker "$work/broker"
  if [ "$rc" = 0 ]; then rm -rf "$work"; else log "the run failed; its logs are in $work"; fi
  return 0
}
trap 'cleanup $?' EXIT
# The slot holds WAL on A for as long as it exists: dropped once Connect has let go of it (its
# walsender ends a moment after Connect does).
drop_slot() {
  local left
  for _ in $(seq 1 100); do
    left=$(psql_a -c "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '$slot'" 2>/dev/null) ||
      return 1
    [ "$left" = 0 ] && return 0
    psql_a -c "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
               WHERE slot_name = '$slot' AND NOT active" >/dev/null 2>&1 || true
    sleep 0.1
  done
  log "replication slot $slot still active after 10 s"
  return 1
}

if [ -z "${KAFKA_BROKERS:-}" ]; then
  own_broker=1
  start_broker "$work/broker"
  KAFKA_BROKERS=$BROKER_ADDR
fi
log "broker: ${BROKER_KIND:-the broker of KAFKA_BROKERS} on $KAFKA_BROKERS"

psql_a() { psql -X -q -At -h 127.0.0.1 -p "$a_port" -U postgres -d service_a "$@"; }
psql_b() { psql -X -q -At -h 127.0.0.1 -U postgres -d "$b_db" "$@"; }

# Service A: its own cluster with logical decoding, and the outbox table in the columns Debezium's
# outbox event router reads by default.
log "service A: a PostgreSQL cluster of its own on port $a_port, wal_level=logical"
private_postgres_init "$a_dir" "$a_port" "-c wal_level=logical -c max_wal_senders=4 -c max_replication_slots=4"
psql -X -q -h 127.0.0.1 -p "$a_port" -U postgres -d postgres -c "CREATE DATABASE service_a"
psql_a -v ON_ERROR_STOP=1 <<'SQL'
CREATE TABLE outbox (
    id uuid PRIMARY KEY,
    aggregatetype text NOT NULL,
    aggregateid text NOT NULL,
    type text NOT NULL,
    payload jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
SQL

# Service B: the inbox's tables and the table of received events.
b_db="${PREFIX}outbox_b"
fresh_database "$b_db"
b_url="postgres://postgres@127.0.0.1:5432/$b_db"
DATABASE_URL=$b_url $bin migrate --handler sql >/dev/null
psql_b -v ON_ERROR_STOP=1 -f examples/sql/outbox_events.ddl.sql >/dev/null

# The router's topics, one per aggregate type, created before anything is published.
prefix="outbox-$stamp"
topics="$prefix.order,$prefix.customer"
for t in ${topics//,/ }; do
  kafka_tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$KAFKA_BROKERS" --create \
    --topic "$t" --partitions "$PARTITIONS" --replication-factor 1 >/dev/null
done

connect_settings=(CONNECTOR="outbox-$stamp" PG_PORT="$a_port" DB=service_a SLOT="$slot"
  PUBLICATION="outbox_$stamp" TOPIC_PREFIX="$prefix" FLUSH_MS="$FLUSH_MS")
connect_up() { start_outbox_source "$work/connect" "$KAFKA_BROKERS" "${connect_settings[@]}"; }
connect_kill() {
  kill -KILL "$OUTBOX_PID" 2>/dev/null || true
  while kill -0 "$OUTBOX_PID" 2>/dev/null; do sleep 0.05; done
}
runs=0
# The processor, in a subshell that becomes it (exec): $! is its own pid. Each start writes its own
# stats file. A session timeout of 6 s (librdkafka's default is 45 s): a killed member's
# partitions go to its successor once the broker gives up on it, and the rounds are seconds apart.
proc_up() {
  runs=$((runs + 1))
  (exec env DATABASE_URL="$b_url" RUST_LOG=warn "$bin" run --brokers "$KAFKA_BROKERS" \
    --topic "$topics" --group "service-b-$stamp" --handler sql \
    --apply-sql examples/sql/outbox_events.sql --id-header id \
    -X session.timeout.ms=6000 -X heartbeat.interval.ms=1000 \
    --stats-file "$work/stats-$runs.json" "$@") >>"$work/processor.log" 2>&1 &
  proc_pid=$!
}
proc_kill() {
  kill -KILL "$proc_pid" 2>/dev/null || true
  wait "$proc_pid" 2>/dev/null || true
}

log "Kafka Connect $OUTBOX_CONNECT_VERSION with Debezium's PostgreSQL connector $OUTBOX_DEBEZIUM_VERSION" \
  "and its outbox event router (offset.flush.interval.ms=$FLUSH_MS)"
connect_up
proc_up

# Service A's writer: transactions of 1 to 20 events of two aggregate types, every ninth one rolled
# back (its events must reach no one). Payloads hold what JSON carries: nested objects and arrays,
# decimals, null, an empty object, quotes, backslashes, newlines and characters beyond ASCII.
cat >"$work/write.sql" <<'SQL'
BEGIN;
INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
SELECT gen_random_uuid(),
       CASE WHEN g % 3 = 0 THEN 'customer' ELSE 'order' END,
       ((random() * 200)::int)::text,
       CASE WHEN g % 3 = 0 THEN 'CustomerUpdated' ELSE 'OrderPlaced' END,
       jsonb_build_object('tx', :tx, 'n', g,
                          'amount', round((random() * 100000)::numeric, 2),
                          'lines', jsonb_build_array(jsonb_build_object('sku', 'A-' || g, 'qty', g),
                                                     jsonb_build_object('sku', 'B', 'qty', 1.5)),
                          'note', E'naïve "quoted" \\ back\nslash ✓ 東京',
                          'none', NULL, 'empty', '{}'::jsonb)
FROM generate_series(1, 1 + (random() * 19)::int) g;
:end;
SQL
(
  tx=0
  while [ ! -f "$work/stop-writer" ]; do
    tx=$((tx + 1))
    end=COMMIT
    [ $((tx % 9)) = 0 ] && end=ROLLBACK
    psql_a -v ON_ERROR_STOP=1 -v tx="$tx" -v end="$end" -f "$work/write.sql" >/dev/null
    sleep 0.02
  done
  echo "$tx" >"$work/writer-transactions"
) &
writer_pid=$!

# The kills: ROUNDS rounds, each after 2 to 8 s, of Connect, the processor or both, each started
# again 0 to 2 s later. The schedule is a function of SEED.
RANDOM=$SEED
kills_connect=0 kills_processor=0 schedule=()
pause() { awk -v r="$1" -v lo="$2" -v hi="$3" 'BEGIN { printf "%.2f", lo + (hi - lo) * r / 32767 }'; }
for round in $(seq 1 "$ROUNDS"); do
  # Drawn here, not inside $(…): bash reseeds RANDOM in a subshell.
  r_wait=$RANDOM r_victim=$RANDOM r_down=$RANDOM
  wait_s=$(pause "$r_wait" 2 8)
  victim=$((r_victim % 3))
  down_s=$(pause "$r_down" 0 2)
  sleep "$wait_s"
  case $victim in
    0) what=connect ;;
    1) what=processor ;;
    *) what=both ;;
  esac
  [ "$what" = processor ] || { connect_kill; kills_connect=$((kills_connect + 1)); }
  [ "$what" = connect ] || { proc_kill; kills_processor=$((kills_processor + 1)); }
  log "round $round: after ${wait_s} s, kill -9 of $what ($(psql_a -c 'SELECT count(*) FROM outbox') events in A," \
    "$(psql_b -c 'SELECT count(*) FROM received_events') in B); up again ${down_s} s later"
  schedule+=("$wait_s:$what:$down_s")
  sleep "$down_s"
  [ "$what" = processor ] || connect_up
  [ "$what" = connect ] || proc_up
done

touch "$work/stop-writer"
wait "$writer_pid"
writer_pid=""
events=$(psql_a -c "SELECT count(*) FROM outbox")
transactions=$(cat "$work/writer-transactions")
log "A committed $events events in $((transactions - transactions / 9)) transactions" \
  "($((transactions / 9)) more rolled back)"

# Until B has every committed event of A (Connect has then published all of them: after a restart
# it re-publishes from its last flushed position, older events first).
deadline=$((SECONDS + 300))
while [ "$(psql_b -c 'SELECT count(DISTINCT event_id) FROM received_events')" -lt "$events" ]; do
  if [ $SECONDS -ge $deadline ]; then
    log "B did not receive A's $events events in 300 s"
    exit 1
  fi
  kill -0 "$proc_pid" 2>/dev/null || { log "the processor ended:"; tail -n 20 "$work/processor.log" >&2; exit 1; }
  sleep 0.5
done
# Connect stopped (its offsets flushed, nothing more published), then the processor stopped and
# run once more to the topics' end: every record has then been read by service B's group.
stop_peer "$work/connect"
rm -f "$work/connect/pid"
drop_slot
log "Connect stopped, replication slot $slot dropped"
kill -TERM "$proc_pid"
wait "$proc_pid" || { log "the processor did not stop cleanly:"; tail -n 20 "$work/processor.log" >&2; exit 1; }
proc_up --exit-on-eof
wait "$proc_pid" || { log "the last drain failed:"; tail -n 20 "$work/processor.log" >&2; exit 1; }
proc_pid=""

# The records in the topics: the sum of their partitions' end offsets.
published=$(kafka_tool org.apache.kafka.tools.GetOffsetShell --bootstrap-server "$KAFKA_BROKERS" \
  --topic "$prefix\\..*" | $bench kafka end-offsets)

# B against A, row by row: A's committed events copied into B as the expectation.
psql_b -v ON_ERROR_STOP=1 -c "CREATE TABLE expected_events (id uuid PRIMARY KEY,
  aggregatetype text, aggregateid text, type text, payload jsonb)" >/dev/null
psql_a -c "\\copy (SELECT id, aggregatetype, aggregateid, type, payload FROM outbox) TO STDOUT" |
  psql_b -c "\\copy expected_events FROM STDIN"
read -r b_rows b_distinct missing unexpected differing inbox dead < <(psql_b -F ' ' -c "
  SELECT (SELECT count(*) FROM received_events),
         (SELECT count(DISTINCT event_id) FROM received_events),
         (SELECT count(*) FROM expected_events x
           WHERE NOT EXISTS (SELECT 1 FROM received_events r WHERE r.event_id = x.id)),
         (SELECT count(*) FROM received_events r
           WHERE NOT EXISTS (SELECT 1 FROM expected_events x WHERE x.id = r.event_id)),
         (SELECT count(*) FROM received_events r JOIN expected_events x ON x.id = r.event_id
           WHERE (r.aggregate_type, r.aggregate_id, r.event_type, r.payload)
                 IS DISTINCT FROM (x.aggregatetype, x.aggregateid, x.type, x.payload)),
         (SELECT count(*) FROM inbox),
         (SELECT count(*) FROM dead_letters)")

# A new group over the same topics: every record a duplicate, nothing applied.
replay_stats=$work/replay-stats.json
env DATABASE_URL="$b_url" RUST_LOG=warn "$bin" run --brokers "$KAFKA_BROKERS" --topic "$topics" \
  --group "replay-$stamp" --handler sql --apply-sql examples/sql/outbox_events.sql --id-header id \
  --exit-on-eof --stats-file "$replay_stats" >>"$work/processor.log" 2>&1
read -r replay_records replay_new replay_dups < <($bench json get "$replay_stats" \
  stats.records stats.new stats.duplicates)
b_after=$(psql_b -c "SELECT count(*) FROM received_events")

failures=()
[ "$b_rows" = "$events" ] || failures+=("B has $b_rows rows for A's $events events")
[ "$b_distinct" = "$events" ] || failures+=("B has $b_distinct distinct events, A $events")
[ "$missing" = 0 ] || failures+=("$missing of A's events are not in B")
[ "$unexpected" = 0 ] || failures+=("$unexpected events in B are not A's (rolled back?)")
[ "$differing" = 0 ] || failures+=("$differing events differ between A and B")
[ "$inbox" = "$events" ] || failures+=("the inbox has $inbox rows for $events events")
[ "$dead" = 0 ] || failures+=("$dead dead letters")
[ "$published" -ge "$events" ] || failures+=("the topics hold $published records for $events events")
[ "$replay_new" = 0 ] || failures+=("a new group applied $replay_new events again")
[ "$replay_records" = "$published" ] && [ "$replay_dups" = "$published" ] ||
  failures+=("a new group read $replay_records records, $replay_dups duplicates, of $published")
[ "$b_after" = "$events" ] || failures+=("B has $b_after rows after the new group's run")
[ "$kills_connect" -gt 0 ] && [ "$kills_processor" -gt 0 ] ||
  failures+=("the schedule killed Connect $kills_connect times and the processor $kills_processor (take more ROUNDS or another SEED)")

mkdir -p "$OUT"
$bench peers outbox-report --out "$OUT" --seed "$SEED" --rounds "$ROUNDS" --flush-ms "$FLUSH_MS" \
  --partitions "$PARTITIONS" --events "$events" --transactions "$transactions" \
  --published "$published" --b-rows "$b_rows" --inbox "$inbox" --dead-letters "$dead" \
  --replay-duplicates "$replay_dups" --kills-connect "$kills_connect" \
  --kills-processor "$kills_processor" --processor-starts "$runs" \
  --wall-s "$((SECONDS - started))" --failures "${#failures[@]}" \
  --connect-version "$OUTBOX_CONNECT_VERSION" --debezium-version "$OUTBOX_DEBEZIUM_VERSION" \
  --broker "${BROKER_KIND:-the broker of KAFKA_BROKERS}" --schedule "${schedule[*]}"
duplicates=$($bench json get "$OUT/outbox.json" duplicates_published_and_skipped)

if [ "${#failures[@]}" != 0 ]; then
  printf 'outbox → inbox check FAILED: %s\n' "${failures[@]}" >&2
  exit 1
fi
log "outbox → inbox: B holds A's $events events, each once; $duplicates duplicates Debezium" \
  "re-published were skipped; a new group skipped all $published records"
