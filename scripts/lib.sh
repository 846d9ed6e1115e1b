# Shared helpers for the scripts. Source it; do not run it.

# bench_tool ARGS...: the toolbox, batch-inbox-bench, which parses, checks and sums what the
# helpers here read (Kafka's tools' output, the brokers' logs). The calling script builds it;
# BENCH names another build.
_lib_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bench_tool() { "${BENCH:-$_lib_root/target/release/batch-inbox-bench}" "$@"; }

# Starts the local PostgreSQL cluster when it is not accepting connections, waits for it, and
# makes sure user postgres can connect over TCP from 127.0.0.1 (ensure_postgres_trust).
ensure_postgres() {
  if ! pg_isready -q -h 127.0.0.1 -p 5432; then
    echo "starting PostgreSQL" >&2
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | sort -V | tail -n 1)" main start
  fi
  for _ in $(seq 1 60); do
    pg_isready -q -h 127.0.0.1 -p 5432 && { ensure_postgres_trust; return; }
    sleep 0.5
  done
  echo "PostgreSQL did not start on 127.0.0.1:5432" >&2
  return 1
}

# The tests, the demo and the load test connect as postgres@127.0.0.1 without a password (the
# default DATABASE_URL). Debian's cluster asks for one (scram-sha-256), so on a machine where
# that connection is refused this adds ONE line to the cluster's pg_hba.conf, first of its
# rules, marked "batch-inbox test machine": `host all all 127.0.0.1/32 trust`, and reloads.
# Only for test and CI machines; BATCH_INBOX_PG_HBA=keep leaves the file alone.
PG_TRUST_MARK="# batch-inbox test machine: trust on 127.0.0.1 (scripts/lib.sh)"
ensure_postgres_trust() {
  psql -X -w -q -h 127.0.0.1 -U postgres -d postgres -c 'SELECT 1' >/dev/null 2>&1 && return 0
  local hba
  hba=$(as_postgres psql -X -At -d postgres -c 'SHOW hba_file' 2>/dev/null) || hba=""
  if [ "${BATCH_INBOX_PG_HBA:-}" = keep ] || [ -z "$hba" ] || [ "$(id -u)" != 0 ]; then
    echo "cannot connect as postgres@127.0.0.1 without a password: add '$PG_TRUST_MARK'" \
      "and 'host all all 127.0.0.1/32 trust' at the top of pg_hba.conf, or set DATABASE_URL" >&2
    return 1
  fi
  if ! grep -qF "$PG_TRUST_MARK" "$hba"; then
    echo "PostgreSQL: trusting 127.0.0.1 in $hba (a test machine's setting; first rule)" >&2
    local tmp
    tmp=$(mktemp)
    { echo "$PG_TRUST_MARK"; echo "host all all 127.0.0.1/32 trust"; cat "$hba"; } >"$tmp"
    cat "$tmp" >"$hba"
    rm -f "$tmp"
  fi
  as_postgres psql -X -q -d postgres -c 'SELECT pg_reload_conf()' >/dev/null
  for _ in $(seq 1 50); do
    psql -X -w -q -h 127.0.0.1 -U postgres -d postgres -c 'SELECT 1' >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "PostgreSQL still refuses postgres@127.0.0.1 after the reload" >&2
  return 1
}

# Drops and creates database "$1" (never reuses state from an earlier run).
fresh_database() {
  psql -q -h 127.0.0.1 -U postgres -d postgres -v ON_ERROR_STOP=1 \
    -c "DROP DATABASE IF EXISTS \"$1\" WITH (FORCE)" -c "CREATE DATABASE \"$1\"" >/dev/null
}

# The Kafka-protocol broker for end-to-end, load and chaos runs is Apache Kafka
# (scripts/kafka/lib.sh). nisshi (crates.io) stays usable as a second broker: NISSHI_BIN names a
# build, or ensure_nisshi builds one with the nightly toolchain (rustc >= 1.96) into a cache
# directory. Nothing requires it.
source "$(dirname "${BASH_SOURCE[0]}")/kafka/lib.sh"
# RabbitMQ (ensure_rabbitmq, start_rabbitmq, stop_rabbitmq): scripts/rabbitmq/lib.sh.
source "$(dirname "${BASH_SOURCE[0]}")/rabbitmq/lib.sh"
# NATS JetStream (ensure_nats, start_nats, stop_nats, nats_kill, nats_start): scripts/nats/lib.sh.
source "$(dirname "${BASH_SOURCE[0]}")/nats/lib.sh"
NISSHI_VERSION=0.8.1
NISSHI_ROOT=${NISSHI_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/batch-inbox/nisshi-$NISSHI_VERSION}
ensure_nisshi() {
  NISSHI_BIN=${NISSHI_BIN:-$NISSHI_ROOT/bin/nisshi}
  if [ -x "$NISSHI_BIN" ]; then
    return 0
  fi
  local toolchain=${NISSHI_TOOLCHAIN:-nightly}
  local rustc_version
  if ! rustc_version=$(rustup run "$toolchain" rustc --version 2>/dev/null); then
    echo "nisshi $NISSHI_VERSION needs rustc >= 1.96: no '$toolchain' toolchain here" \
      "(set NISSHI_TOOLCHAIN, NISSHI_BIN, or KAFKA_BROKERS for another broker)" >&2
    return 1
  fi
  mkdir -p "$NISSHI_ROOT"
  # One build at a time per machine: a second script waits for the first one's binary.
  exec 9>"$NISSHI_ROOT.lock"
  flock 9
  if [ ! -x "$NISSHI_BIN" ]; then
    echo "building the nisshi $NISSHI_VERSION broker with $rustc_version: about 10 minutes on" \
      "2 cores, once per machine (into $NISSHI_ROOT); cargo's progress follows" >&2
    local started=$SECONDS
    # The build directory is kept, so an interrupted build resumes where it stopped.
    CARGO_TARGET_DIR="$NISSHI_ROOT/build" cargo "+$toolchain" install nisshi \
      --version "$NISSHI_VERSION" --locked --no-default-features --features dynostore \
      --root "$NISSHI_ROOT" 2>&1 | grep --line-buffered -E '^ *(Compiling|Installing|Installed|Finished|error|warning: build failed)' >&2 || true
    if [ ! -x "$NISSHI_BIN" ]; then
      flock -u 9
      echo "the nisshi build failed (see above)" >&2
      return 1
    fi
    rm -rf "$NISSHI_ROOT/build"
    echo "nisshi built in $(((SECONDS - started) / 60)) min: $NISSHI_BIN" >&2
  fi
  flock -u 9
}

