#!/usr/bin/env bash
# Chaos run: processors in one group apply a generated input (duplicates, bad input, overdrafts)
# while a seeded nemesis kills them (SIGKILL), pauses them past the session timeout
# (SIGSTOP/SIGCONT), crash-restarts PostgreSQL, adds and removes members and, with
# --broker-faults, SIGKILLs Apache Kafka nodes and starts them again on their own logs; then it
# drains and checks the database and the committed offsets against the generator's model, and
# Kafka's own ConsumerGroupCommand must report lag 0 for the processors' group.
#
#   scripts/chaos.sh [--duration SECONDS] [--seed N] [--processors N] [--brokers HOST:PORT]
#   scripts/chaos.sh --kafka-nodes 3 ...  a 3-node cluster (replication 3, min ISR 2)
#   scripts/chaos.sh --broker-faults ...  the nemesis also kills and restarts broker nodes
#   scripts/chaos.sh --db-failover ...  PostgreSQL is a primary and an asynchronous streaming
#                                   replica (the processors hold both in one multi-host URL);
#                                   the nemesis also fails over to a replica that lags behind:
#                                   replication cut, the primary runs ahead for FAILOVER_LAG
#                                   seconds (default 2), dies (SIGKILL), the replica is promoted
#                                   and a new replica is made of it
#   scripts/chaos.sh --unsafe ...   the control: processors in an unsafe configuration; the
#                                   checker must FAIL (exit 1)
#   scripts/chaos.sh --rabbitmq [--broker-faults] [--queue-type classic|quorum] ...
#                                   RabbitMQ instead of Kafka: a node of the run's own
#                                   (scripts/rabbitmq/lib.sh), one queue per partition read with
#                                   single active consumer (one processor reads a queue, the
#                                   others stand by), the input published paced with publisher
#                                   confirms (published again after a broker restart: the inbox
#                                   skips the copies), pauses past three AMQP heartbeats (3 s, set
#                                   in the processors' URL) so that the broker drops the paused
#                                   processor and a standby takes over; broker faults SIGKILL the
#                                   node and start it again on its own data. Instead of Kafka's
#                                   offsets it checks the queues' positions in the database (never
#                                   back; covering every record published and committed) and that
#                                   every queue ends with 0 ready and 0 unacknowledged messages.
#                                   Campaign: results/chaos/rabbitmq-3.10.8/.
#   scripts/chaos.sh --nats [--broker-faults] ...
#                                   NATS JetStream instead of Kafka: a nats-server of the run's
#                                   own with JetStream on a file store (scripts/nats/lib.sh), one
#                                   stream per partition (each account's records in one), each read
#                                   through one durable pull consumer (ack_wait 2 s) by the
#                                   processor that holds its lock in PostgreSQL (the others stand
#                                   by), the input published paced with each publish acknowledged
#                                   (published again after a server kill: the stream's duplicate
#                                   window, 1 s here, and the inbox skip the copies). Kills and
#                                   pauses hit a lock holder two times in three; a pause outlasts
#                                   ack_wait and the paused processor's lock sessions are ended in
#                                   the database, so a standby takes its streams over while it is
#                                   stopped; broker faults SIGKILL nats-server and start it again
#                                   on its own store. Checks the database against the model of
#                                   what the streams hold (read back: they must hold the input),
#                                   the streams' positions in the database (never back, but to a
#                                   delivery a processor announced it reads again; each at its
#                                   stream's last sequence + 1), no offset gap in the processors'
#                                   logs, and that every consumer ends with 0 pending and 0
#                                   unacknowledged (JetStream's consumer info).
#                                   --pause-ends-sessions=false: pauses leave the lock sessions.
#                                   Campaign: results/chaos/nats-2.9.10/.
#
# Starts its OWN PostgreSQL server (initdb in a temporary directory, a free port, fsync on), the
# only one it restarts, and its own Apache Kafka (KRaft nodes in the run's directory, one unless
# --kafka-nodes) unless --brokers or KAFKA_BROKERS names a broker (NISSHI_BIN: a nisshi process).
# Prints the seed, the faults and PASS/FAIL, writes results/chaos/chaos-<UTC time>-seed<N>-<pid>.json (chaos-control-… for --unsafe;
# --results-dir elsewhere).
# Exit status: 0 PASS, 1 an invariant was violated, 2 the run itself failed. Other flags go to
# `batch-inbox-bench chaos` (see `batch-inbox-bench chaos --help`). KEEP=1 keeps the logs and the server.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
source scripts/recovery-lib.sh

