# Apache Kafka for the project's broker tests, load tests and chaos runs: the broker's jars from
# Maven Central (no distribution tarball), started with `java -cp` as KRaft nodes on free ports.
# Sourced by scripts/lib.sh; do not run it.
#
#   ensure_kafka                      fetch the jars once per machine (KAFKA_LIBS)
#   start_kafka DIR                   one node (broker + controller) in DIR: BROKER_ADDR, BROKER_PID
#   start_kafka_cluster DIR [N]       N nodes (default 3), replication factor N, min ISR N-1:
#                                     BROKER_ADDR (every node), KAFKA_NODE_PIDS
#   kafka_node_kill DIR I             SIGKILL node I (1-based) of the run in DIR
#   kafka_node_start DIR I            start node I again on its own log, wait until it serves
#   stop_kafka DIR                    SIGTERM every node of DIR, SIGKILL after 20 s
#   kafka_tool CLASS ARGS...          run one of Kafka's own tools (ConsumerGroupCommand, …)
#
# Each node's heap is KAFKA_HEAP (default 512m) with the serial collector: three nodes,
# PostgreSQL and the processors share two cores. KAFKA_JVM=stock runs a node as Kafka's own start
# script does instead (kafka-server-start.sh and kafka-run-class.sh: a 1 GiB heap, G1 with a
# 20 ms pause goal), the broker a user runs.

KAFKA_VERSION=4.4.0
KAFKA_ROOT=${KAFKA_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/batch-inbox/kafka-$KAFKA_VERSION}
KAFKA_LIBS=$KAFKA_ROOT/libs
KAFKA_HEAP=${KAFKA_HEAP:-512m}
KAFKA_JVM=${KAFKA_JVM:-tuned}
_kafka_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# The jars, once per machine: `mvn dependency:copy-dependencies` of scripts/kafka/pom.xml into a
# cache directory that later runs (and other clones) find again. One fetch at a time per machine.
ensure_kafka() {
  maven_fetch "$KAFKA_ROOT" "Apache Kafka $KAFKA_VERSION's jars" \
    -f "$_kafka_dir/pom.xml" -Dkafka.version="$KAFKA_VERSION"
}

# maven_fetch ROOT WHAT MVN_ARGS...: the runtime dependencies of a POM (MVN_ARGS names it, with -f)
# copied into ROOT/libs once per machine, which later runs and other clones find again
# (ROOT/libs/.complete). One fetch per ROOT at a time (a lock beside it); mvn's log in
# ROOT/fetch.log, its errors on stderr when it fails.
maven_fetch() {
  local root=$1 what=$2
  shift 2
  local libs=$root/libs
  ensure_java || return 1
  [ -f "$libs/.complete" ] && return 0
  command -v mvn >/dev/null || { echo "fetching $what needs mvn on the PATH" >&2; return 1; }
  mkdir -p "$root"
  local lock
  exec {lock}>"$root.lock"
  flock "$lock"
  if [ ! -f "$libs/.complete" ]; then
    echo "fetching $what from Maven Central into $libs (once per machine)" >&2
    local started=$SECONDS
    rm -rf "$libs.partial"
    if ! mvn -q -B "$@" dependency:copy-dependencies -DincludeScope=runtime \
      -DoutputDirectory="$libs.partial" >"$root/fetch.log" 2>&1; then
      exec {lock}>&-
      echo "fetching $what failed; mvn said:" >&2
      grep -E 'ERROR' "$root/fetch.log" | head -n 10 >&2
      return 1
    fi
    rm -rf "$libs"
    mv "$libs.partial" "$libs"
    touch "$libs/.complete"
    echo "$what fetched in $((SECONDS - started)) s" \
      "($(find "$libs" -name '*.jar' | wc -l) jars, $(du -sh "$libs" | cut -f1))" >&2
  fi
  exec {lock}>&-
}

# Java 17 or newer and Maven: installed from Debian's packages when missing and we are root.
ensure_java() {
  if command -v java >/dev/null && command -v mvn >/dev/null; then
    return 0
  fi
  if [ "$(id -u)" != 0 ]; then
    echo "Apache Kafka needs java (17 or newer) and mvn on the PATH" >&2
    return 1
  fi
  echo "installing Java 17 and Maven (Debian packages openjdk-17-jre-headless, maven)" >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    openjdk-17-jre-headless maven) >/dev/null || {
    echo "cannot install Java and Maven with apt-get" >&2
    return 1
  }
}

