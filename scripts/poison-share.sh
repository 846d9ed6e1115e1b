#!/usr/bin/env bash
# The poison-rate breaker on bad data: 20,000 records on 4 partitions of one Apache Kafka node,
# applied by the SQL handler (examples/sql/balances_upsert.sql) to a `balances` table with a CHECK
# that about 1% of them break (10 accounts of 1000); the processor runs until every partition
# is at its end (`--exit-on-eof`) or for LIMIT seconds (default 120), then the database is
# counted: records applied, dead letters, and whether a partition stalled on the breaker
# (results/poison-share/NAME/summary.txt).
#
#   scripts/poison-share.sh NAME        (BIN: the processor, default the debug build)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
name=${1:?usage: scripts/poison-share.sh NAME}
bin=${BIN:-target/debug/batch-inbox}
bench=${BENCH:-target/debug/batch-inbox-bench}
limit=${LIMIT:-120}
out=results/poison-share/$name
work=$(mktemp -d /tmp/poison-share.XXXXXX)
trap 'stop_kafka "$work/kafka"; rm -rf "$work"' EXIT

ensure_postgres
start_kafka "$work/kafka"
export KAFKA_BROKERS=$BROKER_ADDR
db=bi_poison_share topic=poison-share-$(date +%s)
fresh_database "$db"
export DATABASE_URL="postgres://postgres@127.0.0.1:5432/$db"
psql -q -h 127.0.0.1 -U postgres -d "$db" -f examples/sql/balances.ddl.sql \
  -c "ALTER TABLE balances ADD CONSTRAINT not_37 CHECK (account_id % 100 <> 37)"
$bin migrate --handler sql >/dev/null
$bench produce --topic "$topic" --partitions 4 --messages 20000 --accounts 1000 \
  --duplicate-ratio 0 --bad-ratio 0 --debit-ratio 0 >"$work/produce.out" 2>&1
mkdir -p "$out"
started=$SECONDS
status=0
RUST_LOG=info timeout "$limit" $bin run --handler sql --apply-sql examples/sql/balances_upsert.sql \
  --topic "$topic" --group "$topic" --exit-on-eof --log-format json --log-interval 0 \
  >"$work/run.out" 2>"$work/log.jsonl" || status=$?
q() { psql -At -h 127.0.0.1 -U postgres -d "$db" -c "$1"; }
{
  echo "processor: $bin ($($bin --version 2>/dev/null || true)), exit status $status after $((SECONDS - started)) s (124: stopped at the limit)"
  echo "inbox rows (applied or dead-lettered): $(q 'SELECT count(*) FROM inbox')"
  echo "dead letters: $(q 'SELECT count(*) FROM dead_letters')"
  echo "dead letters per partition: $(q "SELECT string_agg(partition || ':' || n, ' ' ORDER BY partition) FROM (SELECT partition, count(*) n FROM dead_letters GROUP BY 1) d")"
  echo "dead letters of the accounts the CHECK refuses: $(q "SELECT count(*) FROM dead_letters WHERE (convert_from(payload, 'UTF8')::jsonb ->> 'account_id')::bigint % 100 = 37")"
  echo "stall lines (poison-rate breaker): $(grep -c 'poison-rate breaker' "$work/log.jsonl" || true)"
} | tee "$out/summary.txt"
