#!/usr/bin/env bash
# Restore run: the database is restored from a backup taken mid-run, so that Kafka's committed
# offsets are ahead of it; a processor started again with the same group must apply what the
# backup lacks. A generated input (duplicates, a little bad input, overdrafts) arrives on a
# 4-partition topic while the processor applies it; when about half of it is applied a backup
# is taken; the processor drains the rest and is stopped; the backup is restored; the processor
# runs again (same group, --exit-on-eof); then the database is checked against the generator's
# model exactly (`batch-inbox-bench verify`) and, record by record, against the topic
# (`batch-inbox-bench recovery check`: what was lost, where, and whether anything was applied
# twice).
#
#   scripts/restore.sh [--messages N] [--pitr] [--seed N] [--results-dir DIR]
#
#   (default)      the backup is `pg_dump -Fc` of the processor's database, restored by dropping
#                  and creating the database and pg_restore
#   --pitr         the backup is a base backup (pg_basebackup, taken before the run) plus the
#                  archived WAL (archive_mode=on, archive_command copying into the run's
#                  directory); the cluster is recovered to a point in time mid-run
#                  (recovery_target_time, recovery_target_action=promote, restore_command) in a
#                  fresh data directory, started on the same port
#   --messages N   input records (default 20000, the CI form)
#
# Environment: BIN (the processor under test, default target/release/batch-inbox, built unless
# BIN is set), BENCH (default target/release/batch-inbox-bench), SKIP_BUILD=1, RATE (input
# records/s, default messages/30 s), KEEP=1 (keep the run's directory: logs, data directories, the topic read back).
#
# Starts its OWN PostgreSQL server (Debian's /usr/lib/postgresql/15/bin; initdb in the run's
# temporary directory, a free port on 127.0.0.1, fsync on) and its own Apache Kafka node; stops
# and removes them at the end. Prints a summary; writes results/failover/restore-<UTC>-<dump|pitr>-n<N>-seed<S>.json
# and .md (--results-dir elsewhere). Exit status: 0 the final database is exactly the model,
# 1 it is not (a message lost or applied twice), 2 the run itself failed.
set -euo pipefail
cd "$(dirname "$0")/.."
PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
source scripts/lib.sh
source scripts/recovery-lib.sh

messages=20000 pitr=0 seed=1 results_dir=results/failover
while [ $# -gt 0 ]; do
  case "$1" in
    --messages) messages=$2; shift ;;
    --pitr) pitr=1 ;;
    --seed) seed=$2; shift ;;
    --results-dir) results_dir=$2; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown flag $1 (see $0 --help)" >&2; exit 2 ;;
  esac
  shift
done
rate=${RATE:-$((messages / 30))}

