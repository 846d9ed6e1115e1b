#!/usr/bin/env bash
# Runs every test: unit tests, integration tests against the real PostgreSQL and librdkafka's mock
# cluster, and end-to-end tests of the binary against a tansu broker process.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
ensure_postgres
ensure_tansu
cargo test "$@"
# The crash tests need the binary built with failpoints (off in every other build).
cargo test --features failpoints --test faults "$@"