unsafe=0 brokers="${KAFKA_BROKERS:-}" args=() kafka_nodes=1 broker_faults=0 db_failover=0 rabbitmq=0
nats=0
queue_type=classic
while [ $# -gt 0 ]; do
  case "$1" in
    --unsafe) unsafe=1 ;;
    --rabbitmq) rabbitmq=1 ;;
    --nats) nats=1 ;;
    --queue-type) queue_type=$2; args+=("$1" "$2"); shift ;;
    --queue-type=*) queue_type=${1#--queue-type=}; args+=("$1") ;;
    --kafka-nodes) kafka_nodes=$2; shift ;;
    --broker-faults) broker_faults=1 ;;
    --db-failover) db_failover=1 ;;
    --brokers) brokers=$2; shift ;;
    --brokers=*) brokers=${1#--brokers=} ;;
    *) args+=("$1") ;;
  esac
  shift
done

# What the control run turns on (override with UNSAFE_FLAGS="..."): offsets stored before the
# database commit (loses messages: on RabbitMQ, deliveries acknowledged before it), and no inbox
# (applies redeliveries twice). A RabbitMQ queue's and a NATS stream's positions are always the
# database's (the processor refuses --offsets-in-db=false there).
if [ "$rabbitmq" = 1 ] || [ "$nats" = 1 ]; then
  read -ra UNSAFE_FLAGS <<<"${UNSAFE_FLAGS:---unsafe-offsets-before-commit --unsafe-no-inbox}"
else
  read -ra UNSAFE_FLAGS <<<"${UNSAFE_FLAGS:---unsafe-offsets-before-commit --unsafe-no-inbox --offsets-in-db=false}"
fi
if [ "$rabbitmq" = 1 ] && { [ "$db_failover" = 1 ] || [ -n "$brokers" ] || [ "$kafka_nodes" != 1 ]; }; then
  echo "--rabbitmq runs its own RabbitMQ node: not with --db-failover, --brokers/KAFKA_BROKERS or --kafka-nodes" >&2
  exit 2
fi
if [ "$nats" = 1 ] && { [ "$rabbitmq" = 1 ] || [ "$db_failover" = 1 ] || [ -n "$brokers" ] || [ "$kafka_nodes" != 1 ]; }; then
  echo "--nats runs its own nats-server: not with --rabbitmq, --db-failover, --brokers/KAFKA_BROKERS or --kafka-nodes" >&2
  exit 2
fi

log() { echo "[chaos.sh $(date +%T)] $*" >&2; }
bin=./target/release/batch-inbox-bench
work=$(mktemp -d /tmp/chaos.XXXXXX)
chmod 755 "$work"
pg="$work/pg"
driver_pid=""
status=2
cleanup() {
  # The driver and its processor processes share one process group (setsid below).
  [ -n "$driver_pid" ] && kill -KILL -- "-$driver_pid" 2>/dev/null
  stop_broker "$work/broker"
  stop_rabbitmq "$work/broker/rabbitmq"
  stop_nats "$work/broker/nats"
  if [ "${KEEP:-0}" = 1 ]; then
    log "kept $work"
    return
  fi
  private_postgres_remove "$pg"
  private_postgres_remove "$work/pg2"
  if [ "$status" = 1 ] && [ "$unsafe" = 0 ] && [ -d "$work/run" ]; then
    # A violation of the safe configuration: keep the processors' logs for the diagnosis.
    rm -rf "$work/pg" "$work/pg2"
    log "processor logs kept in $work/run"
  else
    rm -rf "$work"
  fi
}
trap cleanup EXIT
# An interrupted run stops its processors, its broker and its private PostgreSQL too.
trap 'status=2; exit 130' INT
trap 'status=2; exit 143' TERM

log "building release"
cargo build --release --quiet --workspace --bins