# start_nisshi LOGFILE: a nisshi broker on a free port with in-memory storage; sets BROKER_PID
# and BROKER_ADDR once it accepts connections.
start_nisshi() {
  ensure_nisshi || return 1
  local port
  port=$(free_port)
  "$NISSHI_BIN" broker --listener-url "tcp://127.0.0.1:$port" \
    --advertised-listener-url "tcp://127.0.0.1:$port" --storage-engine memory://nisshi/ \
    >"$1" 2>&1 &
  BROKER_PID=$!
  BROKER_ADDR="127.0.0.1:$port"
  for _ in $(seq 1 200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
    kill -0 "$BROKER_PID" 2>/dev/null || break
    sleep 0.1
  done
  echo "nisshi did not listen on $BROKER_ADDR; its log:" >&2
  cat "$1" >&2
  return 1
}

# A private PostgreSQL server in directory $1 on port $2, for runs that crash and restart the
# database (never the shared server on 5432). Runs as user postgres when we are root; fsync on.
PG_BIN=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)}
as_postgres() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
# free_ports N: N distinct free ports, one per line (all bound at once, so no two are the same,
# which N calls of free_port do not promise).
free_ports() {
  python3 -c 'import socket,sys; s=[socket.socket() for _ in range(int(sys.argv[1]))]; [x.bind(("127.0.0.1",0)) for x in s]; print("\n".join(str(x.getsockname()[1]) for x in s))' "$1"
}
# private_postgres_init DIR PORT [OPTIONS]: initdb (trust auth) and start.
private_postgres_init() {
  mkdir -p "$1"
  [ "$(id -u)" = 0 ] && chown postgres:postgres "$1"
  as_postgres "$PG_BIN/initdb" -D "$1/data" -U postgres --auth=trust --no-sync >"$1/initdb.log" 2>&1 ||
    { cat "$1/initdb.log" >&2; return 1; }
  private_postgres_start "$@"
}
# private_postgres_start DIR PORT [OPTIONS]: start and wait until it accepts connections.
# OPTIONS are more server options (`-c wal_level=logical`).
private_postgres_start() {
  as_postgres "$PG_BIN/pg_ctl" -D "$1/data" -l "$1/server.log" -w -t 60 -o \
    "-p $2 -c listen_addresses=127.0.0.1 -c unix_socket_directories=$1 -c fsync=on -c max_connections=200 ${3:-}" \
    start >/dev/null
}
# private_postgres_crash DIR: stop like a crash (-m immediate: no checkpoint, sessions cut).
private_postgres_crash() {
  as_postgres "$PG_BIN/pg_ctl" -D "$1/data" -m immediate -w stop >/dev/null
}
# private_postgres_remove DIR: stop (if running) and delete.
private_postgres_remove() {
  as_postgres "$PG_BIN/pg_ctl" -D "$1/data" -m immediate -w stop >/dev/null 2>&1 || true
  rm -rf "$1"
}

# start_broker DIR: the broker of a test, load or chaos run, unless KAFKA_BROKERS names one:
# nisshi when NISSHI_BIN is set, else a single Apache Kafka node in DIR. Sets BROKER_ADDR and
# BROKER_KIND; stop_broker DIR stops what this started.
start_broker() {
  mkdir -p "$1"
  if [ -n "${KAFKA_BROKERS:-}" ]; then
    BROKER_ADDR=$KAFKA_BROKERS BROKER_KIND="the broker of KAFKA_BROKERS" BROKER_PID=""
  elif [ -n "${NISSHI_BIN:-}" ]; then
    start_nisshi "$1/nisshi.log" || return 1
    BROKER_KIND="nisshi $NISSHI_VERSION (memory storage)"
    echo "$BROKER_PID" >"$1/nisshi.pid"
  else
    start_kafka "$1/kafka" || return 1
    BROKER_KIND="Apache Kafka $KAFKA_VERSION (one KRaft node)"
    [ "${KAFKA_JVM:-}" != stock ] ||
      BROKER_KIND="Apache Kafka $KAFKA_VERSION (one KRaft node, Kafka's stock JVM settings)"
  fi
}
stop_broker() {
  stop_kafka "$1/kafka"
  [ -f "$1/nisshi.pid" ] && kill "$(cat "$1/nisshi.pid")" 2>/dev/null
  return 0
}
