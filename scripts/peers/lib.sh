# The peer of the comparison: Kafka Connect 4.4.0 in standalone mode with Debezium's JDBC sink
# connector and the PostgreSQL JDBC driver, all from Maven Central (scripts/peers/pom.xml), run
# with `java -cp` like the broker. Sourced by scripts/peers/compare.sh; do not run it.
#
#   ensure_peer                              fetch the jars once per machine (PEER_LIBS)
#   start_peer DIR BROKERS TOPIC DB [K=V...] worker and connector properties from this
#                                            directory's templates into DIR, Connect started:
#                                            PEER_PID (the JVM's own pid), DIR/connect.log
#   peer_committed BROKERS GROUP             the sum of the sink's committed offsets
#   stop_peer DIR                            SIGTERM, SIGKILL after 20 s
#
# Connect keeps the sink's position in the consumer group `connect-<connector name>` and commits
# it every offset.flush.interval.ms (worker.properties): a kill -9 re-delivers what it applied
# since the last commit.

source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
PEER_DEBEZIUM_VERSION=3.6.0.Final
PEER_ROOT=${PEER_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/batch-inbox/connect-$KAFKA_VERSION-debezium-jdbc-$PEER_DEBEZIUM_VERSION}
PEER_LIBS=$PEER_ROOT/libs
PEER_HEAP=${PEER_HEAP:-1g}
_peer_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# The jars, once per machine, like ensure_kafka: scripts/peers/pom.xml's dependencies, Maven
# Central only (scripts/peers/settings.xml).
ensure_peer() {
  maven_fetch "$PEER_ROOT" "Kafka Connect $KAFKA_VERSION, Debezium's JDBC sink $PEER_DEBEZIUM_VERSION and the PostgreSQL driver" \
    -s "$_peer_dir/settings.xml" -f "$_peer_dir/pom.xml"
}

