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
# value; a null value as NULL) with Kafka's own ConsoleConsumer, for scripts/recovery-check.py.
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

# gap_warnings LOG: the processor's WARN lines that say the database's position went back: at
# assignment ("the database's position is behind Kafka's committed offset by N"), or while
# running ("... the database went back ...: reading again from the database's position"), or a
# partition the database knows nothing of ("... starting at the partition's beginning").
gap_warnings() {
  grep -a 'WARN' "$1" | grep -aicE "position is behind|went back|back in time|rewound|reading again from the database|holds no position" || true
}

# rewound_records LOG: the records those WARN lines say are read again (their behind= and gap=
# fields, summed).
# One awk: a pipeline with a grep that finds nothing would fail under pipefail.
rewound_records() {
  sed 's/\x1b\[[0-9;]*m//g' "$1" | awk '/WARN/ {
      line = $0
      while (match(line, /(behind|gap)=[0-9]+/)) {
        n += substr(line, RSTART, RLENGTH) ~ /^behind/ ? substr(line, RSTART + 7, RLENGTH - 7) : substr(line, RSTART + 4, RLENGTH - 4)
        line = substr(line, RSTART + RLENGTH)
      }
    }
    END { print n + 0 }'
}
