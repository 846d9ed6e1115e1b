#!/usr/bin/env bash
# The main job on an embedded default: starts PostgreSQL if needed and runs the processor against
# an in-process Kafka (librdkafka's mock cluster) fed with generated messages that include
# duplicates, bad input and overdrafts, in a database the demo creates for itself (and drops
# afterwards; --keep keeps it). Prints what it did and checks the database against the model.
# Extra flags go to `batch-inbox-bench demo` (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
ensure_postgres
cargo build --release --quiet -p batch-inbox-tools
RUST_LOG="${RUST_LOG:-warn}" ./target/release/batch-inbox-bench demo \
  --server-url "postgres://postgres@127.0.0.1:5432/postgres" "$@"
