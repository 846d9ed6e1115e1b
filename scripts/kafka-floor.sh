#!/usr/bin/env bash
# The broker's own produce and consume floor, with Kafka's tools and no processor: what one
# Apache Kafka node on this machine serves when nothing else runs.
#
#   scripts/kafka-floor.sh [--out DIR]     (default results/kafka-floor)
#
# ProducerPerformance writes RECORDS (default 1,000,000) records of SIZE bytes (default 100,
# about the load test's records) to a new 8-partition topic with acks=all and linger.ms=5;
# ConsumerPerformance then reads them back from the start. Their records carry no id header, so
# they measure the broker and the Java client, never the processor's input.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

out=results/kafka-floor
[ "${1:-}" = --out ] && out=$2
RECORDS=${RECORDS:-1000000} SIZE=${SIZE:-100}
work=$(mktemp -d /tmp/kafka-floor.XXXXXX)
trap 'stop_kafka "$work/kafka"; rm -rf "$work"' EXIT
start_kafka "$work/kafka"
topic="floor-$(date +%s)"
kafka_tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$BROKER_ADDR" --create \
  --topic "$topic" --partitions 8 --replication-factor 1 >/dev/null
produce=$(kafka_tool org.apache.kafka.tools.ProducerPerformance --topic "$topic" \
  --num-records "$RECORDS" --record-size "$SIZE" --throughput -1 \
  --producer-props "bootstrap.servers=$BROKER_ADDR" acks=all linger.ms=5 2>&1 | tail -n 1)
consume=$(kafka_tool org.apache.kafka.tools.ConsumerPerformance --bootstrap-server "$BROKER_ADDR" \
  --topic "$topic" --messages "$RECORDS" 2>&1 | tail -n 2)
mkdir -p "$out"
cat >"$out/README.md" <<EOF
# The broker's own floor: Apache Kafka $KAFKA_VERSION with Kafka's tools

\`scripts/kafka-floor.sh\`, $(date -u '+%Y-%m-%d %H:%M UTC'), one KRaft node (512 MiB heap, serial
collector) on this project's $(nproc)-core machine, nothing else running. $RECORDS records of $SIZE
bytes, 8 partitions, no headers.

ProducerPerformance (acks=all, linger.ms=5):

\`\`\`
$produce
\`\`\`

ConsumerPerformance (from the start of the topic):

\`\`\`
$consume
\`\`\`

Compare with the load test's \`consume-only\` run ([results/summary.md](../summary.md)): the
processor's pipeline with no database work, through librdkafka.
EOF
cat "$out/README.md"
