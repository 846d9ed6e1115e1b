#!/usr/bin/env bash
# Failover run: the database goes back in time under a running processor. A primary PostgreSQL
# and an asynchronous streaming replica (pg_basebackup -R) of it; the processor is connected to
# both with a multi-host URL (target_session_attrs=read-write) while a generated input
# (duplicates, a little bad input, overdrafts) arrives on a 4-partition topic. Under load the
# replication is cut (the replica's primary_conninfo emptied and reloaded: its walreceiver
# stops, checked by the replica's received LSN standing still while the primary's advances), the
# primary runs ahead, then it dies (SIGKILL of the postmaster and every backend at once) and the
# replica is promoted. The processor must reconnect by itself and drain; then the promoted
# database is checked against the generator's model exactly (`batch-inbox-bench verify`) and,
# record by record, against the topic (`batch-inbox-bench recovery check`: what was lost, where,
# and whether anything was applied twice).
#
#   scripts/failover.sh [--messages N] [--sync] [--seed N] [--results-dir DIR]
#
#   --messages N   input records (default 20000: about 2 minutes, the CI form)
#   --sync         synchronous replication (synchronous_standby_names = '*') and no cut: the
#                  replica has every commit the processor saw; nothing to recover, still exact
#   --seed N       the generator's seed (default 1)
#
# Environment: BIN (the processor under test, default target/release/batch-inbox, built unless
# BIN is set), BENCH (default target/release/batch-inbox-bench), SKIP_BUILD=1, RATE (input
# records/s, default messages/40 s), PROMOTE_DELAY (seconds between the kill and the promotion,
# default 3), URL_FORM=keyvalue (the processor's DATABASE_URL as `host=a,b port=p1,p2 …` instead of
# a URL), KEEP=1 (keep the run's directory: logs, data directories, the topic read back).
#
# Starts its OWN two PostgreSQL servers (Debian's /usr/lib/postgresql/15/bin; initdb in the run's
# temporary directory, free ports on 127.0.0.1, fsync on) and its own Apache Kafka node; stops and
# removes them at the end. Prints a summary; writes results/failover/failover-<UTC>-<async|sync>-n<N>-seed<S>.json
# and .md (--results-dir elsewhere). Exit status: 0 the final database is exactly the model,
# 1 it is not (a message lost or applied twice), 2 the run itself failed.
set -euo pipefail
cd "$(dirname "$0")/.."
PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
source scripts/lib.sh
source scripts/recovery-lib.sh

messages=20000 sync=0 seed=1 results_dir=results/failover
while [ $# -gt 0 ]; do
  case "$1" in
    --messages) messages=$2; shift ;;
    --sync) sync=1 ;;
    --seed) seed=$2; shift ;;
    --results-dir) results_dir=$2; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown flag $1 (see $0 --help)" >&2; exit 2 ;;
  esac
  shift
done
rate=${RATE:-$((messages / 40))}
promote_delay=${PROMOTE_DELAY:-3}

log() { echo "[failover.sh $(date +%T)] $*" >&2; }
work=$(mktemp -d /tmp/failover.XXXXXX)
chmod 755 "$work"
primary="$work/primary" replica="$work/replica"
status=2 producer_pid="" PROCESSOR_PID="" name=failover
# shellcheck disable=SC2317 # run by the EXIT trap
cleanup() {
  [ -n "$PROCESSOR_PID" ] && kill -KILL "$PROCESSOR_PID" 2>/dev/null
  [ -n "$producer_pid" ] && kill -KILL "$producer_pid" 2>/dev/null
  stop_broker "$work/broker"
  private_postgres_crash "$primary" 2>/dev/null || true
  private_postgres_crash "$replica" 2>/dev/null || true
  private_postgres_crash "$work/old-primary" 2>/dev/null || true
  if [ "${KEEP:-0}" = 1 ]; then
    log "kept $work"
  elif [ "$status" = 1 ]; then
    mkdir -p "$results_dir"
    cp "$work/processor.log" "$results_dir/$name.processor.log" 2>/dev/null || true
    rm -rf "$work"
  else
    rm -rf "$work"
  fi
  # Whatever ended the script (a command that failed under set -e, a signal): 0, 1 or 2 only.
  exit "$status"
}
trap cleanup EXIT
trap 'status=2; exit 130' INT
trap 'status=2; exit 143' TERM
fail() { log "run failed: $*"; status=2; exit 2; }

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  log "building release"
  if [ -z "${BIN:-}" ]; then
    cargo build --release --quiet -p batch-inbox -p batch-inbox-tools
  else
    cargo build --release --quiet -p batch-inbox-tools
  fi
