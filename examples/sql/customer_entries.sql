-- Last write wins per customer for records in a Kafka Connect JSON envelope
-- ({"schema": …, "payload": {"id", "account_id", "amount"}}, `batch-inbox-bench produce
-- --envelope connect-json`): the statement our SQL handler runs in the comparison with
-- Debezium's JDBC sink in upsert mode (scripts/peers/compare.sh), on the same table
-- (customer_entries.ddl.sql). Within a batch the newest record of each key (by partition and
-- offset) is written; the inbox has already skipped every record whose id it applied before, so
-- a re-sent older record never overwrites a newer one.
-- A record without a key, or whose value has no payload with those fields, is rejected.
WITH input AS (
    SELECT m.message_id, m.key, m.partition, m."offset", m.value -> 'payload' AS p
    FROM jsonb_to_recordset($1)
        AS m(message_id uuid, key text, partition int, "offset" bigint, value jsonb)
),
valid AS (
    SELECT * FROM input
    WHERE key IS NOT NULL
      AND jsonb_typeof(p -> 'id') = 'string'
      AND jsonb_typeof(p -> 'account_id') = 'number'
      AND jsonb_typeof(p -> 'amount') = 'number'
),
latest AS (
    SELECT DISTINCT ON (key) key, p
    FROM valid
    ORDER BY key, partition DESC, "offset" DESC
),
upserted AS (
    INSERT INTO customer_entries AS c (customer_id, id, account_id, amount)
    SELECT key, p ->> 'id', (p ->> 'account_id')::bigint, (p ->> 'amount')::bigint
    FROM latest
    ORDER BY key
    ON CONFLICT (customer_id) DO UPDATE
    SET id = excluded.id, account_id = excluded.account_id, amount = excluded.amount
)
SELECT message_id, 'invalid_payload' AS reason,
       'a customer entry needs a key and a Connect payload with id, account_id and amount'
           AS detail
FROM input
WHERE message_id NOT IN (SELECT message_id FROM valid);
