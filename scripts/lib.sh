# Shared helpers for the scripts. Source it; do not run it.

# Starts the local PostgreSQL cluster when it is not accepting connections, and waits for it.
ensure_postgres() {
  if ! pg_isready -q -h 127.0.0.1 -p 5432; then
    echo "starting PostgreSQL" >&2
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | sort -V | tail -n 1)" main start
  fi
  for _ in $(seq 1 60); do
    pg_isready -q -h 127.0.0.1 -p 5432 && return 0
    sleep 0.5
  done
  echo "PostgreSQL did not start on 127.0.0.1:5432" >&2
  return 1
}

# Drops and creates database "$1" (never reuses state from an earlier run).
fresh_database() {
  psql -q -h 127.0.0.1 -U postgres -d postgres -v ON_ERROR_STOP=1 \
    -c "DROP DATABASE IF EXISTS \"$1\" WITH (FORCE)" -c "CREATE DATABASE \"$1\"" >/dev/null
}

# Installs the tansu broker (a Kafka-compatible broker) into ~/.cargo/bin once; later runs reuse it.
TANSU_VERSION=0.6.0
ensure_tansu() {
  local bin="${HOME}/.cargo/bin/tansu"
  if [ -x "$bin" ] && "$bin" --version 2>/dev/null | grep -q "$TANSU_VERSION"; then
    return 0
  fi
  echo "installing tansu $TANSU_VERSION (about 12 minutes on 2 cores, once)" >&2
  cargo install tansu --version "$TANSU_VERSION" --locked --features dynostore
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
# private_postgres_init DIR PORT: initdb (trust auth) and start.
private_postgres_init() {
  mkdir -p "$1"
  [ "$(id -u)" = 0 ] && chown postgres:postgres "$1"
  as_postgres "$PG_BIN/initdb" -D "$1/data" -U postgres --auth=trust --no-sync >"$1/initdb.log" 2>&1 ||
    { cat "$1/initdb.log" >&2; return 1; }
  private_postgres_start "$1" "$2"
}
# private_postgres_start DIR PORT: start and wait until it accepts connections.
private_postgres_start() {
  as_postgres "$PG_BIN/pg_ctl" -D "$1/data" -l "$1/server.log" -w -t 60 -o \
    "-p $2 -c listen_addresses=127.0.0.1 -c unix_socket_directories=$1 -c fsync=on -c max_connections=200" \
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