fi
BIN=${BIN:-./target/release/batch-inbox}
BENCH=${BENCH:-./target/release/batch-inbox-bench}
{ [ -x "$BIN" ] && [ -x "$BENCH" ]; } || fail "no $BIN or $BENCH"
[ -x "$PG_BIN/initdb" ] || fail "no PostgreSQL at $PG_BIN (Debian's postgresql-15)"
mode=async
[ "$sync" = 1 ] && mode=sync
name="failover-$(date -u +%Y%m%dT%H%M%SZ)-$mode-n$messages-seed$seed"

# The primary, then its replica from a base backup (-R: standby.signal and primary_conninfo).
p1=$(free_port)
log "primary PostgreSQL on 127.0.0.1:$p1"
private_postgres_init "$primary" "$p1" \
  "-c wal_level=replica -c max_wal_senders=5 -c wal_keep_size=256MB" || fail "primary did not start"
# Topic and group of this run only (KAFKA_BROKERS may name a broker that earlier runs used).
stamp="$(date +%s)-$$"
RUN_DB=failover RUN_GROUP="failover-$seed-$stamp" topic="failover-$seed-$stamp"
psql -X -q -h 127.0.0.1 -p "$p1" -U postgres -d postgres -c "CREATE DATABASE $RUN_DB" >/dev/null
DATABASE_URL="postgres://postgres@127.0.0.1:$p1/$RUN_DB" "$BIN" migrate --handler ledger >/dev/null ||
  fail "migrate"
p2=$(free_port)
mkdir -p "$replica"
[ "$(id -u)" = 0 ] && chown postgres:postgres "$replica"
as_postgres "$PG_BIN/pg_basebackup" -h 127.0.0.1 -p "$p1" -U postgres -D "$replica/data" -R \
  -X stream -c fast >"$replica/basebackup.log" 2>&1 || fail "pg_basebackup: $(cat "$replica/basebackup.log")"
log "replica (pg_basebackup -R) on 127.0.0.1:$p2"
private_postgres_start "$replica" "$p2" || fail "replica did not start"
for _ in $(seq 1 100); do
  [ "$(RUN_DB=postgres pg_at "$p2" "SELECT count(*) FROM pg_stat_wal_receiver WHERE status = 'streaming'")" = 1 ] && break
  sleep 0.1
done
[ "$(RUN_DB=postgres pg_at "$p1" "SELECT count(*) FROM pg_stat_replication")" = 1 ] || fail "replica not streaming"
if [ "$sync" = 1 ]; then
  RUN_DB=postgres pg_at "$p1" "ALTER SYSTEM SET synchronous_standby_names = '*'" "SELECT pg_reload_conf()" >/dev/null
  for _ in $(seq 1 50); do
    [ "$(RUN_DB=postgres pg_at "$p1" "SELECT sync_state FROM pg_stat_replication")" = sync ] && break
    sleep 0.1
  done
  [ "$(RUN_DB=postgres pg_at "$p1" "SELECT sync_state FROM pg_stat_replication")" = sync ] ||
    fail "the replica is not synchronous"
  log "replication is synchronous (synchronous_standby_names = '*', synchronous_commit = on)"
fi

start_broker "$work/broker" || fail "Kafka did not start"
brokers=$BROKER_ADDR
log "$BROKER_KIND on $brokers"
"$BENCH" produce --brokers "$brokers" --topic "$topic" --partitions 4 --messages 0 >/dev/null ||
  fail "creating the topic"

# The processor: both servers in one URL; it writes where a session is read-write.
# tokio-postgres reads both forms; URL_FORM=keyvalue gives the processor the key=value one.
url="postgres://postgres@127.0.0.1:$p1,127.0.0.1:$p2/$RUN_DB?target_session_attrs=read-write"
if [ "${URL_FORM:-url}" = keyvalue ]; then
  url="host=127.0.0.1,127.0.0.1 port=$p1,$p2 user=postgres dbname=$RUN_DB target_session_attrs=read-write"