# _kafka_java LOGFILE CLASS ARGS...: the JVM every node runs in (KAFKA_EXEC=exec: in place of
# the calling shell, so that a background node's $! is the JVM's own pid).
_kafka_java() {
  local logfile=$1
  shift
  local jvm=(-Xms128m "-Xmx$KAFKA_HEAP" -XX:+UseSerialGC -XX:TieredStopAtLevel=1)
  [ "$KAFKA_JVM" = stock ] && jvm=(-Xms1G -Xmx1G -server -XX:+UseG1GC -XX:MaxGCPauseMillis=20
    -XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent)
  ${KAFKA_EXEC:-} java "${jvm[@]}" -Djava.awt.headless=true \
    "-Dkafka.node.log=$logfile" "-Dlog4j2.configurationFile=$_kafka_dir/log4j2.properties" \
    -cp "$KAFKA_LIBS/*" "$@"
}

# kafka_tool CLASS ARGS...: one of Kafka's tools, its own logging kept out of the output.
kafka_tool() {
  ensure_kafka || return 1
  local class=$1
  shift
  java -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
    "-Dlog4j2.configurationFile=$_kafka_dir/log4j2-tools.properties" \
    -cp "$KAFKA_LIBS/*" "$class" "$@"
}

# _kafka_write_config DIR I N PORTS... : server.properties of node I of N in DIR/node-I.
# PORTS holds each node's broker port then controller port.
_kafka_write_config() {
  local dir=$1 i=$2 n=$3
  shift 3
  local ports=("$@") node="$dir/node-$i" bootstrap="" j
  for j in $(seq 1 "$n"); do
    bootstrap+="${bootstrap:+,}127.0.0.1:${ports[$((2 * j - 1))]}"
  done
  local port=${ports[$((2 * i - 2))]} cport=${ports[$((2 * i - 1))]}
  mkdir -p "$node/data"
  local isr=1
  [ "$n" -gt 1 ] && isr=$((n - 1))
  cat >"$node/server.properties" <<EOF
process.roles=broker,controller
node.id=$i
controller.quorum.bootstrap.servers=$bootstrap
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$node/data
auto.create.topics.enable=true
num.partitions=1
default.replication.factor=$n
min.insync.replicas=$isr
offsets.topic.replication.factor=$n
offsets.topic.num.partitions=8
transaction.state.log.replication.factor=$n
transaction.state.log.min.isr=$isr
share.coordinator.state.topic.replication.factor=$n
share.coordinator.state.topic.min.isr=$isr
unclean.leader.election.enable=false
group.initial.rebalance.delay.ms=0
# The consumer group protocol (KIP-848) takes its timeouts from the broker: short ones for tests.
group.consumer.min.session.timeout.ms=3000
group.consumer.session.timeout.ms=10000
group.consumer.min.heartbeat.interval.ms=200
group.consumer.heartbeat.interval.ms=1000
log.segment.bytes=67108864
# No time retention: tests send records with old timestamps on purpose (2001, 2025), which the
# default 7 days would delete within log.retention.check.interval.ms.
log.retention.ms=-1
log.retention.check.interval.ms=5000
EOF
}

# _kafka_node_run DIR I: start node I of DIR in the background (its pid in DIR/node-I/pid).
_kafka_node_run() {
  local node="$1/node-$2"
  KAFKA_EXEC=exec _kafka_java "$node/broker.log" kafka.Kafka "$node/server.properties" \
    >>"$node/stdout.log" 2>&1 &
  echo $! >"$node/pid"
  # Its end (a nemesis's SIGKILL included) is the caller's business, not a job to report.
  disown $!
}