control=()
if [ "$unsafe" = 1 ]; then
  # The control's processors: a build with the test-only unsafe switches, copied aside, and the
  # normal build put back, so that target/release/batch-inbox is never the unsafe one.
  log "building the unsafe control's processor (feature unsafe-controls)"
  cargo build --release --quiet -p batch-inbox --features unsafe-controls
  cp ./target/release/batch-inbox "$work/batch-inbox-unsafe"
  cargo build --release --quiet -p batch-inbox
  export BATCH_INBOX_BIN="$work/batch-inbox-unsafe"
  for flag in "${UNSAFE_FLAGS[@]}"; do
    if ! "$BATCH_INBOX_BIN" run "$flag" --help >/dev/null 2>&1; then
      log "this build has no $flag: the control run cannot be made"
      exit 2
    fi
    control+=("--processor-arg=$flag")
  done
  control+=(--control)
fi

port=$(free_port)
log "private PostgreSQL on 127.0.0.1:$port ($pg)"
private_postgres_init "$pg" "$port"
db="chaos_$(date +%s)"
psql -q -h 127.0.0.1 -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1 \
  -c "CREATE DATABASE \"$db\"" >/dev/null
database_url="postgres://postgres@127.0.0.1:$port/$db"
db_stop="bash -c 'source scripts/lib.sh && private_postgres_crash $pg'"
db_start="bash -c 'source scripts/lib.sh && private_postgres_start $pg $port'"
if [ "$db_failover" = 1 ]; then
  # The pair: roles kept in $work/pg-primary and $work/pg-replica, which the faults read.
  port2=$(free_port)
  replica_make "$work/pg2" "$port2" "$port" || { log "the replica did not start"; exit 2; }
  echo "$pg $port" >"$work/pg-primary"
  echo "$work/pg2 $port2" >"$work/pg-replica"
  log "asynchronous streaming replica (pg_basebackup -R) on 127.0.0.1:$port2"
  database_url="postgres://postgres@127.0.0.1:$port,127.0.0.1:$port2/$db?target_session_attrs=read-write"
  lib="source scripts/lib.sh && source scripts/recovery-lib.sh"
  db_stop="bash -c '$lib && pair_crash $work'"
  db_start="bash -c '$lib && pair_start $work'"
  args+=(--db-failover-command "bash -c '$lib && pair_failover $work $db {group} ${FAILOVER_LAG:-2}'")
fi

broker_kind="the broker of --brokers"
broker_args=()
if [ "$rabbitmq" = 1 ]; then
  ensure_rabbitmq
  rmq="$work/broker/rabbitmq"
  log "RabbitMQ: a node of the run's own in $rmq"
  start_rabbitmq "$rmq"
  version=$(dpkg-query -W -f '${Version}' rabbitmq-server 2>/dev/null | sed 's/-.*//')
  broker_kind="RabbitMQ ${version:-(version unknown)}, 1 node, $queue_type queues"
  log "$broker_kind on 127.0.0.1:$(cat "$rmq/port")"
  # The driver takes the URL (it holds a password) from its environment, never its arguments.
  export CHAOS_AMQP_URL=$AMQP_URL
  broker_args=(--amqp-ctl "$AMQP_CTL")
  if [ "$broker_faults" = 1 ]; then
    args+=(--broker-nodes 1
      --broker-stop-command "bash -c 'source scripts/lib.sh && rabbitmq_node_kill $rmq'"
      --broker-start-command "bash -c 'source scripts/lib.sh && rabbitmq_node_start $rmq'")
  fi
elif [ "$nats" = 1 ]; then
  ensure_nats
  natsdir="$work/broker/nats"
  log "NATS: a nats-server of the run's own in $natsdir"
  start_nats "$natsdir"
  version=$(nats-server --version 2>/dev/null | sed -n 's/^nats-server: v//p')
  broker_kind="NATS JetStream ${version:-(version unknown)}, 1 server, file store"
  log "$broker_kind on 127.0.0.1:$(cat "$natsdir/port")"
  # The driver takes the URL (it holds a password) from its environment, never its arguments.
  export CHAOS_NATS_URL=$NATS_URL
  if [ "$broker_faults" = 1 ]; then
    args+=(--broker-nodes 1
      --broker-stop-command "bash -c 'source scripts/lib.sh && nats_kill $natsdir'"
      --broker-start-command "bash -c 'source scripts/lib.sh && nats_start $natsdir'")
  fi