fi
export DATABASE_URL=$url
processor_args=(--brokers "$brokers" --topic "$topic" --group "$RUN_GROUP" --handler ledger
  --pool-size 4 --log-interval 5s)
start_processor "$work/processor.log" "${processor_args[@]}"
log "processor $BIN (pid $PROCESSOR_PID) on $url"
log "producing $messages records at $rate/s (seed $seed)"
"$BENCH" produce --brokers "$brokers" --topic "$topic" --partitions 4 --messages "$messages" \
  --accounts 1000 --duplicate-ratio 0.1 --bad-ratio 0.01 --debit-ratio 0.3 --seed "$seed" \
  --rate "$rate" --expect "$work/expected.json" >"$work/produce.log" 2>&1 &
producer_pid=$!

# processor_alive: restarts the processor once it has exited by itself (as a supervisor would),
# counting it; a failover must not need one.
restarts=0 exits=()
processor_alive() {
  if ! kill -0 "$PROCESSOR_PID" 2>/dev/null; then
    local rc=0
    wait "$PROCESSOR_PID" || rc=$?
    exits+=("$rc")
    restarts=$((restarts + 1))
    log "the processor exited (status $rc); restarting it (restart $restarts)"
    echo "=== restart $restarts after exit status $rc ===" >>"$work/processor.log"
    start_processor "$work/processor.log" "${processor_args[@]}"
  fi
}
# wait_positions PORT TARGET SECONDS: until the group's stored positions on PORT reach TARGET.
wait_positions() {
  local deadline=$((SECONDS + $3)) now
  while [ $SECONDS -lt $deadline ]; do
    processor_alive
    now=$(positions "$1" 2>/dev/null) || now=0
    [ "${now:-0}" -ge "$2" ] && return 0
    sleep 0.5
  done
  return 1
}

lsn_ahead() { # bytes of WAL the primary has that the replica did not receive
  local p r
  p=$(RUN_DB=postgres pg_at "$p1" "SELECT pg_current_wal_lsn()")
  r=$(RUN_DB=postgres pg_at "$p2" "SELECT pg_last_wal_receive_lsn()")
  RUN_DB=postgres pg_at "$p1" "SELECT pg_wal_lsn_diff('$p', '$r')::bigint"
}

cut=0 cut_lsn="" primary_lsn_at_kill=""
wait_positions "$p1" $((messages * 30 / 100)) 120 || fail "the processor did not reach 30% of the input"
if [ "$sync" = 0 ]; then
  log "cutting the replication at $(positions "$p1") stored positions"
  RUN_DB=postgres pg_at "$p2" "ALTER SYSTEM SET primary_conninfo = ''" "SELECT pg_reload_conf()" >/dev/null
  for _ in $(seq 1 100); do
    [ "$(RUN_DB=postgres pg_at "$p2" "SELECT count(*) FROM pg_stat_wal_receiver")" = 0 ] &&
      [ "$(RUN_DB=postgres pg_at "$p1" "SELECT count(*) FROM pg_stat_replication")" = 0 ] && break
    sleep 0.1
  done
  cut_lsn=$(RUN_DB=postgres pg_at "$p2" "SELECT pg_last_wal_receive_lsn()")
  sleep 2
  # Streaming really stopped: nothing received since, while the primary wrote on.
  [ "$(RUN_DB=postgres pg_at "$p2" "SELECT pg_last_wal_receive_lsn()")" = "$cut_lsn" ] ||
    fail "the replica still receives WAL after the cut"
  [ "$(lsn_ahead)" -gt 0 ] || fail "the primary did not write after the cut"
  cut=1
  log "streaming stopped: the replica received up to $cut_lsn; the primary is $(lsn_ahead) bytes ahead"
fi
wait_positions "$p1" $((messages * 60 / 100)) 120 || fail "the processor did not reach 60% of the input"
if [ "$sync" = 0 ]; then
  [ "$(RUN_DB=postgres pg_at "$p2" "SELECT pg_last_wal_receive_lsn()")" = "$cut_lsn" ] ||
    fail "the replica received WAL after the cut"
fi
# The replica's rows: all it received, replayed.
for _ in $(seq 1 100); do
  [ "$(RUN_DB=postgres pg_at "$p2" "SELECT pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn()")" = t ] && break
  sleep 0.1
