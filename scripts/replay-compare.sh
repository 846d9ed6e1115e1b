#!/usr/bin/env bash
# Compares configurations with the database-only replay (batch-inbox-bench replay), interleaved
# (A B C A B C …) on a private PostgreSQL started for the purpose, then prints medians, spreads and
# ratios to the first configuration, round by round.
#
#   scripts/replay-compare.sh [--rounds N] [--out FILE] LABEL=BINARY[,SETUP.sql…] … [-- FLAGS…]
#
# BINARY is a build of the toolbox (`cargo build --release -p batch-inbox-tools`, then copy
# target/release/batch-inbox-bench aside per commit to compare commits); SETUP files are SQL run
# after the migrations (schema variants); FLAGS go to every replay (`--batch-size 500`). The server
# runs with fsync and synchronous_commit on, pg_stat_statements preloaded, the load test server's
# shared_buffers (128 MB) and max_wal_size (1 GB), and autovacuum off like it. Results: JSON lines
# in FILE (default target/replay-compare.jsonl), one per run, with its round; the table is
# `batch-inbox-bench replay-compare summary FILE [BASELINE_LABEL]` (this tree's build, BENCH
# names another; built first unless SKIP_BUILD=1).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

rounds=5 out=target/replay-compare.jsonl configs=() flags=()
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --) shift; flags=("$@"); break ;;
    *=*) configs+=("$1"); shift ;;
    *) echo "usage: $0 [--rounds N] [--out FILE] LABEL=BINARY[,SETUP.sql…] … [-- FLAGS…]" >&2; exit 2 ;;
  esac
done
[ ${#configs[@]} -gt 0 ] || { echo "no configuration given" >&2; exit 2; }
[ "${SKIP_BUILD:-0}" = 1 ] || cargo build --release --quiet -p batch-inbox-tools
bench=${BENCH:-./target/release/batch-inbox-bench}

dir=$(mktemp -d /tmp/replay-compare.XXXXXX)
port=$(free_port)
trap 'private_postgres_remove "$dir"' EXIT
private_postgres_init "$dir" "$port"
as_postgres "$PG_BIN/pg_ctl" -D "$dir/data" -w stop >/dev/null
cat >>"$dir/data/postgresql.conf" <<'EOF'
shared_buffers = 128MB
max_wal_size = 1GB
autovacuum = off
shared_preload_libraries = 'pg_stat_statements'
EOF
private_postgres_start "$dir" "$port"
export REPLAY_SERVER_URL="postgres://postgres@127.0.0.1:$port"

mkdir -p "$(dirname "$out")"
n=${#configs[@]}
for ((r = 0; r < rounds; r++)); do
  for ((i = 0; i < n; i++)); do
    # Each round starts one configuration later, so that no configuration always runs first.
    config=${configs[$(((i + r) % n))]}
    label=${config%%=*} rest=${config#*=}
    IFS=, read -r -a parts <<<"$rest"
    args=()
    for setup in "${parts[@]:1}"; do args+=(--setup "$setup"); done
    run=$(mktemp)
    echo "[round $r $(date +%T)] $label" >&2
    "${parts[0]}" replay --label "$label" --report "$run" "${args[@]}" "${flags[@]}"
    "$bench" replay-compare append --round "$r" --run "$run" --out "$out"
    rm -f "$run"
  done
done
"$bench" replay-compare summary "$out"
