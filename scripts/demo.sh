#!/usr/bin/env bash
# The main job on an embedded default: starts PostgreSQL if needed, creates a fresh database,
# and runs the processor against an in-process Kafka (librdkafka's mock cluster) fed with
# generated messages that include duplicates, bad input and overdrafts. Prints what it did and
# checks the database against the model. Extra flags go to `batch-inbox demo` (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
ensure_postgres
db=batch_inbox_demo
fresh_database "$db"
cargo build --release --quiet
RUST_LOG="${RUST_LOG:-warn}" ./target/release/batch-inbox demo \
  --database-url "postgres://postgres@127.0.0.1:5432/$db" "$@"
