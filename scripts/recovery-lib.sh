# shellcheck shell=bash
# Shared by scripts/failover.sh and scripts/restore.sh: runs in which the database goes back in
# time (a promoted asynchronous replica, a restored dump, a point-in-time recovery) while Kafka's
# committed offsets do not. Source it after scripts/lib.sh; do not run it.

# pg_at PORT SQL...: one value per line, no headers, from database $RUN_DB on 127.0.0.1:PORT.
pg_at() {
  local port=$1
  shift
  local args=()
  for sql in "$@"; do args+=(-c "$sql"); done
  psql -X -At -w -h 127.0.0.1 -p "$port" -U postgres -d "${RUN_DB:-postgres}" -v ON_ERROR_STOP=1 "${args[@]}"
}

# inbox_rows PORT / positions PORT: the inbox's rows, and the sum of the group's stored next
# offsets (consumer_offsets) on the server of PORT.
inbox_rows() { pg_at "$1" "SELECT count(*) FROM inbox"; }
positions() {
  pg_at "$1" "SELECT coalesce(sum(next_offset), 0) FROM consumer_offsets WHERE group_id = '$RUN_GROUP'"
}

# pg_kill_all DIR: SIGKILL the postmaster of DIR and every process it started, at once: the
# machine died (no backend outlives its postmaster to commit one more transaction).
pg_kill_all() {
  local pm kids
  pm=$(head -n 1 "$1/data/postmaster.pid" 2>/dev/null) || return 1
  kids=$(pgrep -P "$pm" | tr '\n' ' ' || true)
  # shellcheck disable=SC2086 # one pid per word
  kill -KILL "$pm" $kids 2>/dev/null || true
  for _ in $(seq 1 100); do
    kill -0 "$pm" 2>/dev/null || return 0
    sleep 0.1
  done
}

# read_topic BROKERS TOPIC RECORDS FILE: every record of TOPIC (partition, offset, headers, key,
# value; a null value as NULL) with Kafka's own ConsoleConsumer, for `batch-inbox-bench recovery
# check`.
read_topic() {
  kafka_tool org.apache.kafka.tools.consumer.ConsoleConsumer --bootstrap-server "$1" --topic "$2" \
    --from-beginning --max-messages "$3" --timeout-ms 20000 \
    --formatter-property print.partition=true --formatter-property print.offset=true \
    --formatter-property print.headers=true --formatter-property print.key=true \
    --formatter-property print.value=true --formatter-property null.literal=NULL \
    >"$4" 2>"$4.err"
  [ "$(grep -c '^Partition:' "$4")" -ge "$3" ]
}

# start_processor LOG ARGS...: the processor under test ($BIN run ARGS) in the background with
# DATABASE_URL from the caller; PROCESSOR_PID.
start_processor() {
  local log=$1
  shift
  NO_COLOR=1 RUST_LOG="${RUST_LOG:-info,rdkafka=warn}" "$BIN" run "$@" >>"$log" 2>&1 &
  # shellcheck disable=SC2034 # the caller's
  PROCESSOR_PID=$!
}

# --- A replicated pair whose roles move (scripts/chaos.sh --db-failover) ---
# WORK/pg-primary and WORK/pg-replica each hold "DIR PORT" of the server in that role now; the
# chaos driver's database faults name WORK, never a server, so they follow a failover.

# replica_make DIR PORT PRIMARY_PORT: a streaming replica in DIR (pg_basebackup -R) of the
# primary on PRIMARY_PORT, started on PORT, returning once it streams.
replica_make() {
  local dir=$1 port=$2 from=$3
  mkdir -p "$dir"
  [ "$(id -u)" = 0 ] && chown postgres:postgres "$dir"
  as_postgres "$PG_BIN/pg_basebackup" -h 127.0.0.1 -p "$from" -U postgres -D "$dir/data" -R \
    -X stream -c fast >"$dir/basebackup.log" 2>&1 || { cat "$dir/basebackup.log" >&2; return 1; }
  private_postgres_start "$dir" "$port" || return 1
  for _ in $(seq 1 200); do
    [ "$(RUN_DB=postgres pg_at "$port" "SELECT count(*) FROM pg_stat_wal_receiver WHERE status = 'streaming'")" = 1 ] &&
      return 0
    sleep 0.1
  done
  echo "the replica on port $port does not stream from port $from" >&2
  return 1
}

# pair_crash WORK / pair_start WORK: crash-stop and start the server that is the primary now.
pair_crash() {
  local dir port
  read -r dir port <"$1/pg-primary"
  private_postgres_crash "$dir"
}
pair_start() {
  local dir port
  read -r dir port <"$1/pg-primary"
  private_postgres_start "$dir" "$port"
}

# pair_failover WORK DB GROUP LAG_SECONDS: the replication is cut under load (the replica's
# primary_conninfo emptied: its walreceiver stops), the primary writes on alone for LAG_SECONDS,
# then dies (SIGKILL of the postmaster and every backend) and the replica is promoted; a new
# replica of the promoted server is made in the dead primary's place (same port), so that a
# later failover finds one. Prints, one line per partition, "PARTITION NEXT_OFFSET": GROUP's
# positions in DB on the promoted server at promotion (all it had received, replayed), which a
# committed offset may move back to and never below. Everything else goes to stderr.
pair_failover() {
  local work=$1 db=$2 group=$3 lag=$4 pdir pport rdir rport
  read -r pdir pport <"$work/pg-primary"
  read -r rdir rport <"$work/pg-replica"
  RUN_DB=postgres pg_at "$rport" "ALTER SYSTEM SET primary_conninfo = ''" "SELECT pg_reload_conf()" >/dev/null
  for _ in $(seq 1 100); do
    [ "$(RUN_DB=postgres pg_at "$rport" "SELECT count(*) FROM pg_stat_wal_receiver")" = 0 ] && break
    sleep 0.1
  done
  [ "$(RUN_DB=postgres pg_at "$rport" "SELECT count(*) FROM pg_stat_wal_receiver")" = 0 ] ||
    { echo "the replica still streams after the cut" >&2; return 1; }
  sleep "$lag"
  for _ in $(seq 1 100); do
    [ "$(RUN_DB=postgres pg_at "$rport" "SELECT pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn()")" = t ] && break
    sleep 0.1
  done
  RUN_DB=$db pg_at "$rport" "SELECT partition || ' ' || next_offset FROM consumer_offsets WHERE group_id = '$group' ORDER BY partition"
  pg_kill_all "$pdir"
  as_postgres "$PG_BIN/pg_ctl" -D "$rdir/data" promote -w -t 60 >/dev/null ||
    { echo "the promotion failed" >&2; return 1; }
  echo "$rdir $rport" >"$work/pg-primary"
  rm -rf "$pdir/data"
  replica_make "$pdir" "$pport" "$rport" >&2 || return 1
  echo "$pdir $pport" >"$work/pg-replica"
}
