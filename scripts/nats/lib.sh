# NATS JetStream for the tests, load runs and chaos runs: Debian's nats-server (2.9), a server
# of the run's own. Source it (scripts/lib.sh does); do not run it.
#
#   ensure_nats          installs the package when missing, without starting the package's own
#                        server (policy-rc.d refuses the service start during the install)
#   start_nats DIR       a server with its config (DIR/nats.conf), JetStream file store (DIR/js),
#                        logs (DIR/log) and pid (DIR/pid) in DIR, on free ports of 127.0.0.1 (the
#                        clients' and the monitoring one), user app with a random password;
#                        exports NATS_URL (nats://app:PASSWORD@127.0.0.1:PORT, also written to
#                        DIR/url) and NATS_MONITOR (http://127.0.0.1:MPORT, also DIR/monitor)
#   stop_nats DIR        stops the server (SIGTERM: a clean shutdown) and waits until it is gone
#   nats_kill DIR        SIGKILLs the server, like a crash, and waits until it is gone
#   nats_start DIR       starts the server of DIR again, same ports, password and store, and
#                        returns once it serves with JetStream ready (its streams recovered)
#
# nats-server 2.9 has no jetstream.sync_interval (2.10 added it): the file store writes each
# message to the OS before the publish is acknowledged but fsyncs on a timer, so a process crash
# (nats_kill) loses nothing acknowledged, an OS crash may (as Jepsen found with 2.12's default).
# async-nats 0.51 does not log in with a user and password written in a URL (it sends none and
# the server says "authorization violation"): a client takes them out of NATS_URL itself.

ensure_nats() {
  command -v nats-server >/dev/null && return 0
  [ "$(id -u)" = 0 ] || { echo "nats-server is not installed (apt-get install nats-server, as root)" >&2; return 1; }
  echo "installing nats-server (Debian's package; its own server is not started)" >&2
  local policy=/usr/sbin/policy-rc.d had_policy=0
  [ -e "$policy" ] && had_policy=1
  [ "$had_policy" = 1 ] || { printf '#!/bin/sh\nexit 101\n' >"$policy"; chmod +x "$policy"; }
  local rc=0
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q nats-server >/dev/null ||
    { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q nats-server >/dev/null; } || rc=$?
  [ "$had_policy" = 1 ] || rm -f "$policy"
  return $rc
}

start_nats() {
  local dir port mport ports password
  mkdir -p "$1" || return 1
  dir=$(cd "$1" && pwd)
  mkdir -p "$dir/js" "$dir/log"
  mapfile -t ports < <(free_ports 2)
  port=${ports[0]} mport=${ports[1]}
  password=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
  # The config and the URL hold the password: readable by this user only.
  (umask 077 && cat >"$dir/nats.conf") <<CONF
server_name: nats-bi-$port
listen: 127.0.0.1:$port
http: 127.0.0.1:$mport
pid_file: "$dir/pid"
log_file: "$dir/log/nats.log"
jetstream {
  store_dir: "$dir/js"
}
authorization {
  user: app
  password: "$password"
}
CONF
  (umask 077 && echo "nats://app:$password@127.0.0.1:$port" >"$dir/url")
  echo "http://127.0.0.1:$mport" >"$dir/monitor"
  echo "$port" >"$dir/port"
  nats_start "$dir" || return 1
  NATS_URL=$(cat "$dir/url") NATS_MONITOR=$(cat "$dir/monitor")
  export NATS_URL NATS_MONITOR
}

# The server of DIR (made by start_nats), started on its own store; returns once it serves with
# JetStream on and its streams recovered. The monitoring port answers before JetStream starts,
# and 2.9's healthz says ok even with JetStream off (js-enabled-only is not checked), but the
# client port opens, and the log says "Server is ready", only after JetStream has recovered
# every stream: wait for that, then make sure /jsz shows JetStream on.
nats_start() {
  local dir=$1 monitor port i pid=""
  monitor=$(cat "$dir/monitor" 2>/dev/null) && port=$(cat "$dir/port") ||
    { echo "no server in $dir (start_nats first)" >&2; return 1; }
  pid=$(cat "$dir/pid" 2>/dev/null) && kill -0 "$pid" 2>/dev/null &&
    { echo "the server of $dir is running (pid $pid)" >&2; return 1; }
  # A pid file left by a killed server would name a dead process.
  rm -f "$dir/pid"
  pid=""
  # Not a job of this shell (no "Killed" line when nats_kill ends it), in a session of its own.
  (setsid nats-server -c "$dir/nats.conf" >>"$dir/server.out" 2>&1 </dev/null &)
  for ((i = 0; i < 600; i++)); do
    [ -n "$pid" ] || pid=$(cat "$dir/pid" 2>/dev/null) || pid=""
    # This process's own "ready" (its log lines begin with [pid]), not another's on the port.
    if [ -n "$pid" ] && grep -q "^\[$pid\] .*Server is ready" "$dir/log/nats.log" 2>/dev/null &&
      (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      curl -fsS "$monitor/jsz" 2>/dev/null | grep -q '"store_dir"' && return 0
      echo "nats-server on $port serves without JetStream" >&2
      break
    fi
    # The server writes its pid before it reads its store; a bad config ends it before that.
    if [ -n "$pid" ]; then kill -0 "$pid" 2>/dev/null || break; elif ((i >= 50)); then break; fi
    sleep 0.1
  done
  echo "nats-server did not start; its output and log:" >&2
  tail -n 30 "$dir/server.out" "$dir/log/nats.log" >&2 2>/dev/null
  return 1
}

# Signals the server of DIR and waits up to $3 tenths of a second for it to end.
_nats_signal() {
  local dir=$1 signal=$2 tries=$3 pid i
  pid=$(cat "$dir/pid" 2>/dev/null) || { echo "no pid file in $dir: is the server running?" >&2; return 1; }
  kill "-$signal" "$pid" 2>/dev/null || return 0
  for ((i = 0; i < tries; i++)); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  echo "nats-server $pid did not end after SIG$signal" >&2
  return 1
}

nats_kill() { _nats_signal "$1" KILL 100; }

stop_nats() {
  [ -f "$1/pid" ] || return 0
  _nats_signal "$1" TERM 300
}