# _peer_template FILE DIR K=V...: FILE from this directory with each @K@ replaced by V.
_peer_template() {
  local src=$1 dst=$2/$(basename "$1") kv
  shift 2
  # The last K=V of a key wins (defaults first, then the caller's).
  local -A values=()
  for kv in "$@"; do values[${kv%%=*}]=${kv#*=}; done
  cp "$_peer_dir/$src" "$dst"
  local k v
  for k in "${!values[@]}"; do
    v=${values[$k]}
    v=${v//\\/\\\\}
    v=${v//|/\\|}
    v=${v//&/\\&}
    sed -i "s|@$k@|$v|g" "$dst"
  done
  if grep -q '@[A-Z_]*@' "$dst"; then
    echo "$dst: unset placeholders: $(grep -o '@[A-Z_]*@' "$dst" | sort -u | tr '\n' ' ')" >&2
    return 1
  fi
}

# start_peer DIR BROKERS TOPIC DB [K=V...]: K=V overrides a placeholder's default (BATCH_SIZE,
# TASKS, FLUSH_MS, MAX_POLL, UNNEST, REDUCTION, CONNECTOR, TABLE), or the connector's template
# (CONNECTOR_TEMPLATE, a file of this directory; connector.properties by default), which is
# written to DIR/connector.properties.
start_peer() {
  local dir=$1 brokers=$2 topic=$3 db=$4
  shift 4
  ensure_peer || return 1
  mkdir -p "$dir"
  local port
  port=$(free_port)
  local settings=(BROKERS="$brokers" TOPIC="$topic" DB="$db" DIR="$dir" REST_PORT="$port"
    CONNECTOR=peer-customers TASKS=1 BATCH_SIZE=500 MAX_POLL=500 FLUSH_MS=10000
    UNNEST=false REDUCTION=false TABLE=customer_entries CONNECTOR_TEMPLATE=connector.properties "$@")
  local kv template=connector.properties
  for kv in "${settings[@]}"; do [[ $kv == CONNECTOR_TEMPLATE=* ]] && template=${kv#*=}; done
  _peer_template worker.properties "$dir" "${settings[@]}" || return 1
  _peer_template "$template" "$dir" "${settings[@]}" || return 1
  [ "$template" = connector.properties ] || mv "$dir/$template" "$dir/connector.properties"
  PEER_CONNECTOR=$(sed -n 's/^name=//p' "$dir/connector.properties")
  _connect_start "$dir" "$PEER_LIBS" "WorkerSinkTask{id=$PEER_CONNECTOR-0} Sink task finished initialization and start" ||
    return 1
  PEER_PID=$CONNECT_PID
}

# _connect_start DIR LIBS READY: Kafka Connect standalone on LIBS with DIR's worker and connector
# properties, until its log has the line READY (its task started) or it ends (the log says why):
# CONNECT_PID (the JVM's own pid), DIR/pid, DIR/connect.log.
_connect_start() {
  local dir=$1 libs=$2 ready=$3 from
  # The log is appended to across restarts: only the lines after this start count.
  from=$(($( [ -f "$dir/connect.log" ] && wc -l <"$dir/connect.log" || echo 0) + 1))
  # `exec` in the background subshell: $! is the JVM's own pid, the one a kill -9 must hit.
  (exec java -Xms256m "-Xmx$PEER_HEAP" -XX:+UseSerialGC -Djava.awt.headless=true \
    "-Dlog4j2.configurationFile=$_peer_dir/log4j2.properties" "-Dpeer.log=$dir/connect.log" \
    -cp "$libs/*" org.apache.kafka.connect.cli.ConnectStandalone \
    "$dir/worker.properties" "$dir/connector.properties") >>"$dir/stdout.log" 2>&1 &
  CONNECT_PID=$!
  disown "$CONNECT_PID"
  echo "$CONNECT_PID" >"$dir/pid"
  for _ in $(seq 1 1200); do
    tail -n "+$from" "$dir/connect.log" 2>/dev/null | grep -qF "$ready" && return 0
    kill -0 "$CONNECT_PID" 2>/dev/null || break
    sleep 0.1
  done
  echo "Kafka Connect did not start its task; the end of its log:" >&2
  tail -n 30 "$dir/connect.log" "$dir/stdout.log" >&2 2>/dev/null
  return 1
}

# The outbox → inbox chain's producer side (scripts/peers/outbox.sh): Kafka Connect with
# Debezium's PostgreSQL source connector and its outbox event router (scripts/peers/source-pom.xml),
# a classpath of its own.
# Its Connect is 4.3.1, the release line Debezium 3.6.1 is built against (source-pom.xml says why).
OUTBOX_DEBEZIUM_VERSION=3.6.1.Final
OUTBOX_CONNECT_VERSION=4.3.1
OUTBOX_ROOT=${OUTBOX_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/batch-inbox/connect-$OUTBOX_CONNECT_VERSION-debezium-postgres-$OUTBOX_DEBEZIUM_VERSION}
OUTBOX_LIBS=$OUTBOX_ROOT/libs

ensure_outbox_source() {
  maven_fetch "$OUTBOX_ROOT" "Kafka Connect $OUTBOX_CONNECT_VERSION and Debezium's PostgreSQL connector $OUTBOX_DEBEZIUM_VERSION" \
    -s "$_peer_dir/settings.xml" -f "$_peer_dir/source-pom.xml"
}

# start_outbox_source DIR BROKERS K=V...: Debezium's PostgreSQL connector with the outbox event
# router (outbox-source.properties; PG_PORT, DB, SLOT, PUBLICATION, TOPIC_PREFIX, CONNECTOR and
# FLUSH_MS are its placeholders), until its task runs: OUTBOX_PID. DIR keeps its offsets file
# across restarts, as a standalone worker's state.
start_outbox_source() {
  local dir=$1 brokers=$2
  shift 2
  ensure_outbox_source || return 1
  mkdir -p "$dir"
  local settings=(BROKERS="$brokers" DIR="$dir" REST_PORT="$(free_port)" MAX_POLL=500
    FLUSH_MS=5000 "$@")
  _peer_template worker.properties "$dir" "${settings[@]}" || return 1
  _peer_template outbox-source.properties "$dir" "${settings[@]}" || return 1
  mv "$dir/outbox-source.properties" "$dir/connector.properties"
  local name
  name=$(sed -n 's/^name=//p' "$dir/connector.properties")
  _connect_start "$dir" "$OUTBOX_LIBS" "WorkerSourceTask{id=$name-0} Source task finished initialization and start" ||
    return 1
  OUTBOX_PID=$CONNECT_PID
}

# peer_committed BROKERS GROUP: the sum of the group's committed offsets (records it has
# committed as applied), from Kafka's ConsumerGroupCommand (`batch-inbox-bench kafka committed`).
peer_committed() {
  kafka_tool org.apache.kafka.tools.consumer.group.ConsumerGroupCommand \
    --bootstrap-server "$1" --describe --group "$2" 2>/dev/null | bench_tool kafka committed
}

stop_peer() {
  local pid
  pid=$(cat "$1/pid" 2>/dev/null) || return 0
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 200); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
}
