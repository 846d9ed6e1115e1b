#!/usr/bin/env bash
# The cleanup side of the processed_at index lever (docs/PERFORMANCE-LEVERS.md): fills database
# bi_cleanup (DROPPED first) with 3,000,000 UUIDv7 rows processed over 10 days, builds one index
# variant, then deletes every row older than 7 days in batches of 5,000 with the product's
# statement shape (DELETE … WHERE ctid = ANY(ARRAY(SELECT ctid … LIMIT 5000 FOR UPDATE SKIP
# LOCKED))), one psql call per statement, and prints statements, total and longest time.
#
#   results/perf-levers/cleanup-bench.sh btree|brin32|brin128|brin32u|partial [SERVER_URL]
#
# btree: today's index and ORDER BY processed_at; brin32, brin128: BRIN with that ORDER BY;
# brin32u: BRIN without ORDER BY; partial: migration 6's partial index and the key-range query.
set -euo pipefail
v=$1 server=${2:-postgres://postgres@127.0.0.1:5432} db=bi_cleanup
cd "$(dirname "$0")/../.."
psql -X -q "$server/postgres" -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db"
psql=(psql -X -q "$server/$db")
"${psql[@]}" -f scripts/sql/uuid7_at.sql
"${psql[@]}" -v ON_ERROR_STOP=1 <<'SQL'
CREATE TABLE inbox (
    message_id   uuid        PRIMARY KEY,
    topic        text        NOT NULL,
    partition    int         NOT NULL,
    "offset"     bigint      NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO inbox
SELECT uuid7_at(t), 'loadtest-1764478123', (g % 8)::int, g, t
FROM generate_series(1, 3000000) g,
     LATERAL (SELECT now() - interval '10 days' + g * interval '288 milliseconds' AS t) x
ORDER BY g;
SQL
not_v7="get_byte(uuid_send(message_id), 6) >> 4 <> 7"
case $v in
  btree) "${psql[@]}" -c "CREATE INDEX inbox_processed_at ON inbox (processed_at)" ;;
  brin32 | brin32u) "${psql[@]}" -c "CREATE INDEX inbox_processed_at ON inbox USING brin (processed_at) WITH (pages_per_range = 32)" ;;
  brin128) "${psql[@]}" -c "CREATE INDEX inbox_processed_at ON inbox USING brin (processed_at) WITH (pages_per_range = 128)" ;;
  partial) "${psql[@]}" -c "CREATE INDEX inbox_processed_at ON inbox (processed_at) WHERE $not_v7" ;;
  *) echo "unknown variant $v" >&2; exit 2 ;;
esac
"${psql[@]}" -c "VACUUM ANALYZE inbox"
cutoff="now() - interval '7 days'"
cut_uuid="(SELECT encode(overlay(uuid_send('00000000-0000-0000-0000-000000000000') PLACING substring(int8send(floor(extract(epoch FROM $cutoff) * 1000)::bigint) FROM 3) FROM 1 FOR 6), 'hex')::uuid)"
case $v in
  brin32u) sel="SELECT ctid FROM inbox WHERE processed_at < $cutoff LIMIT 5000 FOR UPDATE SKIP LOCKED" ;;
  partial) sel="SELECT ctid FROM (SELECT ctid FROM inbox WHERE message_id < $cut_uuid AND processed_at < $cutoff AND NOT ($not_v7) ORDER BY message_id LIMIT 5000 FOR UPDATE SKIP LOCKED) AS v7 UNION ALL SELECT ctid FROM (SELECT ctid FROM inbox WHERE processed_at < $cutoff AND $not_v7 ORDER BY processed_at LIMIT 5000 FOR UPDATE SKIP LOCKED) AS other LIMIT 5000" ;;
  *) sel="SELECT ctid FROM inbox WHERE processed_at < $cutoff ORDER BY processed_at LIMIT 5000 FOR UPDATE SKIP LOCKED" ;;
esac
start=$(date +%s%N) n=0 longest=0
while :; do
  t0=$(date +%s%N)
  rows=$("${psql[@]}" -At -c "WITH d AS (DELETE FROM inbox WHERE ctid = ANY(ARRAY($sel)) RETURNING 1) SELECT count(*) FROM d")
  ms=$((($(date +%s%N) - t0) / 1000000)) n=$((n + 1))
  [ "$ms" -gt "$longest" ] && longest=$ms
  [ "$rows" -lt 5000 ] && break
done
size=$("${psql[@]}" -At -c "SELECT pg_size_pretty(pg_relation_size('inbox_processed_at'))")
echo "$v: $n statements, $((($(date +%s%N) - start) / 1000000)) ms in all, longest $longest ms, index $size"