elif [ -z "$brokers" ] && [ -z "${NISSHI_BIN:-}" ]; then
  log "Apache Kafka $KAFKA_VERSION: $kafka_nodes KRaft node(s) in $work/broker/kafka"
  start_kafka_cluster "$work/broker/kafka" "$kafka_nodes"
  brokers=$BROKER_ADDR broker_kind="Apache Kafka $KAFKA_VERSION, $kafka_nodes node(s)"
  log "Apache Kafka on $brokers"
  if [ "$broker_faults" = 1 ]; then
    args+=(--broker-nodes "$kafka_nodes"
      --broker-stop-command "bash -c 'source scripts/lib.sh && kafka_node_kill $work/broker/kafka {node}'"
      --broker-start-command "bash -c 'source scripts/lib.sh && kafka_node_start $work/broker/kafka {node}'")
  fi
elif [ -z "$brokers" ]; then
  KAFKA_BROKERS="" start_broker "$work/broker"
  brokers=$BROKER_ADDR broker_kind=$BROKER_KIND
  log "$broker_kind on $brokers"
fi
if [ "$broker_faults" = 1 ] && [ "$rabbitmq" = 0 ] && [ "$nats" = 0 ] && [ "$broker_kind" = "${broker_kind#Apache Kafka}" ]; then
  log "--broker-faults needs the run's own Apache Kafka (no --brokers, KAFKA_BROKERS or NISSHI_BIN)"
  exit 2
fi
results_dir=results/chaos
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[$i]}" in
    --results-dir) results_dir=${args[$((i + 1))]} ;;
    --results-dir=*) results_dir=${args[$i]#--results-dir=} ;;
  esac
done
mkdir -p "$results_dir"
touch "$work/started"

status=0
# The driver's own Kafka clients (offset watcher, topic reader) log expected end-of-partition
# events as errors, its RabbitMQ publisher a broker restart's reset connection, and its NATS
# client every failed reconnection while the server is down: keep its log to warnings of its own.
# The driver runs in the background (bash runs a trap only once a foreground child ends), in a
# process group of its own with its processors, so that an interrupt can stop them all.
[ "$rabbitmq" = 1 ] || [ "$nats" = 1 ] || broker_args=(--brokers "$brokers")
NO_COLOR=1 RUST_LOG="${RUST_LOG:-warn,rdkafka=off,lapin=off,async_nats=off}" setsid $bin chaos --database-url "$database_url" "${broker_args[@]}" \
  --db-stop-command "$db_stop" --db-start-command "$db_start" \
  --broker-label "$broker_kind" --work-dir "$work/run" "${control[@]}" "${args[@]}" &
driver_pid=$!
wait "$driver_pid" || status=$?
driver_pid=""
# Kafka's own view of the group: every partition committed to its end (lag 0). Only for a PASS:
# a control or a failed run has nothing to confirm.
if [ "$status" = 0 ] && [ "$rabbitmq" = 0 ] && [ "$nats" = 0 ]; then
  report=$(find "$results_dir" -maxdepth 1 -name 'chaos-*.json' -newer "$work/started" | sort | tail -n 1)
  group=$($bin json get "$report" setup.group)
  if ! kafka_group_lag_zero "$brokers" "$group"; then
    log "Kafka's ConsumerGroupCommand reports lag for group $group after a PASS"
    status=1
  fi
fi
# Replication as the brokers saw it (ISR shrinks and expansions, under-replicated partitions):
# reported beside the run's results, not judged; the checker judges the data.
if [ -f "$work/broker/kafka/nodes" ] && [ "$(cat "$work/broker/kafka/nodes")" -gt 1 ]; then
  report=$(find "$results_dir" -maxdepth 1 -name 'chaos-*.json' -newer "$work/started" | sort | tail -n 1)
  if [ -n "$report" ]; then
    isr=$(kafka_isr_report "$work/broker/kafka" "$brokers") &&
      echo "$isr" >"$(dirname "$report")/isr-$(basename "$report")" &&
      log "replication: $isr"
  fi
fi
exit "$status"
