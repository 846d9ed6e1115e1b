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