done
primary_rows_before=$(inbox_rows "$p1")
primary_positions_before=$(positions "$p1")
primary_lsn_at_kill=$(RUN_DB=postgres pg_at "$p1" "SELECT pg_current_wal_lsn()")
log "killing the primary (SIGKILL, postmaster and backends): it had $primary_rows_before inbox rows"
pg_kill_all "$primary"
kill_at=$SECONDS
sleep "$promote_delay"
replica_rows=$(inbox_rows "$p2")
replica_positions=$(positions "$p2")
log "promoting the replica ($replica_rows inbox rows, positions $replica_positions)"
as_postgres "$PG_BIN/pg_ctl" -D "$replica/data" promote -w -t 60 >/dev/null || fail "promotion"

# Drain: every record's position stored on the promoted server, the processor still running.
wait "$producer_pid" || fail "produce: $(tail -n 3 "$work/produce.log")"
producer_pid=""
records=$("$BENCH" json get "$work/expected.json" records)
drained=1
wait_positions "$p2" "$records" 180 || drained=0
drain_s=$((SECONDS - kill_at))
if [ "$drained" = 1 ]; then
  log "drained on the promoted server $drain_s s after the kill"
else
  log "NOT drained 180 s after the producer finished: positions $(positions "$p2") of $records"
fi
sleep 2
processor_alive
kill -TERM "$PROCESSOR_PID" 2>/dev/null || true
wait "$PROCESSOR_PID" || true
PROCESSOR_PID=""

# The old primary's data as the kill left it (crash recovery, on a port nobody else knows): the
# rows it had that the replica never received.
mv "$primary" "$work/old-primary"
p3=$(free_port)
old_rows="" old_positions=""
rm -f "$work/old-primary/data/postmaster.pid" # its postmaster is dead: no warning about it
if private_postgres_start "$work/old-primary" "$p3"; then
  old_rows=$(inbox_rows "$p3") old_positions=$(positions "$p3")
  private_postgres_crash "$work/old-primary"
fi

log "verifying the promoted database against the model"
final_url="postgres://postgres@127.0.0.1:$p2/$RUN_DB"
verdict=PASS
"$BENCH" verify --database-url "$final_url" --expect "$work/expected.json" >"$work/verify.log" 2>&1 ||
  verdict=FAIL
read_topic "$brokers" "$topic" "$records" "$work/topic.txt" || fail "reading the topic back"
"$BENCH" recovery check --topic-dump "$work/topic.txt" --database-url "$final_url" \
  --topic "$topic" --out "$work/check.json" || fail "recovery check"
final_rows=$(inbox_rows "$p2")
final_positions=$(positions "$p2")

# The report: the readings above; the tool adds the model, the verdict's text, the check and the
# counts of the processor's log (WARN lines about the database going back, the records they say
# are read again, ERROR and retry lines).
mkdir -p "$results_dir"
readings=()
[ -n "$cut_lsn" ] && readings+=(--cut-lsn "$cut_lsn")
[ -n "$old_rows" ] && readings+=(--primary-rows-at-kill "$old_rows")
[ -n "$old_positions" ] && readings+=(--primary-positions-at-kill "$old_positions")
for rc in "${exits[@]}"; do readings+=(--exit "$rc"); done
drained_json=false
[ "$drained" = 1 ] && drained_json=true
"$BENCH" recovery failover-report --out "$results_dir/$name" --expected "$work/expected.json" \
  --verify-log "$work/verify.log" --check "$work/check.json" --processor-log "$work/processor.log" \
  --run "$name" --seed "$seed" --messages "$messages" --rate "$rate" --binary "$BIN" \
  --broker "$BROKER_KIND" --postgres "$("$PG_BIN/postgres" --version)" --verdict "$verdict" \
  --mode "$mode" --primary-lsn-at-kill "$primary_lsn_at_kill" \
  --primary-rows-before "$primary_rows_before" --primary-positions-before "$primary_positions_before" \
  --replica-rows "$replica_rows" --replica-positions "$replica_positions" \
  --final-rows "$final_rows" --final-positions "$final_positions" --drained "$drained_json" \
  --drain-s "$drain_s" --restarts "$restarts" "${readings[@]}" || fail "writing the report"
log "results: $results_dir/$name.json, .md"
if [ "$verdict" = PASS ]; then status=0; else status=1; fi
log "$verdict"
exit "$status"
