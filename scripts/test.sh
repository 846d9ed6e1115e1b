#!/usr/bin/env bash
# Runs every test: unit tests, the integration tests (one binary, tests/it/) against the real
# PostgreSQL and librdkafka's mock cluster, and end-to-end tests of the binary against a nisshi
# broker process (built once per machine on first use, about 10 minutes; scripts/lib.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
ensure_postgres
# KAFKA_BROKERS: run the broker tests against that broker instead of a nisshi process.
[ -n "${KAFKA_BROKERS:-}" ] || ensure_nisshi
cargo test --workspace "$@"
# The crash tests need the binary built with failpoints, and their controls (and the unsafe
# mode's visibility) the unsafe test-only switches: both are off in every other build.
cargo test --features failpoints,unsafe-controls --test it -- faults:: unsafe_settings:: \
  sql_handler::crash::