log() { echo "[restore.sh $(date +%T)] $*" >&2; }
work=$(mktemp -d /tmp/restore.XXXXXX)
chmod 755 "$work"
pg="$work/pg" restored="$work/restored"
status=2 producer_pid="" PROCESSOR_PID="" name=restore
# shellcheck disable=SC2317 # run by the EXIT trap
cleanup() {
  [ -n "$PROCESSOR_PID" ] && kill -KILL "$PROCESSOR_PID" 2>/dev/null
  [ -n "$producer_pid" ] && kill -KILL "$producer_pid" 2>/dev/null
  stop_broker "$work/broker"
  private_postgres_crash "$pg" 2>/dev/null || true
  private_postgres_crash "$restored" 2>/dev/null || true
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
kind=dump
[ "$pitr" = 1 ] && kind=pitr
name="restore-$(date -u +%Y%m%dT%H%M%SZ)-$kind-n$messages-seed$seed"

port=$(free_port)
archive="$work/archive"
server_opts="-c wal_level=replica"
if [ "$pitr" = 1 ]; then
  mkdir -p "$archive"
  [ "$(id -u)" = 0 ] && chown postgres:postgres "$archive"
  server_opts+=" -c archive_mode=on -c archive_timeout=0"
fi
log "PostgreSQL on 127.0.0.1:$port ($kind)"
private_postgres_init "$pg" "$port" "$server_opts" || fail "PostgreSQL did not start"
if [ "$pitr" = 1 ]; then
  # In the configuration file (the command line cannot quote it): copy each finished segment.
  echo "archive_command = 'test ! -f $archive/%f && cp %p $archive/%f'" >>"$pg/data/postgresql.conf"
  RUN_DB=postgres pg_at "$port" "SELECT pg_reload_conf()" >/dev/null
fi
# Topic and group of this run only (KAFKA_BROKERS may name a broker that earlier runs used).
stamp="$(date +%s)-$$"
RUN_DB=restore RUN_GROUP="restore-$seed-$stamp" topic="restore-$seed-$stamp"
psql -X -q -h 127.0.0.1 -p "$port" -U postgres -d postgres -c "CREATE DATABASE $RUN_DB" >/dev/null
export DATABASE_URL="postgres://postgres@127.0.0.1:$port/$RUN_DB"
"$BIN" migrate --handler ledger >/dev/null || fail "migrate"
if [ "$pitr" = 1 ]; then
  mkdir -p "$work/base"
  [ "$(id -u)" = 0 ] && chown postgres:postgres "$work/base"
  log "base backup (pg_basebackup) before the run"
  as_postgres "$PG_BIN/pg_basebackup" -h 127.0.0.1 -p "$port" -U postgres -D "$work/base/data" \
    -X stream -c fast >"$work/basebackup.log" 2>&1 || fail "pg_basebackup: $(cat "$work/basebackup.log")"
fi

start_broker "$work/broker" || fail "Kafka did not start"
brokers=$BROKER_ADDR
log "$BROKER_KIND on $brokers"
"$BENCH" produce --brokers "$brokers" --topic "$topic" --partitions 4 --messages 0 >/dev/null ||
  fail "creating the topic"
processor_args=(--brokers "$brokers" --topic "$topic" --group "$RUN_GROUP" --handler ledger
  --pool-size 4 --log-interval 5s)
start_processor "$work/processor.log" "${processor_args[@]}"
log "processor $BIN (pid $PROCESSOR_PID)"
log "producing $messages records at $rate/s (seed $seed)"
"$BENCH" produce --brokers "$brokers" --topic "$topic" --partitions 4 --messages "$messages" \
  --accounts 1000 --duplicate-ratio 0.1 --bad-ratio 0.01 --debit-ratio 0.3 --seed "$seed" \
  --rate "$rate" --expect "$work/expected.json" >"$work/produce.log" 2>&1 &
producer_pid=$!

# wait_positions TARGET SECONDS: until the group's stored positions reach TARGET; the processor
# must not exit meanwhile.
wait_positions() {
  local deadline=$((SECONDS + $2)) now
  while [ $SECONDS -lt $deadline ]; do
    kill -0 "$PROCESSOR_PID" 2>/dev/null || fail "the processor exited: $(tail -n 5 "$work/processor.log")"
    now=$(positions "$port" 2>/dev/null) || now=0
    [ "${now:-0}" -ge "$1" ] && return 0
    sleep 0.5
  done
  return 1
}

wait_positions $((messages / 2)) 120 || fail "the processor did not reach half of the input"
if [ "$pitr" = 1 ]; then
  target_time=$(RUN_DB=postgres pg_at "$port" "SELECT clock_timestamp()")
  backup_rows=$(inbox_rows "$port") backup_positions=$(positions "$port")
  log "recovery target: $target_time ($backup_rows inbox rows, positions $backup_positions)"
else
  # pg_dump's snapshot: the rows counted in a transaction of the same moment are close; the
  # restored database's own count below is the exact one.
  log "pg_dump -Fc mid-run ($(inbox_rows "$port") inbox rows, positions $(positions "$port"))"
  pg_dump -Fc -h 127.0.0.1 -p "$port" -U postgres -d "$RUN_DB" -f "$work/mid.dump" ||
    fail "pg_dump"
fi

wait "$producer_pid" || fail "produce: $(tail -n 3 "$work/produce.log")"
producer_pid=""
records=$("$BENCH" json get "$work/expected.json" records)
wait_positions "$records" 180 || fail "the processor did not drain: positions $(positions "$port") of $records"
kill -TERM "$PROCESSOR_PID"
wait "$PROCESSOR_PID" || true
PROCESSOR_PID=""
drained_rows=$(inbox_rows "$port")
log "drained ($drained_rows inbox rows) and stopped; restoring the $kind backup"

if [ "$pitr" = 1 ]; then
  # Every WAL segment up to now archived, then the cluster is gone.
  last=$(RUN_DB=postgres pg_at "$port" "SELECT pg_walfile_name(pg_switch_wal())")
  for _ in $(seq 1 300); do
    [ -f "$archive/$last" ] && break
    sleep 0.1
  done
  [ -f "$archive/$last" ] || fail "WAL segment $last was not archived"
  as_postgres "$PG_BIN/pg_ctl" -D "$pg/data" -m fast -w stop >/dev/null
  mkdir -p "$restored"
  [ "$(id -u)" = 0 ] && chown postgres:postgres "$restored"
  as_postgres cp -a "$work/base/data" "$restored/data"
  cat >>"$restored/data/postgresql.conf" <<EOF
restore_command = 'cp $archive/%f %p'
recovery_target_time = '$target_time'
recovery_target_action = 'promote'
archive_mode = off
EOF
  as_postgres touch "$restored/data/recovery.signal"
  private_postgres_start "$restored" "$port" "-c wal_level=replica" ||
    fail "the point-in-time recovery did not start: $(tail -n 5 "$restored/server.log")"
  for _ in $(seq 1 600); do
    [ "$(RUN_DB=postgres pg_at "$port" "SELECT pg_is_in_recovery()")" = f ] && break
    sleep 0.1
  done
  [ "$(RUN_DB=postgres pg_at "$port" "SELECT pg_is_in_recovery()")" = f ] ||
    fail "the recovery did not end: $(tail -n 5 "$restored/server.log")"
  grep -E 'recovery stopping|last completed transaction' "$restored/server.log" | tail -n 2 >&2 || true
else
  psql -X -q -h 127.0.0.1 -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1 \
    -c "DROP DATABASE $RUN_DB WITH (FORCE)" -c "CREATE DATABASE $RUN_DB" >/dev/null
  pg_restore -h 127.0.0.1 -p "$port" -U postgres -d "$RUN_DB" --exit-on-error "$work/mid.dump" ||
    fail "pg_restore"
fi
restored_rows=$(inbox_rows "$port")
restored_positions=$(positions "$port")
[ "$pitr" = 1 ] || backup_rows=$restored_rows backup_positions=$restored_positions
log "restored: $restored_rows inbox rows, positions $restored_positions (of $records)"

echo "=== second run: same group, --exit-on-eof ===" >>"$work/processor.log"
start_processor "$work/processor.log" "${processor_args[@]}" --exit-on-eof
second_rc=""
for _ in $(seq 1 360); do
  kill -0 "$PROCESSOR_PID" 2>/dev/null || break
  sleep 0.5
done
if kill -0 "$PROCESSOR_PID" 2>/dev/null; then
  log "the second run did not exit within 180 s; stopping it"
  kill -TERM "$PROCESSOR_PID"
fi
rc=0
wait "$PROCESSOR_PID" || rc=$?
second_rc=$rc
PROCESSOR_PID=""
log "the second run exited with status $second_rc"

log "verifying the restored database against the model"
verdict=PASS
"$BENCH" verify --database-url "$DATABASE_URL" --expect "$work/expected.json" >"$work/verify.log" 2>&1 ||
  verdict=FAIL
read_topic "$brokers" "$topic" "$records" "$work/topic.txt" || fail "reading the topic back"
"$BENCH" recovery check --topic-dump "$work/topic.txt" --database-url "$DATABASE_URL" \
  --topic "$topic" --out "$work/check.json" || fail "recovery check"
final_rows=$(inbox_rows "$port")
final_positions=$(positions "$port")

# The report: the readings above; the tool adds the model, the verdict's text, the check and the
# counts of the processor's log (WARN lines about the database going back, the records they say
# are read again).
mkdir -p "$results_dir"
readings=()
[ -n "${target_time:-}" ] && readings+=(--recovery-target-time "$target_time")
"$BENCH" recovery restore-report --out "$results_dir/$name" --expected "$work/expected.json" \
  --verify-log "$work/verify.log" --check "$work/check.json" --processor-log "$work/processor.log" \
  --run "$name" --seed "$seed" --messages "$messages" --rate "$rate" --binary "$BIN" \
  --broker "$BROKER_KIND" --postgres "$("$PG_BIN/postgres" --version)" --verdict "$verdict" \
  --backup "$kind" --backup-rows "$backup_rows" --backup-positions "$backup_positions" \
  --rows-before-restore "$drained_rows" --rows-after-restore "$restored_rows" \
  --positions-after-restore "$restored_positions" --second-run-exit "$second_rc" \
  --final-rows "$final_rows" --final-positions "$final_positions" "${readings[@]}" ||
  fail "writing the report"
log "results: $results_dir/$name.json, .md"
if [ "$verdict" = PASS ]; then status=0; else status=1; fi
log "$verdict"
exit "$status"
