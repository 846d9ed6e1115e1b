#!/usr/bin/env bash
# Chaos run: processors in one group apply a generated input (duplicates, bad input, overdrafts)
# while a seeded nemesis kills them (SIGKILL), pauses them past the session timeout
# (SIGSTOP/SIGCONT), crash-restarts PostgreSQL and adds and removes members; then it drains and
# checks the database and the committed offsets against the generator's model.
#
#   scripts/chaos.sh [--duration SECONDS] [--seed N] [--processors N] [--brokers HOST:PORT]
#   scripts/chaos.sh --unsafe ...   the control: processors in an unsafe configuration; the
#                                   checker must FAIL (exit 1)
#
# Starts its OWN PostgreSQL server (initdb in a temporary directory, a free port, fsync on), the
# only one it restarts, and a nisshi broker unless --brokers is given. Prints the seed, the faults
# and PASS/FAIL, writes results/chaos/chaos-<UTC time>-seed<N>-<pid>.json (chaos-control-… for --unsafe;
# --results-dir elsewhere).
# Exit status: 0 PASS, 1 an invariant was violated, 2 the run itself failed. Other flags go to
# `batch-inbox-bench chaos` (see `batch-inbox-bench chaos --help`). KEEP=1 keeps the logs and the server.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

# What the control run turns on (override with UNSAFE_FLAGS="..."): offsets stored before the
# database commit (loses messages), and no inbox (applies redeliveries twice).
read -ra UNSAFE_FLAGS <<<"${UNSAFE_FLAGS:---unsafe-offsets-before-commit --unsafe-no-inbox}"

unsafe=0 brokers="${KAFKA_BROKERS:-}" args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --unsafe) unsafe=1 ;;
    --brokers) brokers=$2; shift ;;
    --brokers=*) brokers=${1#--brokers=} ;;
    *) args+=("$1") ;;
  esac
  shift
done

log() { echo "[chaos.sh $(date +%T)] $*" >&2; }
bin=./target/release/batch-inbox-bench
work=$(mktemp -d /tmp/chaos.XXXXXX)
chmod 755 "$work"
pg="$work/pg"
broker_pid="" driver_pid=""
status=2
cleanup() {
  # The driver and its processor processes share one process group (setsid below).
  [ -n "$driver_pid" ] && kill -KILL -- "-$driver_pid" 2>/dev/null
  [ -n "$broker_pid" ] && kill "$broker_pid" 2>/dev/null
  if [ "${KEEP:-0}" = 1 ]; then
    log "kept $work"
    return
  fi
  private_postgres_remove "$pg"
  if [ "$status" = 1 ] && [ "$unsafe" = 0 ] && [ -d "$work/run" ]; then
    # A violation of the safe configuration: keep the processors' logs for the diagnosis.
    rm -rf "$work/pg"
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

if [ -z "$brokers" ]; then
  start_nisshi "$work/broker.log"
  broker_pid=$BROKER_PID brokers=$BROKER_ADDR
  log "nisshi broker on $brokers"
fi

status=0
# The driver's own Kafka clients (offset watcher, topic reader) log expected end-of-partition
# events as errors: keep its log to warnings of its own.
# The driver runs in the background (bash runs a trap only once a foreground child ends), in a
# process group of its own with its processors, so that an interrupt can stop them all.
NO_COLOR=1 RUST_LOG="${RUST_LOG:-warn,rdkafka=off}" setsid $bin chaos --database-url "postgres://postgres@127.0.0.1:$port/$db" --brokers "$brokers" \
  --db-stop-command "bash -c 'source scripts/lib.sh && private_postgres_crash $pg'" \
  --db-start-command "bash -c 'source scripts/lib.sh && private_postgres_start $pg $port'" \
  --work-dir "$work/run" "${control[@]}" "${args[@]}" &
driver_pid=$!
wait "$driver_pid" || status=$?
driver_pid=""
exit "$status"