# _kafka_node_wait DIR I: until node I logs that it started and accepts connections.
_kafka_node_wait() {
  local node="$1/node-$2" port pid
  port=$(sed -n 's/^listeners=PLAINTEXT:\/\/127.0.0.1:\([0-9]*\),.*/\1/p' "$node/server.properties")
  pid=$(cat "$node/pid")
  for _ in $(seq 1 1200); do
    if grep -q "Kafka Server started" "$node/broker.log" 2>/dev/null &&
      (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "Kafka node $2 did not start on 127.0.0.1:$port; the end of its log:" >&2
  tail -n 40 "$node/stdout.log" "$node/broker.log" >&2 2>/dev/null
  return 1
}

# start_kafka_cluster DIR [N]: N KRaft nodes, each broker and controller, formatted with the same
# cluster id and the full voter set (--initial-controllers), started and ready.
start_kafka_cluster() {
  local dir=$1 n=${2:-3} ports=() i id voters=""
  ensure_kafka || return 1
  mkdir -p "$dir"
  mapfile -t ports < <(free_ports $((2 * n)))
  id=$(_kafka_java /dev/null kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n 1)
  for i in $(seq 1 "$n"); do
    _kafka_write_config "$dir" "$i" "$n" "${ports[@]}"
  done
  local format=(--standalone)
  if [ "$n" -gt 1 ]; then
    # Each voter: id@host:controller-port:directory-id, the directory id chosen here.
    for i in $(seq 1 "$n"); do
      local dirid
      dirid=$(_kafka_java /dev/null kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n 1)
      voters+="${voters:+,}$i@127.0.0.1:${ports[$((2 * i - 1))]}:$dirid"
    done
    format=(--initial-controllers "$voters")
  fi
  for i in $(seq 1 "$n"); do
    _kafka_java "$dir/node-$i/format.log" kafka.tools.StorageTool format -t "$id" \
      -c "$dir/node-$i/server.properties" "${format[@]}" >"$dir/node-$i/format.out" 2>&1 || {
      echo "formatting Kafka node $i failed:" >&2
      cat "$dir/node-$i/format.out" >&2
      return 1
    }
  done
  for i in $(seq 1 "$n"); do _kafka_node_run "$dir" "$i"; done
  KAFKA_NODE_PIDS=()
  BROKER_ADDR=""
  for i in $(seq 1 "$n"); do
    _kafka_node_wait "$dir" "$i" || return 1
    KAFKA_NODE_PIDS+=("$(cat "$dir/node-$i/pid")")
    BROKER_ADDR+="${BROKER_ADDR:+,}127.0.0.1:${ports[$((2 * i - 2))]}"
  done
  echo "$n" >"$dir/nodes"
  BROKER_PID=${KAFKA_NODE_PIDS[0]}
}

# start_kafka DIR: a single node.
start_kafka() {
  start_kafka_cluster "$1" 1
}

kafka_node_kill() {
  kill -KILL "$(cat "$1/node-$2/pid")" 2>/dev/null || true
}

kafka_node_start() {
  # Only the lines of this start count as its readiness: the earlier log is kept aside.
  mv "$1/node-$2/broker.log" "$1/node-$2/broker.log.$(date +%s%N)" 2>/dev/null || true
  _kafka_node_run "$1" "$2"
  _kafka_node_wait "$1" "$2"
}

stop_kafka() {
  local dir=$1 i pids=()
  [ -f "$dir/nodes" ] || return 0
  for i in $(seq 1 "$(cat "$dir/nodes")"); do
    [ -f "$dir/node-$i/pid" ] && pids+=("$(cat "$dir/node-$i/pid")")
  done
  [ ${#pids[@]} -gt 0 ] || return 0
  kill -TERM "${pids[@]}" 2>/dev/null || true
  for _ in $(seq 1 200); do
    kill -0 "${pids[@]}" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL "${pids[@]}" 2>/dev/null || true
}

# kafka_group_lag_zero BROKERS GROUP: ConsumerGroupCommand --describe of GROUP; prints its table
# and succeeds only when every partition has a committed offset and a lag of 0
# (`batch-inbox-bench kafka lag-zero`, which says so on stderr).
kafka_group_lag_zero() {
  local out
  out=$(kafka_tool org.apache.kafka.tools.consumer.group.ConsumerGroupCommand \
    --bootstrap-server "$1" --describe --group "$2" 2>&1) || {
    echo "$out" >&2
    return 1
  }
  echo "$out" >&2
  echo "$out" | bench_tool kafka lag-zero --group "$2"
}

# kafka_isr_report DIR BROKERS: what the brokers of DIR say about replication, as one JSON
# object (`batch-inbox-bench kafka isr`): ISR changes from their own logs (an "ISR updated to"
# line with fewer replicas than the cluster's nodes is a shrink, one back to all of them an
# expansion) and the partitions that TopicCommand lists as under-replicated now.
kafka_isr_report() {
  local dir=$1 brokers=$2 nodes under
  nodes=$(cat "$dir/nodes")
  under=$(kafka_tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$brokers" \
    --describe --under-replicated-partitions 2>/dev/null | grep -c "Partition:" || true)
  cat "$dir"/node-*/broker.log* 2>/dev/null |
    bench_tool kafka isr --nodes "$nodes" --under-replicated "$under"
}

# _kafka_ca DIR NAME: a self-signed certificate authority, DIR/NAME.crt and DIR/NAME.key.
_kafka_ca() {
  openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=batch-inbox test $2" \
    -keyout "$1/$2.key" -out "$1/$2.crt" >/dev/null 2>&1
}

# _kafka_server_cert DIR CA: the broker's key and certificate for 127.0.0.1, signed by CA, as
# one PEM file (the key in PKCS#8, then the certificate) for `ssl.keystore.type=PEM`.
_kafka_server_cert() {
  local d=$1 ca=$2
  openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" -keyout "$d/server.key" \
    -out "$d/server.csr" >/dev/null 2>&1 || return 1
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >"$d/server.ext"
  openssl x509 -req -in "$d/server.csr" -CA "$d/$ca.crt" -CAkey "$d/$ca.key" -CAcreateserial \
    -days 2 -extfile "$d/server.ext" -out "$d/server.crt" >/dev/null 2>&1 || return 1
  cat "$d/server.key" "$d/server.crt" >"$d/server.pem"
}

# SCRAM-SHA-512 users of the secure node, created when its storage is formatted: the super user
# `admin`, and `app`, whose rights are only the ACLs a test grants.
SECURE_KAFKA_USERS=${SECURE_KAFKA_USERS:-"admin=admin-Pw-7f3a app=app-Pw-91c2"}

# start_secure_kafka DIR [WATCH_PID]: one KRaft node for the security tests, with
#   PLAINTEXT  (no authentication: principal ANONYMOUS, a super user, for setup and producers),
#   SSL        (a test CA's certificate for 127.0.0.1, no client certificate: ANONYMOUS too),
#   SASL_SSL   (SCRAM-SHA-512 over the same TLS: User:admin, a super user, and User:app),
# and the StandardAuthorizer (no ACL, no access). DIR gets ca.crt (the broker's CA),
# other-ca.crt (a CA that signed nothing of it) and env, the addresses as shell assignments
# (PLAINTEXT_ADDR, SSL_ADDR, SASL_SSL_ADDR, SECURE_KAFKA_PID). With WATCH_PID, the node is
# stopped and DIR removed once that process is gone (the test binary that started it, however
# it ends).
start_secure_kafka() {
  local dir=$1 watch=${2:-} node="$1/node-1" p s a c id user scram=()
  ensure_kafka || return 1
  mkdir -p "$node/data" || return 1
  _kafka_ca "$dir" ca && _kafka_ca "$dir" other-ca && _kafka_server_cert "$dir" ca || {
    echo "openssl could not make the test certificates" >&2
    return 1
  }
  # Four distinct ports: two listeners on one port refuse to format the node.
  read -r p s a c < <(free_ports 4 | tr '\n' ' ')
  cat >"$node/server.properties" <<EOF
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:$c
listeners=PLAINTEXT://127.0.0.1:$p,SSL://127.0.0.1:$s,SASL_SSL://127.0.0.1:$a,CONTROLLER://127.0.0.1:$c
advertised.listeners=PLAINTEXT://127.0.0.1:$p,SSL://127.0.0.1:$s,SASL_SSL://127.0.0.1:$a,CONTROLLER://127.0.0.1:$c
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_SSL:SASL_SSL
ssl.keystore.type=PEM
ssl.keystore.location=$dir/server.pem
ssl.client.auth=none
sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:ANONYMOUS;User:admin
allow.everyone.if.no.acl.found=false
log.dirs=$node/data
auto.create.topics.enable=false
num.partitions=1
default.replication.factor=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
log.retention.ms=-1
EOF
  for user in $SECURE_KAFKA_USERS; do
    scram+=(--add-scram "SCRAM-SHA-512=[name=${user%%=*},password=${user#*=}]")
  done
  id=$(_kafka_java /dev/null kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n 1)
  _kafka_java "$node/format.log" kafka.tools.StorageTool format -t "$id" \
    -c "$node/server.properties" --standalone "${scram[@]}" >"$node/format.out" 2>&1 || {
    echo "formatting the secure Kafka node failed:" >&2
    cat "$node/format.out" >&2
    return 1
  }
  _kafka_node_run "$dir" 1
  _kafka_node_wait "$dir" 1 || return 1
  echo 1 >"$dir/nodes"
  SECURE_KAFKA_PID=$(cat "$node/pid")
  if [ -n "$watch" ]; then
    # Detached from the caller's pipes, so that a caller reading them sees their end.
    (
      while kill -0 "$watch" 2>/dev/null; do sleep 1; done
      stop_kafka "$dir"
      rm -rf "$dir"
    ) </dev/null >/dev/null 2>&1 &
    disown $!
  fi
  cat >"$dir/env" <<EOF
PLAINTEXT_ADDR=127.0.0.1:$p
SSL_ADDR=127.0.0.1:$s
SASL_SSL_ADDR=127.0.0.1:$a
SECURE_KAFKA_PID=$SECURE_KAFKA_PID
EOF
}
