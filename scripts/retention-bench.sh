#!/usr/bin/env bash
# Measures inbox retention at scale (see benches/retention_db.rs): dedup throughput and WAL per
# message with 10 million rows already in the inbox, UUIDv4 vs UUIDv7 × plain vs partitioned, and
# batch latency while a cleanup runs, batched DELETE vs partition drop.
#
# It starts a private PostgreSQL server in a temporary directory on a free port (so that WAL deltas
# and checkpoints are this script's alone, and the shared server is never touched), runs the bench
# against it, then stops the server and removes its files.
#
#   scripts/retention-bench.sh           full run (about 15-25 minutes here), writes
#                                        results/retention/bench.json and summary.md
#   scripts/retention-bench.sh --quick   smoke run on 200,000 rows with the debug build that the
#                                        tests already compiled (about a minute; figures are not
#                                        measurements), written to target/retention-bench-quick/
#   BENCH_ROWS=N scripts/retention-bench.sh   another pre-fill size
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

# Full mode: optimized (`cargo bench`). Quick mode: the test profile, no second build in CI.
build=(cargo bench --bench retention_db --no-run --quiet)
bench=(cargo bench --bench retention_db --quiet --)
if [ "${1:-}" = "--quick" ]; then
  export BENCH_QUICK=1
  build=(cargo test --bench retention_db --no-run --quiet)
  bench=(cargo test --bench retention_db --quiet)
fi

pg_bin=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)}
dir=$(mktemp -d /tmp/ret-bench-pg.XXXXXX)
port=$(free_port)
as_postgres=()
if [ "$(id -u)" = 0 ]; then
  chown postgres:postgres "$dir"
  as_postgres=(runuser -u postgres --)
fi

stop_server() {
  "${as_postgres[@]}" "$pg_bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap stop_server EXIT

echo "building the bench" >&2
"${build[@]}"

echo "starting a private PostgreSQL on port $port in $dir" >&2
"${as_postgres[@]}" "$pg_bin/initdb" -D "$dir/data" -U postgres --auth=trust >/dev/null
# The server's defaults, stated: durable commits, full-page writes, 128 MB of shared buffers.
"${as_postgres[@]}" "$pg_bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
  -o "-p $port -c listen_addresses=127.0.0.1 -c unix_socket_directories=$dir \
      -c shared_buffers=128MB -c synchronous_commit=on -c full_page_writes=on \
      -c max_wal_size=1GB -c checkpoint_timeout=5min" start >/dev/null

df -h / | tail -n 1 >&2
BENCH_DATABASE_URL="postgres://postgres@127.0.0.1:$port" "${bench[@]}"
df -h / | tail -n 1 >&2
