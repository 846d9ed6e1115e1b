#!/usr/bin/env bash
# Runs every test: unit tests, the integration tests (one binary, tests/it/) against the real
# PostgreSQL and librdkafka's mock cluster, and end-to-end tests of the binary against one
# Apache Kafka broker for the whole run (its jars fetched from Maven Central once per machine,
# scripts/kafka/lib.sh), handed to the tests as KAFKA_BROKERS, and of the queue source against a
# RabbitMQ node of the run's own (Debian's package, installed when missing; scripts/rabbitmq/lib.sh),
# handed to them as AMQP_URL and AMQP_CTL, and of the JetStream source against nats-servers each
# test starts of its own (Debian's nats-server, installed when missing; scripts/nats/lib.sh). Each
# test uses its own topics and
# groups. KAFKA_BROKERS=host:port runs them against another broker; NISSHI_BIN against nisshi.
# The TLS, SASL and ACL tests start a second Apache Kafka node of their own, with an authorizer
# (start_secure_kafka in scripts/kafka/lib.sh, once per test binary), whatever KAFKA_BROKERS says.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
ensure_postgres
ensure_nats
# Build first, so that the broker does not idle through a cold build.
cargo test --workspace --no-run --quiet "$@"
cargo test --features failpoints,unsafe-controls --test it --no-run --quiet
broker_dir=$(mktemp -d /tmp/batch-inbox-test-broker.XXXXXX)
rabbit_dir=$(mktemp -d /tmp/batch-inbox-test-rabbitmq.XXXXXX)
trap 'stop_broker "$broker_dir"; stop_rabbitmq "$rabbit_dir"; rm -rf "$broker_dir" "$rabbit_dir"' EXIT
started=$SECONDS
start_broker "$broker_dir"
export KAFKA_BROKERS=$BROKER_ADDR
echo "broker: $BROKER_KIND on $KAFKA_BROKERS (ready in $((SECONDS - started)) s)" >&2
# RabbitMQ for the queue source's tests (tests/it/amqp.rs): a node of the run's own.
ensure_rabbitmq
started=$SECONDS
# Channels check consumer_timeout every second, so that a test can see a short one act.
RABBITMQ_CHANNEL_TICK_MS=1000 start_rabbitmq "$rabbit_dir"
echo "rabbitmq: $("$AMQP_CTL" version 2>/dev/null) on ${AMQP_URL#*@} (ready in $((SECONDS - started)) s)" >&2
cargo test --workspace "$@"
# The crash tests need the binary built with failpoints, and their controls (and the unsafe
# mode's visibility) the unsafe test-only switches: both are off in every other build.
cargo test --features failpoints,unsafe-controls --test it -- faults:: unsafe_settings:: \
  sql_handler::crash:: redrive::crash::
