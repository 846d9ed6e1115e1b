-- Keeps the latest state of each customer, as a compacted or CDC topic carries it: the record
-- key is the customer id, the value its whole document, and a tombstone (a record with no value)
-- deletes the customer. Last write wins by (partition, offset): within a batch the newest record
-- of each key decides (an upsert or a delete), and a stored row is replaced or deleted only by a
-- newer position, so an older record applied later (a replay after its inbox row expired) never
-- overwrites a newer one.
-- A record without a (UTF-8) key is rejected as `missing_key`.
-- Run it with `--handler sql` (tombstones are passed on by default): a tombstone without an id
-- header takes its id from its position, so it is applied exactly once too.
WITH input AS (
    SELECT m.message_id AS id, m.key, m.partition, m."offset", m.timestamp_ms, m.value,
           m.tombstone
    FROM jsonb_to_recordset($1)
        AS m(message_id uuid, key text, partition int, "offset" bigint, timestamp_ms bigint,
             value jsonb, tombstone boolean)
),
latest AS (
    SELECT DISTINCT ON (key) key, partition, "offset", timestamp_ms, value, tombstone
    FROM input
    WHERE key IS NOT NULL
    ORDER BY key, partition DESC, "offset" DESC
),
upserted AS (
    INSERT INTO customers AS c
        (customer_id, doc, source_partition, source_offset, source_time)
    SELECT key, value, partition, "offset", to_timestamp(timestamp_ms / 1000.0)
    FROM latest
    WHERE NOT tombstone
    ORDER BY key
    ON CONFLICT (customer_id) DO UPDATE
    SET doc = excluded.doc,
        source_partition = excluded.source_partition,
        source_offset = excluded.source_offset,
        source_time = excluded.source_time
    WHERE (c.source_partition, c.source_offset)
        < (excluded.source_partition, excluded.source_offset)
),
deleted AS (
    DELETE FROM customers AS c
    USING latest AS l
    WHERE l.tombstone
      AND c.customer_id = l.key
      AND (c.source_partition, c.source_offset) < (l.partition, l."offset")
)
SELECT id AS message_id, 'missing_key' AS reason, 'a customer record needs a key' AS detail
FROM input
WHERE key IS NULL;
