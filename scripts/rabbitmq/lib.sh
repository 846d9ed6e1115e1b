# RabbitMQ for the tests, load runs and chaos runs: Debian's rabbitmq-server (3.10), a node of
# the run's own. Source it (scripts/lib.sh does); do not run it.
#
#   ensure_rabbitmq          installs the package when missing, without starting the package's
#                            own node (policy-rc.d refuses the service start during the install)
#   start_rabbitmq DIR       a node with its data, logs, cookie and config in DIR, on free
#                            ports (AMQP, distribution, epmd), its name rabbit-bi-<port>;
#                            exports AMQP_URL (guest on 127.0.0.1) and AMQP_CTL (DIR/ctl, which
#                            runs rabbitmqctl on this node: `"$AMQP_CTL" stop_app`)
#   stop_rabbitmq DIR        stops the node (and its epmd)
#   rabbitmq_node_kill DIR   SIGKILLs the node's Erlang VM, like a crash (its epmd stays)
#   rabbitmq_node_start DIR  starts the node of DIR again, same name, ports and data, and
#                            returns once it serves (a restart after either of the above)
#
# RABBITMQ_CONSUMER_TIMEOUT_MS sets the node's consumer_timeout (RabbitMQ's default: 30 min),
# RABBITMQ_CHANNEL_TICK_MS how often a channel checks it (a minute).

_RABBITMQ_BIN=/usr/lib/rabbitmq/bin

ensure_rabbitmq() {
  [ -x "$_RABBITMQ_BIN/rabbitmq-server" ] && return 0
  [ "$(id -u)" = 0 ] || { echo "rabbitmq-server is not installed (apt-get install rabbitmq-server, as root)" >&2; return 1; }
  echo "installing rabbitmq-server (Debian's package; its own node is not started)" >&2
  local policy=/usr/sbin/policy-rc.d had_policy=0
  [ -e "$policy" ] && had_policy=1
  [ "$had_policy" = 1 ] || { printf '#!/bin/sh\nexit 101\n' >"$policy"; chmod +x "$policy"; }
  local rc=0
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q rabbitmq-server >/dev/null ||
    { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q rabbitmq-server >/dev/null; } || rc=$?
  [ "$had_policy" = 1 ] || rm -f "$policy"
  return $rc
}

start_rabbitmq() {
  local dir=$1 port dist epmd ports
  mkdir -p "$dir"
  mapfile -t ports < <(free_ports 3)
  port=${ports[0]} dist=${ports[1]} epmd=${ports[2]}
  cat >"$dir/rabbitmq.conf" <<CONF
listeners.tcp.default = 127.0.0.1:$port
loopback_users = none
consumer_timeout = ${RABBITMQ_CONSUMER_TIMEOUT_MS:-1800000}
log.console = false
log.file.level = info
CONF
  echo "[]." >"$dir/enabled_plugins"
  # How often a channel checks its deliveries against consumer_timeout (RabbitMQ's default: a
  # minute); the tests shorten it to see a short timeout act.
  echo "[{rabbit, [{channel_tick_interval, ${RABBITMQ_CHANNEL_TICK_MS:-60000}}]}]." >"$dir/advanced.config"
  cat >"$dir/env" <<ENV
export HOME='$dir' RABBITMQ_NODENAME='rabbit-bi-$port@localhost' RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
export RABBITMQ_NODE_PORT=$port RABBITMQ_DIST_PORT=$dist ERL_EPMD_PORT=$epmd
export RABBITMQ_MNESIA_BASE='$dir/mnesia' RABBITMQ_LOG_BASE='$dir/log'
export RABBITMQ_CONFIG_FILE='$dir/rabbitmq.conf' RABBITMQ_ENABLED_PLUGINS_FILE='$dir/enabled_plugins'
export RABBITMQ_PID_FILE='$dir/pid' RABBITMQ_ADVANCED_CONFIG_FILE='$dir/advanced.config'
ENV
  printf '#!/bin/sh\n. "%s/env"\nexec %s/rabbitmqctl "$@"\n' "$dir" "$_RABBITMQ_BIN" >"$dir/ctl"
  chmod +x "$dir/ctl"
  echo "$port" >"$dir/port"
  rabbitmq_node_start "$dir" || return 1
  export AMQP_URL="amqp://guest:guest@127.0.0.1:$port/%2f" AMQP_CTL="$dir/ctl"
}

# The node of DIR (made by start_rabbitmq), started on its own data; returns once it serves.
rabbitmq_node_start() {
  local dir=$1
  # A pid file left by a killed node would name a dead process to `rabbitmqctl wait`.
  rm -f "$dir/pid"
  (
    # shellcheck disable=SC1091
    . "$dir/env"
    setsid "$_RABBITMQ_BIN/rabbitmq-server" >>"$dir/server.out" 2>&1 &
  )
  if ! "$dir/ctl" wait --timeout 60 "$dir/pid" >/dev/null 2>&1; then
    echo "RabbitMQ did not start; its output:" >&2
    tail -n 30 "$dir/server.out" >&2
    return 1
  fi
}

# SIGKILL to the node's Erlang VM (no shutdown: queues recover from disk at the next start),
# then waits until it is gone.
rabbitmq_node_kill() {
  local dir=$1 pid i
  pid=$(cat "$dir/pid" 2>/dev/null) || { echo "no pid file in $dir: is the node running?" >&2; return 1; }
  kill -KILL "$pid" 2>/dev/null || true
  for ((i = 0; i < 100; i++)); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  echo "the node's process $pid did not end after SIGKILL" >&2
  return 1
}

stop_rabbitmq() {
  local dir=$1
  [ -x "$dir/ctl" ] || return 0
  "$dir/ctl" stop >/dev/null 2>&1 || true
  (
    # shellcheck disable=SC1091
    . "$dir/env"
    epmd -port "$ERL_EPMD_PORT" -kill >/dev/null 2>&1 || true
  )
}
